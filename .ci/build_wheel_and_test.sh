#!/usr/bin/env bash
# Build fastvec's sdist and wheel, check what they carry, prove the sdist builds a wheel,
# then install the wheel (with the `test` extra) into a fresh virtualenv and run the test
# suite against the INSTALLED package, from a directory outside the source tree.
#
#   .ci/build_wheel_and_test.sh [extra pytest args...]     e.g.  -x -m "not slow"
#
# Environment: PYTHON (default: python) builds and makes the venv; KEEP_WORK=1 keeps
# the temporary work directory (dist/, venv/) and prints its path.
# Exit status: the first failing step's, else pytest's.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fastvec-wheel-XXXXXX")
DIST=$WORK/dist
VENV=$WORK/venv
cleanup() {
    if [ "${KEEP_WORK:-0}" = 1 ]; then echo "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
T0=$SECONDS
step() { printf '\n== [%4ss] %s\n' "$((SECONDS - T0))" "$*"; }

# --------------------------------------------------------------------------- build
step "build and check sdist + wheel"
"$REPO/.ci/check_dist.sh" "$DIST"
WHEEL=$(ls "$DIST"/*.whl)

# --------------------------------------------------------------------------- install
step "fresh virtualenv $VENV"
"$PY" -m venv "$VENV"
VPY=$VENV/bin/python
# torch first: torch==2.13.0 matches the CPU build on this machine's disk, which then
# satisfies the `test` extra's torch range; a plain torch requirement downloads CUDA.
"$VPY" -m pip install --quiet --progress-bar off torch==2.13.0
"$VPY" -c "import torch; print('torch', torch.__version__)"
"$VPY" -m pip install --quiet --progress-bar off "$WHEEL[test]"

# --------------------------------------------------------------------------- test
RUN=$WORK/run
mkdir -p "$RUN"
cd "$RUN"   # outside the source tree: nothing named fastvec here or on sys.path

step "import check from $RUN"
FASTVEC_FILE=$("$VPY" -c "import fastvec, fastvec._core.channel, fastvec._core.stepper, fastvec._gae; print(fastvec.__file__)")
echo "fastvec imported from: $FASTVEC_FILE"
case "$FASTVEC_FILE" in
    "$REPO"/*) echo "ERROR: fastvec was imported from the source tree" >&2; exit 1 ;;
    "$VENV"/*) ;;
    *) echo "ERROR: fastvec was not imported from the test venv" >&2; exit 1 ;;
esac

# Helper modules in tests/ (tests/envs.py): `from envs import ...` needs tests/ on
# sys.path, `from tests.envs import ...` needs a directory holding `tests` but not the
# source `fastvec/`, so SHIM holds only a link tests -> $REPO/tests. Both go on
# PYTHONPATH, which worker processes (spawn/forkserver) inherit too. With
# --import-mode=importlib pytest itself adds nothing to sys.path, in particular not
# the repo root (the default "prepend" mode would, were tests/__init__.py to appear).
# -c/--rootdir: pyproject.toml's [tool.pytest.ini_options] (markers, timeout) apply.
SHIM=$WORK/shim
mkdir -p "$SHIM"
ln -s "$REPO/tests" "$SHIM/tests"
# A guard plugin: prints where fastvec comes from, and stops the run if any fastvec
# module was loaded from the source tree.
cat > "$SHIM/fastvec_installed_guard.py" <<'EOF'
import os
import sys

import pytest

_REPO = os.path.realpath(os.environ["FASTVEC_SOURCE_TREE"]) + os.sep


def pytest_collection_finish(session):
    import fastvec

    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(f"fastvec under test: {os.path.dirname(fastvec.__file__)}")
    bad = sorted(
        f"{name}: {mod.__file__}"
        for name, mod in list(sys.modules.items())
        if (name == "fastvec" or name.startswith("fastvec."))
        and getattr(mod, "__file__", None)
        and os.path.realpath(mod.__file__).startswith(_REPO)
    )
    if bad:
        pytest.exit(f"fastvec imported from the source tree, not the wheel: {bad}", returncode=4)
EOF

step "pytest $REPO/tests (from $RUN)"
rc=0
FASTVEC_SOURCE_TREE=$REPO PYTHONPATH="$SHIM:$REPO/tests" \
    "$VPY" -m pytest "$REPO/tests" -q -p no:cacheprovider -p fastvec_installed_guard \
    -c "$REPO/pyproject.toml" --rootdir "$REPO" --import-mode=importlib "$@" || rc=$?

step "done: pytest exit status $rc, total $((SECONDS - T0))s"
exit "$rc"
