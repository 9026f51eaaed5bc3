"""Fresh processes: the path a child imports fastvec and this harness from, the JSON line
it ends on, and the CPU time of the children a benchmark has waited for."""

from __future__ import annotations

import json
import os
import resource
import subprocess


def bench_dir() -> str:
    """``benchmarks/``: put on a child's path so that it imports this harness."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_path(fastvec_root: str | None = None) -> str:
    """``PYTHONPATH`` of a child: the folder holding the fastvec to measure (default: the
    one this process runs), then ``benchmarks/`` for this harness. Run the child in a cwd
    outside any source tree: ``python -m`` puts the cwd first, and an unbuilt checkout
    there would shadow the build."""
    if fastvec_root is None:
        import fastvec

        fastvec_root = os.path.dirname(os.path.dirname(os.path.abspath(fastvec.__file__)))
    return os.pathsep.join(filter(None, [os.path.abspath(fastvec_root), bench_dir(), os.environ.get("PYTHONPATH")]))


def child_env(fastvec_root: str | None = None) -> dict:
    """This process's environment with ``child_path(fastvec_root)`` as ``PYTHONPATH``."""
    return dict(os.environ, PYTHONPATH=child_path(fastvec_root))


def last_json(text: str) -> dict | None:
    """The last line of ``text`` that parses as a JSON object (None if none does): what a
    measuring child or ``fastvec train`` prints last, after whatever else it printed."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            return json.loads(line)
        except ValueError:  # a line cut short
            continue
    return None


def child_json(cmd: list, what: str, timeout: float | None = 1800.0, cwd: str | None = None, env=None) -> dict:
    """Run a measurement in a fresh process (in ``cwd``, with ``env``); its last JSON line.
    A failure ends the benchmark (``SystemExit``) with ``what`` and the child's stderr."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    res = last_json(proc.stdout)
    if proc.returncode != 0 or res is None:
        raise SystemExit(f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return res


def children_cpu_seconds() -> float:
    """User and system CPU seconds of the children this process has waited for (and of
    their waited-for descendants): a difference around a run is the run's CPU time."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime
