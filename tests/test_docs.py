"""Every Python block in README.md and docs/**/*.md runs, so an example that rots fails.

The collector is this file's own (no plugin): fenced blocks opened with exactly
```python are run, the blocks of one page in order in one namespace, in a fresh
interpreter per page (worker processes and Ray instances a page starts end with it).
A block not meant to run here carries ``<!-- skip: reason -->`` on the line before its
fence; the collector lists those, and any other fence (```bash, ```text) is not run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if not (ROOT / "README.md").is_file() or not (ROOT / "docs").is_dir():
    # cibuildwheel copies only tests/ (and pyproject.toml) into an empty directory
    pytest.skip(
        "README.md and docs/ are not next to tests/ (tests copied away from the source tree)", allow_module_level=True
    )

PAGE_TIMEOUT_S = 240  # a page's blocks together; each page's examples take a few seconds
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
SKIP = re.compile(r"^\s*<!--\s*skip:\s*(?P<reason>.+?)\s*-->\s*$")


@dataclass
class Block:
    lang: str  # the info string's first word ("" when none)
    line: int  # 1-based line of the first line of code
    code: str
    skip: str | None  # the reason, when the block is marked not to run


def _closes(line: str, fence: str) -> bool:
    """A closing fence: the opening's character, at least as many, nothing else."""
    stripped = line.strip()
    return stripped.startswith(fence) and not stripped.strip(fence[0])


def parse_blocks(text: str) -> list[Block]:
    """Every fenced block of a markdown text, with its language and skip mark."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group("fence"), m.group("info").split()
        mark = SKIP.match(lines[i - 1]) if i > 0 else None
        end = i + 1
        while end < len(lines) and not _closes(lines[end], fence):
            end += 1
        code = "\n".join(lines[i + 1 : end]) + "\n"
        blocks.append(Block(info[0] if info else "", i + 2, code, mark.group("reason") if mark else None))
        i = end + 1
    return blocks


def python_blocks(text: str) -> tuple[list[Block], list[Block]]:
    """(blocks to run, blocks marked skip) among the ```python blocks."""
    py = [b for b in parse_blocks(text) if b.lang == "python"]
    return [b for b in py if b.skip is None], [b for b in py if b.skip is not None]


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


# Runs in a fresh interpreter: the blocks of one page, in order, in one namespace that
# is __main__'s (so classes a page defines pickle by value into worker processes).
RUNNER = r"""
import json, sys
blocks = json.load(sys.stdin)
ns = {"__name__": "__main__"}
for name, code in blocks:
    exec(compile(code, name, "exec"), ns)
"""


def run_page(name: str, blocks: list[Block], timeout: float = PAGE_TIMEOUT_S) -> subprocess.CompletedProcess:
    # A block's line numbers in a traceback are its page's: pad with blank lines.
    payload = [(f"{name}:{b.line}", "\n" * (b.line - 1) + b.code) for b in blocks]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # Outside the source tree: `python -c` puts its cwd first on sys.path, and the
    # checkout's fastvec/ has no compiled modules where CI tests the installed package.
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run(
            [sys.executable, "-c", RUNNER],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env=env,
        )


def _page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _has_python(path: Path) -> bool:
    run, skipped = python_blocks(path.read_text())
    return bool(run or skipped)


@pytest.mark.parametrize("path", [p for p in pages() if _has_python(p)], ids=_page_id)
def test_page_examples_run(path):
    run, skipped = python_blocks(path.read_text())
    for block in skipped:  # reported: `pytest -rs` / `-s` shows which blocks were not run, and why
        print(f"{_page_id(path)}:{block.line}: not run ({block.skip})")
    if not run:
        pytest.skip("; ".join(f"line {b.line}: {b.skip}" for b in skipped))
    result = run_page(_page_id(path), run)
    assert result.returncode == 0, f"an example in {_page_id(path)} failed:\n{result.stdout}\n{result.stderr}"


def test_collector_finds_the_examples():
    found = {_page_id(p): python_blocks(p.read_text()) for p in pages()}
    runnable = {page: len(run) for page, (run, _) in found.items() if run}
    skipped = {page: [b.skip for b in skip] for page, (_, skip) in found.items() if skip}
    print("runnable blocks per page:", runnable)
    print("skipped blocks:", skipped)
    assert runnable.get("README.md", 0) >= 2
    assert sum(runnable.values()) >= 10
    # skips stay rare: at most one in ten of all Python blocks
    assert sum(map(len, skipped.values())) * 10 <= sum(runnable.values()) + sum(map(len, skipped.values()))
    for reasons in skipped.values():
        assert all(reasons), "a skip mark must give its reason"


def test_parser_tells_fences_and_skips_apart():
    text = (
        "# page\n```python\nx = 1\n```\n<!-- skip: needs a GPU -->\n```python\nimport cuda_only\n```\n"
        "```bash\necho hi\n```\n````python\ns = '```'\n````\n```py\nnot run\n```\n"
    )
    run, skipped = python_blocks(text)
    assert [b.code for b in run] == ["x = 1\n", "s = '```'\n"]
    assert [b.line for b in run] == [3, 13]
    assert [(b.code, b.skip) for b in skipped] == [("import cuda_only\n", "needs a GPU")]


def test_a_broken_example_fails_with_its_page_and_line():
    text = "intro\n\n```python\nvalue = 41\n```\n\ntext\n\n```python\nassert value == 42, 'rotted'\n```\n"
    run, _ = python_blocks(text)
    result = run_page("docs/synthetic.md", run, timeout=60)
    assert result.returncode != 0
    assert "rotted" in result.stderr and 'File "docs/synthetic.md:10", line 10' in result.stderr
    # the blocks share one namespace: the first block's name is seen by the second
    fixed = run_page("docs/synthetic.md", python_blocks(text.replace("41", "42"))[0], timeout=60)
    assert fixed.returncode == 0, fixed.stderr


def test_readme_quick_start_is_two_commands():
    text = (ROOT / "README.md").read_text()
    head, sep, rest = text.partition("\n## Quick start\n")
    assert sep, "README.md has a '## Quick start' section"
    first = parse_blocks(rest)[0]
    assert first.lang == "bash"
    commands = [line for line in first.code.splitlines() if line.strip()]
    assert len(commands) == 2
    assert "fastvec train CartPole-v1" in commands[0] and "pytest tests" in commands[1]
