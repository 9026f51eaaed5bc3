#!/usr/bin/env bash
# Build fastvec's sdist and wheel and check what they carry: the wheel holds every
# compiled extension and no build leftovers, the sdist holds csrc/**/*.pyx (and the .pxd
# files they cimport) and builds a wheel of its own: ``python -m build`` makes the wheel
# from the unpacked sdist, so the wheel checked below is that proof (one compile, not two).
#
#   .ci/check_dist.sh [DIST_DIR]      (default: a temporary directory, removed after)
#
# Environment: PYTHON (default: python).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fastvec-dist-XXXXXX")
DIST=${1:-$WORK/dist}
trap 'rm -rf "$WORK"' EXIT
T0=$SECONDS
step() { printf '\n== [%4ss] %s\n' "$((SECONDS - T0))" "$*"; }

# --------------------------------------------------------------------------- build
step "build sdist + wheel ($REPO -> $DIST)"
if ! "$PY" -c "import build" 2>/dev/null; then
    "$PY" -m venv "$WORK/tools"
    "$WORK/tools/bin/python" -m pip install --quiet build
    PY=$WORK/tools/bin/python
fi
cd "$REPO"
# sdist first, then the wheel is built from the unpacked sdist (build's default), so a
# file missing from the sdist shows up as a broken wheel here.
"$PY" -m build --outdir "$DIST" .
SDIST=$(ls "$DIST"/*.tar.gz)
WHEEL=$(ls "$DIST"/*.whl)

# --------------------------------------------------------------------------- check
# check_dist.py KIND ARCHIVE: KIND is sdist or wheel.
cat > "$WORK/check_dist.py" <<'EOF'
import fnmatch, os, sys, tarfile, zipfile

kind, path, repo = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "wheel":
    names = zipfile.ZipFile(path).namelist()
else:  # strip the leading "fastvec-X.Y.Z/"
    names = [n.split("/", 1)[1] for n in tarfile.open(path).getnames() if "/" in n]
errors = []

def has(pattern):
    return any(fnmatch.fnmatch(n, pattern) for n in names)

leftovers = [
    n for n in names
    if n.endswith((".c", ".cpp", ".o", ".obj", ".pyc", ".pyo"))
    or n.startswith(("build/", "dist/", ".hypothesis/", ".benchmarks/", ".pytest_cache/"))
    or "/build/" in n or "__pycache__" in n.split("/")
]
if leftovers:
    errors.append(f"build leftovers: {leftovers}")

# every package of the source tree (a dir under fastvec/ with __init__.py)
packages = sorted(
    os.path.relpath(d, repo).replace(os.sep, "/")
    for d, dirs, files in os.walk(os.path.join(repo, "fastvec"))
    if "__init__.py" in files and "__pycache__" not in d
)
for pkg in packages:
    if f"{pkg}/__init__.py" not in names:
        errors.append(f"package {pkg} missing")

# csrc/ mirrors the package: csrc/fastvec/_core/channel.pyx -> fastvec/_core/channel.<abi>.so
src = os.path.join(repo, "csrc")
pyx = sorted(os.path.relpath(os.path.join(d, f), src).replace(os.sep, "/")[:-4]
             for d, _dirs, files in os.walk(src) for f in files if f.endswith(".pyx"))
pxd = sorted(os.path.relpath(os.path.join(d, f), src).replace(os.sep, "/")
             for d, _dirs, files in os.walk(src) for f in files if f.endswith(".pxd"))
if not pyx:
    errors.append("no csrc/**/*.pyx in the source tree")
if kind == "wheel":
    for mod in pyx:  # (.pyd on Windows)
        if not (has(f"{mod}.*.so") or has(f"{mod}.*.pyd") or has(f"{mod}.so")):
            errors.append(f"compiled extension {mod}*.so missing")
    for n in names:
        if n.endswith((".so", ".pyd")) and not n.startswith("fastvec/"):
            errors.append(f"unexpected binary outside fastvec/: {n}")
        if n.endswith(".pyx"):
            errors.append(f"source file in wheel: {n}")
        if n.split("/")[0] in ("tests", "benchmarks", "docs", "csrc"):
            errors.append(f"non-package file in wheel: {n}")
else:
    for must in ["setup.py", "pyproject.toml", "PKG-INFO"] + [f"csrc/{m}.pyx" for m in pyx] + [f"csrc/{m}" for m in pxd]:
        if must not in names:
            errors.append(f"{must} missing")
    for opt in ["README.md", "MANIFEST.in"]:
        if os.path.exists(os.path.join(repo, opt)) and opt not in names:
            errors.append(f"{opt} missing")
    for d in ["tests", "benchmarks"]:
        if os.path.isdir(os.path.join(repo, d)) and not has(f"{d}/*"):
            errors.append(f"{d}/ missing")
    # measured results are the project's records, not the package's: out of the sdist
    results = [n for n in names if n.startswith("benchmarks/results/")]
    if results:
        errors.append(f"benchmark results in sdist: {results[:5]}")
    bins = [n for n in names if n.endswith((".so", ".pyd", ".dylib"))]
    if bins:
        errors.append(f"compiled files in sdist: {bins}")

print(f"{kind} {os.path.basename(path)}: {len(names)} entries, packages {packages}, "
      f"extensions {pyx}: {'FAILED' if errors else 'ok'}")
for e in errors:
    print("  ERROR:", e)
sys.exit(1 if errors else 0)
EOF

step "check wheel contents"
"$PY" -m zipfile -l "$WHEEL"
"$PY" "$WORK/check_dist.py" wheel "$WHEEL" "$REPO"
step "check sdist contents"
"$PY" "$WORK/check_dist.py" sdist "$SDIST" "$REPO"

step "distributions ok: $(ls "$DIST")"
