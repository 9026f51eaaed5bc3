"""Every name of the code that the docs write in backticks still names something.

A page's inline code that names the package (``fastvec.train.PPOConfig.n_steps``,
``fastvec._core.segment.plan_segment``), a path of the source tree (``fastvec/train/algo/``,
``csrc/fastvec/_core/tuning.pxd``, ``tests/test_house.py``) or an API page's ``:::``
directive must resolve: a dotted name to an importable module and the attributes reached
from it, a path to a file or folder. A rename that leaves a page behind fails here,
with every stale name of every page listed at once.
"""

from __future__ import annotations

import ast
import glob
import importlib
import inspect
import itertools
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
if not DOCS.is_dir() or not (ROOT / "fastvec").is_dir():
    # cibuildwheel copies only tests/ (and pyproject.toml) into an empty directory
    pytest.skip("docs/ and fastvec/ are not next to tests/ (tests copied away)", allow_module_level=True)

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)  # inline code, any number of backticks
DIRECTIVE = re.compile(r"^:::\s+(\S+)", re.MULTILINE)  # mkdocstrings: ::: fastvec.train.PPOConfig
DOTTED = re.compile(r"(?<![\w./])fastvec(?:\.\w+)+")
PATH = re.compile(r"(?<![\w./-])(?:fastvec|csrc|tests|benchmarks)/[\w./*{},-]*")
BRACES = re.compile(r"\{([^{}]*)\}")


def pages() -> list[Path]:
    """The pages whose names are kept true: the map, the engine's interface, the guides,
    the home page and the API reference."""
    named = [DOCS / "ARCHITECTURE.md", DOCS / "ENGINE_API.md", DOCS / "index.md"]
    return named + sorted((DOCS / "guide").glob("*.md")) + sorted((DOCS / "reference").glob("*.md"))


def _prose(text: str) -> str:
    """The text with every fenced block blanked out (its lines kept, so line numbers hold)."""
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            out.append("")
        elif fence is not None:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def names_in(text: str) -> list[tuple[int, str]]:
    """``(line, name)`` for each package name and source path in the text's inline code
    and ``:::`` directives."""
    prose = _prose(text)
    found = []
    for m in SPAN.finditer(prose):
        code = m.group(2).replace("\n", " ")
        line = prose.count("\n", 0, m.start()) + 1
        found += [(line, n.group(0).rstrip(".")) for n in DOTTED.finditer(code)]
        found += [(line, p.group(0).rstrip(".,")) for p in PATH.finditer(code)]
    for m in DIRECTIVE.finditer(prose):
        found.append((prose.count("\n", 0, m.start()) + 1, m.group(1)))
    return found


def _expand(path: str) -> list[str]:
    """``a/{b,c}/d`` as ``a/b/d`` and ``a/c/d``."""
    parts = BRACES.split(path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _path_exists(path: str) -> bool:
    return all(glob.glob(str(ROOT / p), recursive=True) for p in _expand(path))


def _assigned_on_self(klass: type, name: str) -> bool:
    """``self.name = ...`` (or ``self.a, self.name = ...``) somewhere in the class's source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    except (OSError, TypeError, SyntaxError):
        return False
    return any(
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and node.attr == name
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        for node in ast.walk(tree)
    )


def _member(obj, name: str):
    """``obj.name``: an attribute, or on a class also a declared field, a descriptor that
    answers only instances, or an attribute its methods set on ``self``. ``KeyError``
    where there is none."""
    try:
        return getattr(obj, name)
    except AttributeError:
        pass
    if inspect.isclass(obj):
        for klass in obj.__mro__:
            if name in vars(klass) or name in getattr(klass, "__annotations__", {}):
                return None
            if getattr(klass, "__module__", "").startswith("fastvec") and _assigned_on_self(klass, name):
                return None
    raise KeyError(name)


def _dotted_exists(name: str) -> bool:
    """The longest importable module prefix of ``name``, then each attribute after it."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name is not None and not exc.name.startswith("fastvec"):
                raise  # an optional dependency missing: not the page's fault, say so
            continue
        try:
            for attr in parts[cut:]:
                obj = _member(obj, attr)
        except KeyError:
            return False
        return True
    return False


def stale(text: str) -> list[tuple[int, str]]:
    """The names in ``text`` that resolve to nothing."""
    out = []
    for line, name in names_in(text):
        ok = _dotted_exists(name) if "/" not in name else _path_exists(name)
        if not ok:
            out.append((line, name))
    return out


def test_every_name_in_the_docs_exists():
    pytest.importorskip("torch")  # fastvec.train's names import it
    report = [f"{p.relative_to(ROOT)}:{line}: {name}" for p in pages() for line, name in stale(p.read_text())]
    assert not report, "names in the docs that name nothing (renamed or removed?):\n" + "\n".join(report)


def test_the_pages_name_the_code():
    counted = {p.name: len(names_in(p.read_text())) for p in pages()}
    assert counted["ARCHITECTURE.md"] >= 30 and counted["ENGINE_API.md"] >= 5, counted


def test_the_checker_catches_made_up_names():
    text = (
        "Real: `fastvec.engine.Engine`, `fastvec._core.segment.plan_segment`, `fastvec.gae`,\n"
        "`fastvec.train.PPOConfig.n_steps`, `fastvec.train.PPOConfig.num_workers`,\n"
        "`fastvec/train/{config,algo}/`, `csrc/fastvec/_core/tuning.pxd`, `csrc/**/*.pyx`,\n"
        "`fastvec.train.storage.rollout.Rollout.states` (set in __init__).\n"
        "Made up: `fastvec.train.ppo`, `fastvec.engine.Engine.no_such_method`,\n"
        "``fastvec.train.PPOConfig.no_such_key``, `fastvec/train/{config,nowhere}/`,\n"
        "`csrc/fastvec/_core/no_such.pyx`, `fastvec.tune.tune(env_fns, policy_us=...)` is real.\n"
        "```python\nfastvec.not_checked_in_code_blocks\n```\n"
        "::: fastvec.train.NoSuchClass\n"
    )
    assert stale(text) == [
        (5, "fastvec.train.ppo"),
        (5, "fastvec.engine.Engine.no_such_method"),
        (6, "fastvec.train.PPOConfig.no_such_key"),
        (6, "fastvec/train/{config,nowhere}/"),
        (7, "csrc/fastvec/_core/no_such.pyx"),
        (11, "fastvec.train.NoSuchClass"),
    ]
