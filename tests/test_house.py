"""The package's house rules, read from the source: no import circles, no module using
another's private names, the trainer's pieces small enough to read at once, and the
benchmarks reaching the trainer through its public API only.

Every import counts, at module level or inside a function (a lazy import still ties two
modules together). A private *module* (``fastvec._gae``, ``fastvec.doors._gym_infos``,
the ``fastvec._core`` package) is made to be shared and may be imported; a private
*name* (``_dumps``) belongs to the module that defines it.
"""

from __future__ import annotations

import ast
import os

import pytest

import fastvec

PKG_DIR = os.path.dirname(os.path.abspath(fastvec.__file__))
# The source tree's benchmarks/, where the tests run from a checkout (not from a wheel's copy).
BENCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")

# The limits in fastvec/train/: lines of a class, a function, a module (docstrings count).
MAX_CLASS, MAX_FUNCTION, MAX_MODULE = 300, 60, 500


def _modules(root: str = PKG_DIR) -> dict[str, str]:
    """{dotted name: path} of every module of the package: its Python files, and its
    compiled modules (whose sources are under ``csrc/``; their path here is the built file)."""
    found = {}
    base = os.path.dirname(root)
    for folder, _dirs, files in os.walk(root):
        for f in files:
            if f.endswith(".py") or (f.endswith(".so") and ".cpython-" in f) or f.endswith(".pyd"):
                rel = os.path.relpath(os.path.join(folder, f), base)
                name = rel.split(".", 1)[0].replace(os.sep, ".")
                found[name.removesuffix(".__init__")] = os.path.join(folder, f)
    return found


def _parse(path: str):
    """The module's syntax tree; None for a compiled module."""
    if not path.endswith(".py"):
        return None
    with open(path) as f:
        return ast.parse(f.read(), path)


def _absolute(module: str, is_package: bool, level: int, target: str | None) -> str:
    """An import's absolute module name, as written in ``module``."""
    if level == 0:
        return target or ""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([target] if target else []))


def _imports(module: str, path: str, known: dict[str, str]):
    """``(imported module, names taken from it)`` for each import in ``module`` that
    reaches the package: ``from m import a, b`` gives ``(m, [a, b])``, or ``(m.a, [])``
    where ``a`` is a submodule; ``import m`` gives ``(m, [])``."""
    tree = _parse(path)
    if tree is None:
        return
    is_package = os.path.basename(path).startswith("__init__.")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "fastvec":
                    yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, is_package, node.level, node.module)
            if source.split(".")[0] != "fastvec":
                continue
            names = []
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in known:
                    yield sub, []
                else:
                    names.append(alias.name)
            if names:
                yield source, names


def _graph() -> dict[str, set[str]]:
    known = _modules()
    graph: dict[str, set[str]] = {m: set() for m in known}
    for m, path in known.items():
        for target, _names in _imports(m, path, known):
            if target in known and target != m:
                graph[m].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert _cycles(_graph()) == []


def test_the_circle_check_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_privates(tree) -> set[str]:
    """Private names a module defines: functions, classes, assigned names and attributes."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif (  # torch's register_buffer("_name", ...) and register_parameter
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("register_buffer", "register_parameter")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            own.add(node.args[0].value)
    return {n for n in own if _private(n)}


def _private_uses() -> list[str]:
    """Private names one module takes from another: imported by name, or read as an
    attribute (``obj._name``) where only another module of the package defines it."""
    known = _modules()
    trees = {m: _parse(p) for m, p in known.items()}
    own = {m: _own_privates(t) for m, t in trees.items() if t is not None}
    defined_by: dict[str, set[str]] = {}
    for m, names in own.items():
        for n in names:
            defined_by.setdefault(n, set()).add(m)
    found = []
    for m, path in known.items():
        tree = trees[m]
        if tree is None:
            continue
        for target, names in _imports(m, path, known):
            for n in names:
                if _private(n) and f"{target}.{n}" not in known:
                    found.append(f"{m} imports {n} from {target}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own[m]:
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                if defined_by.get(node.attr):
                    where = ", ".join(sorted(defined_by[node.attr]))
                    found.append(f"{m}:{node.lineno} reads .{node.attr} (defined in {where})")
    return sorted(set(found))


def test_no_module_uses_another_modules_private_names():
    assert _private_uses() == []


def _too_long(path: str) -> list[str]:
    with open(path) as f:
        text = f.read()
    tree = ast.parse(text, path)
    name = os.path.relpath(path, os.path.dirname(PKG_DIR))
    found = []
    lines = text.count("\n") + 1
    if lines > MAX_MODULE:
        found.append(f"{name}: {lines} lines")
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            limit = MAX_CLASS if isinstance(node, ast.ClassDef) else MAX_FUNCTION
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                found.append(f"{name}: {node.name} {n} lines")
    return found


def test_the_trainers_pieces_fit_on_a_reader():
    train = os.path.join(PKG_DIR, "train")
    found = []
    for f in sorted(os.listdir(train)):
        if f.endswith(".py"):
            found += _too_long(os.path.join(train, f))
    assert found == []


def test_the_size_check_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION))
    p = tmp_path / "long.py"
    p.write_text(f"def f():\n{body}\n")
    assert len(_too_long(str(p))) == 1


def _bench_trainer_imports() -> list[str]:
    """What the benchmarks import from the trainer that is not ``fastvec.train.__all__``."""
    import fastvec.train

    public = set(fastvec.train.__all__)
    found = []
    for folder, _dirs, files in os.walk(BENCH_DIR):
        if os.path.basename(folder) == "results":
            continue
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            with open(path) as fh:
                tree = ast.parse(fh.read(), path)
            for node in ast.walk(tree):
                rel = os.path.relpath(path, BENCH_DIR)
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fastvec.train"):
                    if node.module != "fastvec.train":
                        found.append(f"{rel}:{node.lineno} imports from {node.module}")
                    else:
                        found += [f"{rel}:{node.lineno} imports {a.name}" for a in node.names if a.name not in public]
                elif isinstance(node, ast.Import):
                    found += [
                        f"{rel}:{node.lineno} imports {a.name}"
                        for a in node.names
                        if a.name.startswith("fastvec.train.")
                    ]
    return found


@pytest.mark.skipif(not os.path.isdir(BENCH_DIR), reason="no benchmarks/ beside the tests (a wheel's test copy)")
def test_benchmarks_use_the_trainers_public_api():
    assert _bench_trainer_imports() == []
