"""The package's house rules, read from the source: no import circles, no module using
another's private names, the trainer's layers imported in one direction only, every
piece small enough to read at once (modules, classes, functions, argument lists), and
the benchmarks reaching the trainer through its public API only.

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

# The limits everywhere in fastvec/: lines of a class, of a function's code (its
# docstring apart), of a module; a function's positional parameters (self apart).
MAX_CLASS, MAX_FUNCTION, MAX_MODULE, MAX_POSITIONAL = 300, 60, 500, 6

# Signatures that mirror a peer's or stand in the public API as released: positional
# callers of these must keep working (gymnasium's AsyncVectorEnv, fastvec.gae/vtrace,
# fastvec.train.save_checkpoint).
POSITIONAL_API = {
    "fastvec/doors/gymnasium.py:AsyncVectorEnv.__init__",
    "fastvec/returns/gae_estimates.py:gae",
    "fastvec/returns/gae_estimates.py:gae_from_dones",
    "fastvec/returns/vtrace_targets.py:vtrace",
    "fastvec/train/algo/checkpoints.py:save_checkpoint",
}

# The trainer's layers, lowest first: a module of one may import its own layer's and
# lower ones', never a higher one's (fastvec.train's __init__ stands above them all).
TRAIN_LAYERS = ("config", "compute", "model", "storage", "algo", "pipelines", "run", "commands")


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


def _docstring_lines(node) -> int:
    body = getattr(node, "body", None)
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first.end_lineno - first.lineno + 1
    return 0


def _positional(node) -> int:
    args = node.args.posonlyargs + node.args.args
    return len(args) - (1 if args and args[0].arg in ("self", "cls") else 0)


def _too_long(path: str) -> list[str]:
    """What in the file at ``path`` passes the house's limits, one line each."""
    with open(path) as f:
        text = f.read()
    tree = ast.parse(text, path)
    name = os.path.relpath(path, os.path.dirname(PKG_DIR)).replace(os.sep, "/")
    found = []
    lines = text.count("\n") + 1
    if lines > MAX_MODULE:
        found.append(f"{name}: {lines} lines")
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_CLASS:
                found.append(f"{name}: {node.name} {n} lines")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
            if n > MAX_FUNCTION:
                found.append(f"{name}: {node.name} {n} lines of code")
            owner = parents.get(node)
            qual = f"{owner.name}.{node.name}" if isinstance(owner, ast.ClassDef) else node.name
            if _positional(node) > MAX_POSITIONAL and f"{name}:{qual}" not in POSITIONAL_API:
                found.append(f"{name}: {qual} takes {_positional(node)} positional arguments")
    return found


def test_every_piece_fits_on_a_reader():
    found = []
    for path in sorted(_modules().values()):
        if path.endswith(".py"):
            found += _too_long(path)
    assert found == []


def test_the_size_check_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION - 1))  # and the def line
    p = tmp_path / "long.py"
    p.write_text(f'def f():\n    """A docstring\n    of lines that do not count."""\n{body}\n')
    assert _too_long(str(p)) == []
    p.write_text(f"def f():\n{body}\n    return x0\n")
    assert len(_too_long(str(p))) == 1


def test_the_size_check_finds_a_long_argument_list(tmp_path):
    p = tmp_path / "args.py"
    p.write_text("class C:\n    def f(self, a, b, c, d, e, g, *, h=1):\n        pass\n")
    assert _too_long(str(p)) == []
    p.write_text("def f(a, b, c, d, e, g, h=1):\n    pass\n")
    [found] = _too_long(str(p))
    assert found.endswith("f takes 7 positional arguments")


def _layer_of(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) >= 3 and parts[:2] == ["fastvec", "train"] and parts[2] in TRAIN_LAYERS:
        return TRAIN_LAYERS.index(parts[2])
    return None


def _upward_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for m, targets in graph.items():
        mine = _layer_of(m)
        if mine is None:
            continue
        for t in targets:
            theirs = _layer_of(t)
            if theirs is not None and theirs > mine:
                found.append(f"{m} imports {t} ({TRAIN_LAYERS[mine]} below {TRAIN_LAYERS[theirs]})")
    return sorted(found)


def test_the_trainers_layers_import_downwards_only():
    assert _upward_imports(_graph()) == []
    packages = {m.split(".")[2] for m in _modules() if m.startswith("fastvec.train.") and m.count(".") >= 3}
    assert packages == set(TRAIN_LAYERS)
    # every module of the trainer lives in a layer: nothing left in the flat folder
    assert [m for m in _modules() if m.startswith("fastvec.train.") and _layer_of(m) is None] == []


def test_the_layer_check_finds_an_upward_import():
    graph = {"fastvec.train.model.cores": {"fastvec.train.algo.ppo", "fastvec.train.config.rules"}}
    assert _upward_imports(graph) == ["fastvec.train.model.cores imports fastvec.train.algo.ppo (model below algo)"]


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
