#!/usr/bin/env python
"""Candidate presets for a task, judged as users judge them: every seed trained in a fresh
``fastvec train`` process, then ``fastvec eval`` (deterministic episodes, as RL Zoo's
benchmark) of its last checkpoint.

    python benchmarks/bench_presets.py Hopper-v5 --steps 1000000 --seeds 1 2 3 \\
        --candidate cleanrl: --candidate long_horizon:gamma=0.999,gae_lambda=0.99 \\
        --out benchmarks/results/presets

A candidate is ``name:key=value,key=value`` (``--set`` pairs over the env's preset; an
empty list: the preset as it is). Seeds run in turn, the candidates' order alternating
by seed. Reported per candidate: wall time, the training return at the end (the last 20
episodes, sampled actions) and the deterministic evaluation's mean, as the median over
seeds with the range, and the **worst seed's** evaluation (what the next user may get).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from harness.common import span

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_candidate(text: str) -> tuple[str, list[str]]:
    name, sep, pairs = text.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"a candidate is name:key=value,... (got {text!r})")
    sets = [p for p in pairs.split(",") if p]
    bad = [p for p in sets if "=" not in p]
    if bad:
        raise argparse.ArgumentTypeError(f"candidate {name}: expected key=value, got {bad[0]!r}")
    return name, sets


def _fastvec(args: list[str], cwd: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "fastvec", *args], capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        raise SystemExit(f"fastvec {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(env_id: str, steps: int, seed: int, sets: list[str], episodes: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        train = [env_id, "--total-steps", str(steps), "--seed", str(seed), "--logdir", run_dir]
        train += ["--no-progress", "--no-tensorboard", "--checkpoint-every", "0"]
        for s in sets:
            train += ["--set", s]
        trained = _fastvec(["train", *train], tmp)
        ev = _fastvec(["eval", run_dir, "--episodes", str(episodes)], tmp)
    return {
        "wall_seconds": trained["wall_seconds"],
        "env_steps": trained["env_steps"],
        "train_return": trained["final_mean_return"],
        "eval_mean": ev["mean_return"],
        "eval_std": ev["std_return"],
    }


def report(env_id: str, steps: int, episodes: int, by: dict, command: str, took: float) -> str:
    seeds = sorted(next(iter(by.values())))
    lines = [
        f"# Candidate presets: {env_id}, {steps:,} env steps, {len(seeds)} seeds ({took:.0f} s)",
        "",
        f"`python benchmarks/bench_presets.py {command}` on {platform.platform()}, {os.cpu_count()} cores. "
        f"Each seed a fresh `fastvec train`, then `fastvec eval` of its checkpoint ({episodes} deterministic "
        "episodes). Medians over seeds (min-max); worst: the lowest seed's evaluation.",
        "",
        "| candidate | --set | wall s | training return | eval mean | eval, worst seed |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, runs in by.items():
        rs = [runs[s] for s in seeds]
        sets = " ".join(f"`{s}`" for s in rs[0]["sets"]) or "(the preset)"
        lines.append(
            f"| {name} | {sets} | {span([r['wall_seconds'] for r in rs], '{:.1f}')} "
            f"| {span([r['train_return'] for r in rs], '{:.1f}')} | {span([r['eval_mean'] for r in rs], '{:.1f}')} "
            f"| {min(r['eval_mean'] for r in rs):.1f} |"
        )
    lines += ["", "Per seed (wall s, training return, eval mean +- std):", ""]
    for s in seeds:
        cells = "; ".join(
            f"{n} {by[n][s]['wall_seconds']:.0f} s, {by[n][s]['train_return']:.0f}, "
            f"{by[n][s]['eval_mean']:.0f} +- {by[n][s]['eval_std']:.0f}"
            for n in by
        )
        lines.append(f"- seed {s}: {cells}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("env_id")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--candidate", type=parse_candidate, action="append", required=True)
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--out", default=None, help="folder for <env>.md and <env>.json")
    args = p.parse_args(argv)
    names = [n for n, _ in args.candidate]
    if len(set(names)) != len(names):
        p.error(f"candidate names must differ: {names}")
    if args.steps < 1 or args.episodes < 1:
        p.error("--steps and --episodes must be positive")
    t0 = time.time()
    by: dict = {n: {} for n in names}
    for r, seed in enumerate(args.seeds):
        order = args.candidate if r % 2 == 0 else args.candidate[::-1]
        for name, sets in order:
            res = run(args.env_id, args.steps, seed, sets, args.episodes)
            by[name][seed] = {**res, "sets": sets}
            print(f"{name} seed {seed}: {res}", flush=True)
    command = " ".join(argv if argv is not None else sys.argv[1:])
    md = report(args.env_id, args.steps, args.episodes, by, command, time.time() - t0)
    print(md, end="")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, args.env_id.replace("/", "_"))
        open(stem + ".md", "w").write(md)
        json.dump(
            {"env_id": args.env_id, "steps": args.steps, "runs": by, "command": command},
            open(stem + ".json", "w"),
            indent=1,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
