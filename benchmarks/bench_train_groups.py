#!/usr/bin/env python
"""``fastvec train`` with batch groups (``--set env_groups=2``) against lock-step.

    python benchmarks/bench_train_groups.py --seeds 0 1 2 --out benchmarks/results/train_groups

For each workload and seed, both candidates train in fresh processes on the same envs,
workers and seed (the order alternates by seed); the ratio is lock-step's wall time over
the groups run's of the same seed. Reported per candidate: wall time, the trainer's
split (acting, waiting for the envs, learning), the device's busy fraction and the
final mean return (the learning must not change: with the same seed the two runs see
the same actions up to floating-point rounding).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

from harness.cli_runs import run_train
from harness.common import span as _span
from harness.common import write_results

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = {  # env id, env steps, extra --set
    "halfcheetah": ("HalfCheetah-v5", 100_000, []),
    "pong": ("ALE/Pong-v5", 16_384, []),
}
CANDIDATES = {"lockstep": ["env_groups=1"], "groups": ["env_groups=2"]}


def run(env_id: str, steps: int, seed: int, sets: list[str]) -> dict:
    return run_train(env_id, seed, total_steps=steps, sets=sets, checkpoint_every=0, timeout=3600)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--only", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--steps-scale", type=float, default=1.0)
    p.add_argument("--out", default=os.path.join(HERE, "results", "train_groups"))
    args = p.parse_args()
    t_start = time.time()
    runs: dict = {}
    for r, seed in enumerate(args.seeds):
        for w in args.only:
            env_id, steps, extra = WORKLOADS[w]
            order = list(CANDIDATES) if r % 2 == 0 else list(CANDIDATES)[::-1]
            for c in order:
                res = run(env_id, int(steps * args.steps_scale), seed, extra + CANDIDATES[c])
                runs.setdefault(w, {}).setdefault(c, {})[seed] = res
                tb = res["time_breakdown"]
                print(
                    f"seed {seed} {w} {c}: {res['wall_seconds']:.1f} s, act {tb['act']:.1f} env {tb['env']:.1f} "
                    f"learn {tb['learn'] + tb['prepare']:.1f}, busy {res['device_busy_fraction']}, "
                    f"return {res['final_mean_return']}",
                    flush=True,
                )
    lines = [
        f"# fastvec train: batch groups against lock-step ({len(args.seeds)} seeds, {time.time() - t_start:.0f} s)",
        "",
        f"`python benchmarks/bench_train_groups.py {' '.join(sys.argv[1:])}` on {platform.platform()}, "
        f"{os.cpu_count()} cores, CPU learner. Each run a fresh `fastvec train` process with the env's preset "
        "(same envs, workers and seed for both candidates; groups: `--set env_groups=2`). Medians over seeds "
        "(min-max); speed-up: lock-step's wall time / the groups run's, per seed.",
        "",
        "| workload | candidate | wall s | act s | env s | learn s | device busy | final return per seed | speed-up |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for w, by in runs.items():
        for c in CANDIDATES:
            rs = [by[c][s] for s in args.seeds]
            speed = [by["lockstep"][s]["wall_seconds"] / by[c][s]["wall_seconds"] for s in args.seeds]
            rets = ", ".join("n/a" if x["final_mean_return"] is None else f"{x['final_mean_return']:.1f}" for x in rs)
            lines.append(
                f"| {w} | {c} | {_span([x['wall_seconds'] for x in rs], '{:.1f}')} "
                f"| {_span([x['time_breakdown']['act'] for x in rs], '{:.1f}')} "
                f"| {_span([x['time_breakdown']['env'] for x in rs], '{:.1f}')} "
                f"| {_span([x['time_breakdown']['learn'] + x['time_breakdown']['prepare'] for x in rs], '{:.1f}')} "
                f"| {_span([x['device_busy_fraction'] for x in rs])} | {rets} | {_span(speed)}x |"
            )
    data = {"runs": runs, "machine": platform.platform(), "cores": os.cpu_count()}
    write_results(args.out, "\n".join(lines) + "\n", data, stem="train_groups")


if __name__ == "__main__":
    main()
