#!/usr/bin/env python
"""``fastvec train`` with the async pipeline (``--set pipeline=async``) against lock-step.

    python benchmarks/bench_pipeline.py --only halfcheetah cartpole invpendulum --out benchmarks/results/pipeline
    python benchmarks/bench_pipeline.py --only halfcheetah_1m --out benchmarks/results/pipeline

For each workload and seed both candidates train in fresh ``fastvec train`` processes
with the env's preset, on the same envs, workers and seed (the order alternates by
seed). Reported per candidate: wall time, final mean return, the policy lag, the
learner's busy fraction and each side's share of time waiting for the other; for the
time-to-solve workloads, the wall time to the preset's solve threshold.

**The ceiling**: on C cores the async pipeline can at best spread the lock-step run's
total CPU time (the trainer's and its workers', from the kernel's accounting of the
finished process tree) over the C cores. ``wall_seconds`` counts from before the envs
start; before that the process imports on one core (``process wall - wall_seconds``
seconds, counted as one busy core), so the run's own CPU time is ``CPU - (process wall -
wall_seconds)`` and the ceiling that over C. It is reported beside every figure.
Curves of mean return against env steps of every run go to ``<workload>.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time

from harness.cli_runs import return_rows, run_train
from harness.common import span as _span
from harness.processes import children_cpu_seconds

HERE = os.path.dirname(os.path.abspath(__file__))
# name: env id, env steps (the cap, for a time-to-solve race), time to solve?, seeds
WORKLOADS = {
    "halfcheetah": ("HalfCheetah-v5", 300_000, False, [1, 2, 3]),
    "cartpole": ("CartPole-v1", 500_000, True, [1, 2, 3, 4, 5]),
    "invpendulum": ("InvertedPendulum-v5", 1_000_000, True, [1, 2, 3]),
    "halfcheetah_1m": ("HalfCheetah-v5", 1_000_000, False, [1, 2, 3]),
    # the question settled with intervals: does async learn as well per env step?
    "halfcheetah_seeds": ("HalfCheetah-v5", 300_000, False, [1, 2, 3, 4, 5, 6, 7, 8]),
}
CANDIDATES = {"lockstep": ["pipeline=lockstep"], "async": ["pipeline=async"]}


def run(env_id: str, steps: int, seed: int, sets: list[str], solve: bool, keep: str | None = None) -> dict:
    """One fresh ``fastvec train``: its result, the CPU time and wall time of its process
    tree, and its curve of mean return against env steps. ``keep``: the run directory
    to leave behind (for ``fastvec report``), else a temporary one."""
    from fastvec.train import solve_threshold

    stop = ["--stop-at-return", str(solve_threshold(env_id))] if solve else []
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = keep or os.path.join(tmp, "run")
        cpu0, t0 = children_cpu_seconds(), time.perf_counter()
        res = run_train(
            env_id,
            seed,
            total_steps=steps,
            sets=sets,
            extra_args=stop,
            logdir=run_dir,
            checkpoint_every=0,
            timeout=7200,
        )
        res["process_wall_seconds"] = round(time.perf_counter() - t0, 2)
        res["cpu_seconds"] = round(children_cpu_seconds() - cpu0, 2)
        res["curve"] = [(r["env_steps"], r["charts/mean_return"]) for r in return_rows(run_dir)]
    return res


def _run_cpu(res: dict) -> float:
    """CPU seconds of the run proper: the process tree's, less its start-up on one core."""
    return res["cpu_seconds"] - (res["process_wall_seconds"] - res["wall_seconds"])


def _plot(path: str, title: str, by: dict, seeds: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, seed in enumerate(seeds):
        for cand, style in (("lockstep", "-"), ("async", "--")):
            curve = by[cand][seed]["curve"]
            if curve:
                xs, ys = zip(*curve, strict=True)
                ax.plot(xs, ys, style, color=colors[i % len(colors)], label=f"{cand} seed {seed}", lw=1.2)
    ax.set_xlabel("env steps")
    ax.set_ylabel("mean return (last 20 episodes)")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", default=["halfcheetah", "cartpole", "invpendulum"], choices=list(WORKLOADS))
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="instead of each workload's own")
    p.add_argument("--set", action="append", default=[], help="extra --set for both candidates")
    p.add_argument("--out", default=os.path.join(HERE, "results", "pipeline"))
    p.add_argument("--from-json", nargs="+", default=[], help="rewrite the reports of these saved runs, run nothing")
    p.add_argument(
        "--keep-runs",
        default=None,
        help="keep each run's directory under DIR/<workload>/<candidate>-seed<S> and compare the candidates "
        "with `fastvec report` (IQM, intervals, P(async > lock-step)) into OUT/<workload>_report/",
    )
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cores = os.cpu_count() or 1
    for path in args.from_json:
        d = json.load(open(path))
        w = d["workload"]
        by = {c: {int(k): v for k, v in runs.items()} for c, runs in d["runs"].items()}
        seeds = sorted(by["lockstep"])
        _plot(os.path.join(args.out, f"{w}.png"), f"{d['env_id']}: lock-step (solid) and async (dashed)", by, seeds)
        args.command = d["command"]
        _report(args, w, d["env_id"], d["steps"], WORKLOADS[w][2], seeds, by, d["cores"], d["took"])
    if args.from_json:
        return
    for w in args.only:
        env_id, steps, solve, seeds = WORKLOADS[w]
        seeds = args.seeds or seeds
        t_start = time.time()
        by: dict = {c: {} for c in CANDIDATES}
        for r, seed in enumerate(seeds):
            order = list(CANDIDATES) if r % 2 == 0 else list(CANDIDATES)[::-1]
            for c in order:
                keep = None if args.keep_runs is None else os.path.join(args.keep_runs, w, f"{c}-seed{seed}")
                res = run(env_id, steps, seed, args.set + CANDIDATES[c], solve, keep)
                by[c][seed] = res
                ps = res.get("pipeline_stats") or {}
                print(
                    f"{w} seed {seed} {c}: {res['wall_seconds']:.1f} s, cpu {res['cpu_seconds']:.1f} s, "
                    f"steps {res['env_steps']}, solved {res['solved']}, return {res['final_mean_return']}, "
                    f"lag {ps.get('policy_lag_mean')}",
                    flush=True,
                )
        json.dump(
            {
                "workload": w,
                "env_id": env_id,
                "steps": steps,
                "runs": by,
                "machine": platform.platform(),
                "cores": cores,
                "took": time.time() - t_start,
                "command": " ".join(sys.argv[1:]),
            },
            open(os.path.join(args.out, f"{w}.json"), "w"),
            indent=1,
        )
        _plot(os.path.join(args.out, f"{w}.png"), f"{env_id}: lock-step (solid) and async (dashed)", by, seeds)
        _report(args, w, env_id, steps, solve, seeds, by, cores, time.time() - t_start)
        if args.keep_runs is not None:
            _compare(os.path.join(args.keep_runs, w), os.path.join(args.out, f"{w}_report"))


def _compare(runs: str, out: str) -> None:
    """``fastvec report`` over the kept runs: lock-step against async, as a user runs it."""
    import subprocess

    groups = [f"{c}={os.path.join(runs, c)}-seed*" for c in CANDIDATES]
    subprocess.run([sys.executable, "-m", "fastvec", "report", *groups, "--out", out], check=True)


def _async_settings(env_id: str, command: str) -> str:
    """The async candidate's pipeline keys as its runs had them: a ``--set`` in the
    command, else the env's preset, else the config's default."""
    from fastvec.train import PPOConfig, preset_for

    words = shlex.split(command)
    given = dict(v.split("=", 1) for k, v in zip(words, words[1:]) if k == "--set" and "=" in v)
    preset = preset_for(env_id)
    cells = []
    for key in ("max_policy_lag", "rollout_buffers", "targets"):
        if key in given:
            cells.append(f"`{key}={given[key]}` (--set)")
        elif key in preset:
            cells.append(f"`{key}={preset[key]}` (the preset's)")
        else:
            cells.append(f"`{key}={getattr(PPOConfig, key)}`")
    return ", ".join(cells)


def _report(args, w, env_id, steps, solve, seeds, by, cores, took) -> None:
    lock = by["lockstep"]
    command = getattr(args, "command", " ".join(sys.argv[1:]))
    ceiling = {s: _run_cpu(lock[s]) / cores for s in seeds}
    what = "time to solve (the preset's threshold)" if solve else f"{steps:,} env steps"
    lines = [
        f"# fastvec train: async pipeline against lock-step, {env_id}, {what} ({len(seeds)} seeds, {took:.0f} s)",
        "",
        f"`python benchmarks/bench_pipeline.py {command}` on "
        f"{platform.platform()}, {cores} cores, "
        "CPU learner. Each run a fresh `fastvec train` process with the env's preset (same envs, workers and seed "
        f"for both; async: `--set pipeline=async`, with {_async_settings(env_id, command)}), the "
        "order alternating by seed. Medians over seeds (min-max). Speed-up: lock-step's wall time / async's, per "
        f"seed. Ceiling: lock-step's CPU seconds during the run (the process tree's, less the start-up on one "
        f"core) / {cores} cores: the best any pipeline could do with the same work.",
        "",
        "| candidate | wall s | CPU s | final return | solved | policy lag mean | learner busy | collector waits | learner waits | speed-up |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in CANDIDATES:
        rs = [by[c][s] for s in seeds]
        speed = [lock[s]["wall_seconds"] / by[c][s]["wall_seconds"] for s in seeds]
        ps = [x.get("pipeline_stats") or {} for x in rs]
        lines.append(
            f"| {c} | {_span([x['wall_seconds'] for x in rs], '{:.1f}')} | {_span([x['cpu_seconds'] for x in rs], '{:.1f}')} "
            f"| {_span([x['final_mean_return'] for x in rs], '{:.1f}')} | {sum(x['solved'] for x in rs)}/{len(rs)} "
            f"| {_span([q.get('policy_lag_mean') for q in ps])} | {_span([q.get('learner_busy_fraction') for q in ps])} "
            f"| {_span([q.get('collector_wait_share') for q in ps])} | {_span([q.get('learner_wait_share') for q in ps])} "
            f"| {_span(speed)}x |"
        )
    best = [lock[s]["wall_seconds"] / ceiling[s] for s in seeds]
    lines.append(f"| ceiling | {_span(list(ceiling.values()), '{:.1f}')} | | | | | | | | {_span(best)}x |")
    lines += ["", "Per seed (wall s, final return):", ""]
    for s in seeds:
        cells = ", ".join(f"{c} {by[c][s]['wall_seconds']:.1f} s / {by[c][s]['final_mean_return']}" for c in CANDIDATES)
        lines.append(f"- seed {s}: {cells}, ceiling {ceiling[s]:.1f} s")
    lines += ["", f"Curves: `{w}.png` (mean return against env steps, every run)."]
    open(os.path.join(args.out, f"{w}.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
