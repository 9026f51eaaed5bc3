#!/usr/bin/env bash
# gymnasium's own vector-env tests against fastvec.AsyncVectorEnv.
#
#   benchmarks/gym_suite.sh GYMNASIUM_CHECKOUT [OUT_DIR]
#
# GYMNASIUM_CHECKOUT: a git clone of Farama-Foundation/Gymnasium at the installed
# gymnasium's version (its tests are not in the wheel or the sdist). Its tests/ are
# exported to a temporary directory with a conftest.py that binds every AsyncVectorEnv
# in them (gymnasium.vector.AsyncVectorEnv and the module's own name) to
# fastvec.AsyncVectorEnv; tests/vector runs there with the current python, and the
# summary goes to OUT_DIR/gym_suite.txt (default benchmarks/results/gym_suite).
# One SyncVectorEnv test needs Box2D (pip install "gymnasium[box2d]"); without it, it fails.
set -euo pipefail
repo=${1:?usage: benchmarks/gym_suite.sh GYMNASIUM_CHECKOUT [OUT_DIR]}
here=$(cd "$(dirname "$0")" && pwd)
out=${2:-$here/results/gym_suite}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# (a partial clone may lack blobs outside tests/: git archive says so on stderr)
git -C "$repo" archive HEAD tests 2>/dev/null | tar -x -C "$work"
[ -d "$work/tests/vector" ] || { echo "no tests/vector in $repo" >&2; exit 2; }
cat > "$work/conftest.py" <<'PY'
# Bind every AsyncVectorEnv in gymnasium's tests to fastvec's.
import gymnasium.vector
import gymnasium.vector.async_vector_env as _ave

import fastvec

gymnasium.vector.AsyncVectorEnv = fastvec.AsyncVectorEnv
_ave.AsyncVectorEnv = fastvec.AsyncVectorEnv
PY
{
  echo "gymnasium $(python -c 'import gymnasium; print(gymnasium.__version__)'), tests from $(git -C "$repo" describe --tags --always 2>/dev/null) ($(git -C "$repo" rev-parse HEAD)); fastvec $(python -c 'import fastvec; print(fastvec.__version__)')"
  (cd "$work" && python -m pytest tests/vector -q -p no:cacheprovider -rf 2>&1 || true) | grep -E "^(FAILED|ERROR)|passed|failed" | cut -c1-240
} | tee "$out/gym_suite.txt"
