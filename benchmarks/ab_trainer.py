#!/usr/bin/env python
"""Two builds of the trainer side by side, interleaved: does a change keep its figures?

    git worktree add /tmp/before <rev> && (cd /tmp/before && python setup.py build_ext --inplace)
    python setup.py build_ext --inplace
    python benchmarks/ab_trainer.py --before /tmp/before --after . --out benchmarks/results/ab_trainer

The figures a user of ``fastvec train`` and ``fastvec bench`` sees, each run as the user
runs it (the command line, torch's defaults), in a fresh process whose ``PYTHONPATH``
is the build's source tree (cwd outside both trees):

- ``fastvec train CartPole-v1 --seed S --stop-at-return 475``: the wall time to solve
  (the result's ``wall_seconds``, start-up included), seeds 1-5;
- ``fastvec train HalfCheetah-v5 --total-steps 300000 --seed S``, lock-step and with
  ``--set pipeline=async``: steps/s and the final mean return, seeds 1-3;
- ``fastvec bench CartPole-v1`` and ``fastvec bench HalfCheetah-v5`` (16 envs): the
  ratio against SyncVectorEnv, median of the command's own 3 rounds, 3 runs each.

Each item runs on both builds back to back, the order alternating from item to item
within each figure, so both builds see the same minutes of the host. The table gives medians over the
items with their ranges and the after/before ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

from harness.cli_runs import FASTVEC, run_train, train_command
from harness.common import cpu_model, write_results
from harness.processes import child_env, child_json

BENCH = (
    "import json, statistics, sys; from fastvec.bench import build_parser, run; "
    "a = build_parser().parse_args([sys.argv[1]]); "
    "r = run(a.env_id, a.num_envs, a.steps, a.num_workers, a.repeats, a.seed); "
    "print(json.dumps({'ratio': statistics.median(r['ratios'])}))"
)


def items(cartpole_seeds: int, cheetah_seeds: int, bench_runs: int) -> list[tuple[str, dict]]:
    """``(figure, how to run it)`` for each measurement: ``run_train``'s arguments, or
    ``{"bench": env_id}`` for ``fastvec bench``."""
    out = []
    for s in range(1, cartpole_seeds + 1):
        out.append(
            ("CartPole-v1 to 475", {"env_id": "CartPole-v1", "seed": s, "extra_args": ["--stop-at-return", "475"]})
        )
    for s in range(1, cheetah_seeds + 1):
        for name, sets in (("lock-step", []), ("async", ["pipeline=async"])):
            train = {"env_id": "HalfCheetah-v5", "seed": s, "total_steps": 300_000, "sets": sets}
            out.append((f"HalfCheetah-v5 300k {name}", train))
    for _ in range(bench_runs):
        for env in ("CartPole-v1", "HalfCheetah-v5"):
            out.append((f"fastvec bench {env} 16 envs", {"bench": env}))
    return out


def command_line(item: dict) -> list[str]:
    """The ``fastvec`` command line an item stands for."""
    if "bench" in item:
        return ["bench", item["bench"]]
    return train_command(**item, checkpoint_every=0)[len(FASTVEC) :]


def run_one(build: str, item: dict, timeout: float) -> dict:
    """One item in a fresh process importing the build at ``build``: its result JSON."""
    if "bench" not in item:
        return run_train(**item, checkpoint_every=0, pythonpath=build, timeout=timeout)
    with tempfile.TemporaryDirectory() as cwd:  # outside both trees
        cmd = [sys.executable, "-c", BENCH, item["bench"]]
        return child_json(cmd, f"fastvec bench on {build}", timeout, cwd=cwd, env=child_env(build))


def figures(figure: str, res: dict) -> dict:
    if figure.startswith("fastvec bench"):
        return {"ratio": res["ratio"]}
    if figure.startswith("CartPole"):
        return {"wall_s": res["wall_seconds"], "env_steps": res["env_steps"], "solved": bool(res["solved"])}
    return {"sps": res["sps"], "return": res["final_mean_return"], "wall_s": res["wall_seconds"]}


def _cell(xs: list[float], fmt: str) -> str:
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"


def table(rows: list[dict]) -> list[str]:
    out = [
        "| figure | measure | before | after | after / before |",
        "|---|---|---:|---:|---:|",
    ]
    order = list(dict.fromkeys(r["figure"] for r in rows))
    for figure in order:
        mine = [r for r in rows if r["figure"] == figure]
        for key in [k for k in mine[0]["before"] if k != "solved"]:
            b = [r["before"][key] for r in mine]
            a = [r["after"][key] for r in mine]
            fmt = ".2f" if key in ("ratio", "wall_s") else ",.0f"
            ratio = statistics.median(a) / statistics.median(b)
            out.append(f"| {figure} | {key} | {_cell(b, fmt)} | {_cell(a, fmt)} | {ratio:.3f} |")
        if "solved" in mine[0]["before"]:
            n = len(mine)
            sb = sum(r["before"]["solved"] for r in mine)
            sa = sum(r["after"]["solved"] for r in mine)
            out.append(f"| {figure} | solved | {sb}/{n} | {sa}/{n} | |")
    return out


def _machine() -> str:
    return f"{cpu_model()}, {os.cpu_count()} cores, {platform.system()}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--before", required=True, help="source tree of the first build (built in place)")
    p.add_argument("--after", required=True, help="source tree of the second build (built in place)")
    p.add_argument("--cartpole-seeds", type=int, default=5)
    p.add_argument("--cheetah-seeds", type=int, default=3)
    p.add_argument("--bench-runs", type=int, default=3)
    p.add_argument("--out", required=True, help="directory for ab_trainer.json and ab_trainer.md")
    p.add_argument("--timeout", type=float, default=900.0)
    args = p.parse_args(argv)
    builds = {"before": args.before, "after": args.after}
    t0 = time.perf_counter()
    rows, seen = [], {}
    for figure, item in items(args.cartpole_seeds, args.cheetah_seeds, args.bench_runs):
        # the order alternates within each figure: whichever build runs first, each
        # figure's items see both orders (a figure whose items all ran one order would
        # carry the position's effect, about 5% here, as if it were the build's)
        i = seen[figure] = seen.get(figure, -1) + 1
        row: dict = {"figure": figure, "argv": command_line(item), "first": "before" if i % 2 == 0 else "after"}
        for name in ("before", "after") if i % 2 == 0 else ("after", "before"):
            row[name] = figures(figure, run_one(builds[name], item, args.timeout))
        print(json.dumps(row), flush=True)
        rows.append(row)
    wall = time.perf_counter() - t0
    meta = {
        "before": os.path.abspath(args.before),
        "after": os.path.abspath(args.after),
        "machine": _machine(),
        "wall_s": round(wall, 1),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    lines = [
        f"# The trainer before/after, interleaved ({len(rows)} items, {wall:.0f} s)",
        "",
        f"`benchmarks/ab_trainer.py --before {args.before} --after {args.after} --out {args.out}`; "
        f"{meta['machine']}, {meta['date']}. Each item ran on both builds back to back, the order "
        "alternating within each figure; medians over items, min-max in brackets. wall_s: the run's wall time "
        "(start-up included); sps: env steps/s over the run; return: the final mean return of the "
        "last episodes; ratio: `fastvec bench`'s fastvec.AsyncVectorEnv against SyncVectorEnv.",
        "",
        *table(rows),
    ]
    write_results(args.out, "\n".join(lines) + "\n", {"meta": meta, "rows": rows}, stem="ab_trainer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
