#!/usr/bin/env bash
# The checks that need no build: lint and format (ruff), types of the public API (mypy),
# and the docs site with warnings as errors (mkdocs --strict; its API pages read the
# docstrings from the source, so the package need not be built). Installs the `lint`
# and `docs` extras' tools only, into the active environment.
set -euo pipefail
cd "$(dirname "$0")/.."

python - <<'PY' > /tmp/fastvec-static-reqs.txt
import tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
print("\n".join(extras["lint"] + extras["docs"]))
PY
python -m pip install --quiet -r /tmp/fastvec-static-reqs.txt

ruff check .
ruff format --check .
mypy
mkdocs build --strict --site-dir "$(mktemp -d /tmp/fastvec-site-XXXXXX)"
echo "static checks: ok"
