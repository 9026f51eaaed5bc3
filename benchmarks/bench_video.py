"""What ``--video-every`` costs a run: the same ``fastvec train`` with and without it.

For each seed, in turn (the arms' order rotating seed by seed, so drift in the
machine's load falls on all): the env's preset run of ``--total-steps`` env steps, once
plain and once with ``--video-every N`` for each of ``--video-settings`` (``default``:
none given, ``filming.TRAINING_FILM``'s 10-s draft clips), each in a fresh process
(``harness.cli_runs``: no progress bar, no TensorBoard). Reported per seed and arm: the
training wall time (the result's ``wall_seconds``: from before the envs start to the
last update) and process time (the command's, start-up and the end's wait for the
videos still being filmed, ``video_wait_seconds``, included), each one's overhead
``with / without - 1``, and the videos written; per arm the median overheads (min-max)
against the goal (under 5% for HalfCheetah-v5, a video every 50k steps: issue 61).

    python benchmarks/bench_video.py [--env HalfCheetah-v5] [--total-steps 1000000]
                                     [--video-every 50000] [--seeds 0 1 2]
                                     [--video-settings default width=320,height=240 ...]
                                     [--out benchmarks/results/video]

A quick check that it runs: ``--total-steps 20000 --video-every 10000 --seeds 0``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from harness.cli_runs import run_train
from harness.common import Parser, machine, parse, positive, write_results

GOAL = 0.05  # the most --video-every 50000 may add to a HalfCheetah-v5 run's wall time


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="bench_video", description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--total-steps", type=positive, default=1_000_000)
    p.add_argument("--video-every", type=positive, default=50_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--video-settings",
        nargs="+",
        default=["default"],
        help="one filmed arm each: --video-settings text, or default (none given)",
    )
    p.add_argument("--out", default=None, help="write results.md and results.json here")
    return p


def one_run(env_id: str, seed: int, total: int, every: int | None, settings: str = "default") -> dict:
    """One ``fastvec train`` (with ``--video-every every`` and ``settings`` unless
    ``every`` is None): its wall time, steps/s and the videos its run directory holds."""
    with tempfile.TemporaryDirectory(prefix="fastvec-bench-video-") as tmp:
        logdir = os.path.join(tmp, "run")
        extra = [] if every is None else ["--video-every", str(every)]
        if every is not None and settings != "default":
            extra += ["--video-settings", settings]
        t0 = time.perf_counter()
        res = run_train(env_id, seed, total_steps=total, extra_args=extra, logdir=logdir)
        process = time.perf_counter() - t0
        index = os.path.join(logdir, "videos", "videos.json")
        videos = json.load(open(index))["videos"] if os.path.exists(index) else []
    return {
        "wall_seconds": res["wall_seconds"],
        "process_seconds": process,
        "video_wait_seconds": res.get("video_wait_seconds", 0.0),
        "sps": res["sps"],
        "final_mean_return": res["final_mean_return"],
        "videos": [{k: v[k] for k in ("env_steps", "return", "length")} for v in videos],
    }


def spread(xs) -> str:
    return f"{statistics.median(xs):+.1%} ({min(xs):+.1%} to {max(xs):+.1%})"


def main(argv=None) -> int:
    args = parse(build_parser(), argv)
    if args == 2:
        return 2
    arms = ["plain", *args.video_settings]
    rows = []
    for i, seed in enumerate(args.seeds):
        order = arms[i % len(arms) :] + arms[: i % len(arms)]
        row: dict = {"seed": seed, "order": order}
        for arm in order:
            every = None if arm == "plain" else args.video_every
            row[arm] = one_run(args.env, seed, args.total_steps, every, arm)
            print(f"seed {seed} {arm}: {row[arm]['wall_seconds']:.1f} s, {len(row[arm]['videos'])} videos", flush=True)
        for arm in args.video_settings:
            for key in ("wall_seconds", "process_seconds"):
                row[arm][f"overhead_{key}"] = row[arm][key] / row["plain"][key] - 1
        rows.append(row)
    keys = ("wall_seconds", "process_seconds")
    median = {a: {k: statistics.median(r[a][f"overhead_{k}"] for r in rows) for k in keys} for a in args.video_settings}
    command = "python benchmarks/bench_video.py " + " ".join(sys.argv[1:] if argv is None else argv)
    info = machine(command)
    lines = [
        f"# `--video-every {args.video_every}` on {args.env}, {args.total_steps:,} env steps",
        "",
        f"Command: `{command}`; {info['cpu']}, {info['cores']} cores. Each run a fresh `fastvec train` "
        "process with the env's preset, no progress bar, no TensorBoard; the arms' order rotates seed by seed.",
        "",
        "| seed | video settings | training wall without / with | overhead | process without / with (end wait) "
        "| overhead | videos |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        p = r["plain"]
        for arm in args.video_settings:
            v = r[arm]
            lines.append(
                f"| {r['seed']} | {arm} | {p['wall_seconds']:.1f} / {v['wall_seconds']:.1f} s "
                f"| {v['overhead_wall_seconds']:+.1%} | {p['process_seconds']:.1f} / {v['process_seconds']:.1f} s "
                f"({v['video_wait_seconds']:.1f} s) | {v['overhead_process_seconds']:+.1%} | {len(v['videos'])} |"
            )
    lines.append("")
    for arm in args.video_settings:
        for key, what in (("wall_seconds", "training wall time"), ("process_seconds", "process time")):
            verdict = "met" if median[arm][key] < GOAL else "not met"
            xs = [r[arm][f"overhead_{key}"] for r in rows]
            lines.append(f"- {arm}: median overhead on the {what} {spread(xs)} (goal: under {GOAL:.0%}, {verdict}).")
    result = {"machine": info, "args": vars(args), "runs": rows, "median_overhead": median}
    write_results(args.out, "\n".join(lines), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
