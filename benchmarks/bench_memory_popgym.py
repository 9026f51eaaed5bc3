#!/usr/bin/env python
"""A harder memory task from a package users use: POPGym's RepeatPreviousEasy (popgym 1.0.7),
learned by ``fastvec train``'s recurrent policies and not by its MLP.

    python benchmarks/bench_memory_popgym.py --out benchmarks/results/memory_popgym --seeds 1 2 3   # needs popgym

The task (Morad et al., "POPGym: Benchmarking Partially Observable Reinforcement Learning",
ICLR 2023): a card is dealt each step, the agent names the suit of the card dealt 3
cards before the one it sees; +1/48 for a right suit, -1/48 for a wrong one, 51 steps.
An episode's return lies in [-1, 1]: 1 answers every card right, guessing scores -0.5.

Per seed, three candidates, each a fresh ``fastvec train`` process over the same budget
(the preset's 200k steps, no early stop), in an order that rotates seed by seed, then a
fresh ``fastvec eval`` process of its checkpoint (100 episodes, the policy's mode):

- ``fastvec LSTM``: the preset (an LSTM of 64 units);
- ``fastvec GRU``: the same with ``--set policy_core=gru`` (the POPGym paper's best model);
- ``fastvec MLP``: the same with ``--set policy_core=none`` (no memory).

Reported: the final mean training return (the last 20 episodes), the best such mean over
the run (the paper's measure, MMER, is the best mean episodic return over training), the
evaluation's mean return, the wall time to a training mean of 0.95, steps/s and the run's
wall time. Writes ``memory_popgym.json`` and ``memory_popgym.md`` into ``--out``.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time

from harness.cli_runs import return_rows, run_fastvec, run_train
from harness.common import Parser, cpu_model, rotated, span, write_results

ENV = "popgym-RepeatPreviousEasy-v0"
SOLVED = 0.95
CANDIDATES = {"fastvec LSTM": [], "fastvec GRU": ["policy_core=gru"], "fastvec MLP": ["policy_core=none"]}


def one_run(overrides: list, seed: int, steps: int | None, timeout: float) -> dict:
    """Train and evaluate one candidate on one seed, each in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "run")
        result = run_train(ENV, seed, total_steps=steps, sets=overrides, logdir=run, timeout=timeout)
        curve = [(r["charts/mean_return"], r.get("time/wall_s")) for r in return_rows(run)]
        ev = run_fastvec(["eval", run, "--episodes", "100", "--seed", "10000"], timeout=timeout)
    solved_at = next((t for r, t in curve if r >= SOLVED and t is not None), None)
    return {
        "env_steps": result["env_steps"],
        "wall_seconds": result["wall_seconds"],
        "sps": result["sps"],
        "final_mean_return": result["final_mean_return"],
        "best_mean_return": max((r for r, _ in curve), default=None),
        "seconds_to_solve": solved_at,
        "eval_mean_return": ev["mean_return"],
        "policy": result["policy"],
    }


def report(runs: dict, args, wall: float) -> str:
    n = len(args.seeds)
    lines = [
        f"# Memory: {ENV} ({wall / 60:.0f} min)",
        "",
        f"`python benchmarks/bench_memory_popgym.py --out {args.out} --seeds {' '.join(map(str, args.seeds))}`; {cpu_model()}, {os.cpu_count()} cores, "
        f"{platform.system()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Seeds "
        f"{', '.join(map(str, args.seeds))}, each candidate a fresh process, the order rotating by seed; "
        f"{runs['fastvec LSTM'][0]['env_steps']:,} env steps each (the preset's), no early stop. "
        f"Medians, min-max in brackets; time to {SOLVED} over the seeds that reached it. Returns lie "
        "in [-1, 1]: 1 names every suit right, guessing scores -0.5.",
        "",
        f"| candidate | reached {SOLVED} | time to {SOLVED}, s | final mean return | best mean return | "
        "eval return (100 episodes) | steps/s | run, s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, rs in runs.items():
        ok = [r["seconds_to_solve"] for r in rs if r["seconds_to_solve"] is not None]
        lines.append(
            f"| {name} | {len(ok)} of {n} | {span(ok, '{:.1f}')} | {span([r['final_mean_return'] for r in rs])} | "
            f"{span([r['best_mean_return'] for r in rs])} | {span([r['eval_mean_return'] for r in rs])} | "
            f"{span([r['sps'] for r in rs], '{:,.0f}')} | {span([r['wall_seconds'] for r in rs], '{:.1f}')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--steps", type=int, default=None, help="env steps a run (default: the preset's)")
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    names = list(CANDIDATES)
    runs: dict[str, list] = {n: [] for n in names}
    for i, seed in enumerate(args.seeds):
        for name in rotated(names, i):
            r = one_run(CANDIDATES[name], seed, args.steps, args.timeout)
            runs[name].append(r)
            print(
                f"seed {seed} {name}: final={r['final_mean_return']:.3f} eval={r['eval_mean_return']:.3f} "
                f"wall={r['wall_seconds']:.1f}s",
                file=sys.stderr,
                flush=True,
            )
    wall = time.perf_counter() - t0
    data = {"env_id": ENV, "seeds": args.seeds, "steps": args.steps, "runs": runs}
    write_results(args.out, report(runs, args, wall), data, stem="memory_popgym")
    return 0


if __name__ == "__main__":
    sys.exit(main())
