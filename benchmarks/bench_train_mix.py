#!/usr/bin/env python
"""``fastvec train`` on a mix of envs: placed by cost (the default for ``--mix``)
against env order.

    python benchmarks/bench_train_mix.py --rounds 3 --out benchmarks/results/train_mix

The workload: HalfCheetah-v5's preset (8 envs, 2 workers), the first four envs with
``frame_skip=20`` (4x the physics per step), the others with the default 5:
``fastvec train HalfCheetah-v5 --mix frame_skip=20 --mix frame_skip=5``. Candidates:
``balanced`` (the default for a mix) and ``contiguous`` (``--set
placement=contiguous``: the costly four on one worker). Round r trains both with seed r
in fresh processes, in alternating order; a placement moves envs, not what they do, so
both runs of a round learn the same weights and must end on the same return (checked).
Reported: wall time, the trainer's time waiting for the envs, the mean training return
at the first logging point and at the end (that it learns), the placement's measured
balance (mean over max of the workers' shares), and contiguous's wall time over
balanced's per round.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness.cli_runs import return_rows, run_train  # noqa: E402
from harness.common import Parser, machine, span, write_results  # noqa: E402

ENV_ID = "HalfCheetah-v5"
MIX = ["frame_skip=20", "frame_skip=5"]
CANDIDATES = {"balanced": [], "contiguous": ["--set", "placement=contiguous"]}


def run(candidate: str, seed: int, steps: int) -> dict:
    """One fresh ``fastvec train``: its result and the first logged mean return."""
    mix = [flag for g in MIX for flag in ("--mix", g)]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        extra = [*mix, *CANDIDATES[candidate]]
        res = run_train(
            ENV_ID, seed, total_steps=steps, extra_args=extra, logdir=run_dir, checkpoint_every=0, timeout=3600
        )
        first = next(iter(return_rows(run_dir)), None)
    res["first_return"] = None if first is None else (first["env_steps"], first["charts/mean_return"])
    return res


def main(argv=None) -> int:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=200_000)
    p.add_argument("--out", default=os.path.join(HERE, "results", "train_mix"))
    args = p.parse_args(argv)
    meta = machine("python benchmarks/bench_train_mix.py " + " ".join(sys.argv[1:] if argv is None else argv))
    runs: dict = {c: [] for c in CANDIDATES}
    t_start = time.time()
    for r in range(args.rounds):
        order = list(CANDIDATES) if r % 2 == 0 else list(CANDIDATES)[::-1]
        for c in order:
            res = run(c, r, args.steps)
            runs[c].append(res)
            print(
                f"round {r + 1}/{args.rounds} {c}: {res['wall_seconds']:.1f} s, env {res['time_breakdown']['env']:.1f} s, "
                f"return {res['first_return']} -> {res['final_mean_return']}, placement {res['placement']['workers']}",
                flush=True,
            )
        a, b = runs["balanced"][-1], runs["contiguous"][-1]
        if (a["final_mean_return"], a["episodes"]) != (b["final_mean_return"], b["episodes"]):
            raise SystemExit(
                f"seed {r}: the placements learned differently: {a['final_mean_return']} vs {b['final_mean_return']}"
            )
    meta["seconds"] = round(time.time() - t_start)
    write_results(args.out, render(meta, runs, args.steps), {"meta": meta, "runs": runs}, stem="train_mix")
    return 0


def render(meta: dict, runs: dict, steps: int) -> str:
    mix = " ".join(f"--mix {g}" for g in MIX)
    lines = [
        "# fastvec train on a mix of envs: placed by cost against env order",
        "",
        f"`{meta['command']}` on {meta['cpu']}, {meta['cores']} cores, {meta['date']} ({meta['seconds']} s).",
        f"`fastvec train {ENV_ID} {mix} --total-steps {steps:,}` (the preset: 8 envs, 2 workers, CPU learner), "
        "round r with seed r, each run a fresh process, candidates alternating; median (min-max) over rounds.",
        "",
        "| candidate | wall s | env wait s | first logged return | final return | balance | placement | "
        "contiguous wall / this |",
        "|---|---:|---:|---|---|---:|---|---:|",
    ]
    for c, rs in runs.items():
        speed = [x["wall_seconds"] / y["wall_seconds"] for x, y in zip(runs["contiguous"], rs)]
        firsts = ", ".join(
            "n/a" if x["first_return"] is None else "{1:.0f} at {0:,}".format(*x["first_return"]) for x in rs
        )
        finals = ", ".join("n/a" if x["final_mean_return"] is None else f"{x['final_mean_return']:.0f}" for x in rs)
        lines.append(
            f"| {c} | {span([x['wall_seconds'] for x in rs], '{:.1f}')} "
            f"| {span([x['time_breakdown']['env'] for x in rs], '{:.1f}')} | {firsts} | {finals} "
            f"| {span([x['placement']['balance'] for x in rs])} | {rs[-1]['placement']['workers']} | {span(speed)}x |"
        )
    lines += [
        "",
        "Goal: the mix learns (final return above the first logged one) and trains faster placed by cost "
        "than in env order; both placements learn the same (equal final returns per seed, checked).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
