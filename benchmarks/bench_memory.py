#!/usr/bin/env python
"""A task that needs memory: CartPoleNoVel-v1 (CartPole-v1 without its velocities), solved
by ``fastvec train``'s LSTM policy, not by its MLP, against sb3-contrib's RecurrentPPO.

    python benchmarks/bench_memory.py --out benchmarks/results/memory      # needs sb3-contrib==2.9.2

Per seed, three candidates, each a fresh process, in an order that rotates seed by seed:

- ``fastvec LSTM``: ``fastvec train CartPoleNoVel-v1`` (its preset: RL Zoo's RecurrentPPO
  hyperparameters for the env, on fastvec's engine and trainer, an LSTM of 64 units);
- ``fastvec MLP``: the same with ``--set policy_core=none`` (no memory);
- ``sb3-contrib RecurrentPPO``: ``MlpLstmPolicy`` with RL Zoo's hyperparameters
  (``harness.train_children.child_sb3_recurrent``), its schedules over the same budget.

Each runs until the mean return of its last 20 training episodes reaches 475, or
``--max-steps`` (300k: the preset's ``total_steps``). Wall time counts env start-up, model
construction and training (torch warmed up before the clock starts, one thread, as
``bench_train.py``). Writes ``memory.json`` and ``memory.md`` into ``--out``.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time

from bench_train import SB3_CARTPOLE, run_child
from harness.common import Parser, cpu_model, rotated, span, write_results

CANDIDATES = {
    "fastvec LSTM": lambda seed, steps: {
        "kind": "fastvec",
        "env_id": ENV,
        "seed": seed,
        "overrides": [],
        "threshold": 475.0,
        "total_steps": steps,
    },
    "fastvec MLP": lambda seed, steps: {
        "kind": "fastvec",
        "env_id": ENV,
        "seed": seed,
        "overrides": ["policy_core=none"],
        "threshold": 475.0,
        "total_steps": steps,
    },
    "sb3-contrib RecurrentPPO": lambda seed, steps: {  # RL Zoo's settings for it are its CartPole ones
        "kind": "sb3_recurrent",
        "env_id": ENV,
        "seed": seed,
        "hp": SB3_CARTPOLE,
        "threshold": 475.0,
        "max_steps": steps,
    },
}
ENV = "CartPoleNoVel-v1"


def report(runs: dict, args, wall: float) -> str:
    lines = [
        f"# Memory: {ENV} ({wall / 60:.0f} min)",
        "",
        f"`python benchmarks/bench_memory.py --out {args.out}`; {cpu_model()}, {os.cpu_count()} cores, "
        f"{platform.system()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Seeds "
        f"{', '.join(map(str, args.seeds))}, each candidate a fresh process, the order rotating by seed; "
        f"until the mean of the last 20 training returns reaches 475 or {args.max_steps:,} steps. "
        "Medians, min-max in brackets; time to solve over the solved seeds.",
        "",
        "| candidate | solved | time to solve, s | env steps to solve | steps/s | final mean return |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, rs in runs.items():
        ok = [r for r in rs if r.get("solved")]
        lines.append(
            f"| {name} | {len(ok)} of {len(rs)} | {span([r['wall_seconds'] for r in ok], '{:,.1f}')} | "
            f"{span([r['env_steps'] for r in ok], '{:,.0f}')} | {span([r.get('sps') for r in rs], '{:,.0f}')} | "
            f"{span([r.get('final_mean_return') for r in rs], '{:,.1f}')} |"
        )
    f = [r["wall_seconds"] for r in runs["fastvec LSTM"] if r.get("solved")]
    s = [r["wall_seconds"] for r in runs["sb3-contrib RecurrentPPO"] if r.get("solved")]
    if f and s:
        lines += [
            "",
            f"fastvec LSTM's median time to solve against RecurrentPPO's: {statistics.median(f) / statistics.median(s):.2f}x (goal: at most 0.3x).",
        ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--max-steps", type=int, default=300_000)
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    names = list(CANDIDATES)
    runs: dict[str, list] = {n: [] for n in names}
    for i, seed in enumerate(args.seeds):
        for name in rotated(names, i):
            r = run_child(CANDIDATES[name](seed, args.max_steps), args.timeout)
            if "error" in r:
                raise SystemExit(f"{name}, seed {seed}: {r['error']}")
            runs[name].append(r)
            print(
                f"seed {seed} {name}: solved={r['solved']} steps={r['env_steps']} wall={r['wall_seconds']:.1f}s",
                file=sys.stderr,
                flush=True,
            )
    wall = time.perf_counter() - t0
    keep = ("solved", "env_steps", "wall_seconds", "sps", "final_mean_return")
    data = {"seeds": args.seeds, "runs": {n: [{k: r.get(k) for k in keep} for r in rs] for n, rs in runs.items()}}
    write_results(args.out, report(runs, args, wall), data, stem="memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
