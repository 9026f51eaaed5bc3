#!/usr/bin/env python
"""Two builds of fastvec side by side, interleaved: does a change keep every figure?

    git worktree add /tmp/before <rev> && (cd /tmp/before && python setup.py build_ext --inplace)
    python setup.py build_ext --inplace
    python benchmarks/ab_builds.py --before /tmp/before --after . --rounds 5 --out /tmp/ab \
        --loops gap cleanrl train --cases "HalfCheetah-v5 x8" "CartPole-v1"

One harness measures both builds: this folder's scripts (``bench_vecenv.py``,
``harness/loops.py``, ``bench_train.py``), run in fresh processes whose ``PYTHONPATH``
starts with the build's source tree, so they import that build's fastvec and nothing
else of it (the harness uses only fastvec's public doors and long-standing internals,
so an old build is measured exactly like a new one). Each round runs, for each build in
turn (the order alternates from round to round):

- ``bench_vecenv.py --only <workloads> --repeats 1 --no-peers``: env steps/s of both front
  doors against SyncVectorEnv, each in its own measurement;
- ``bench_train.py --only transports --seeds 1 --transport-kinds sync,fastvec``:
  ``fastvec train`` on the engine against the same trainer on SyncVectorEnv (wall time
  to solve, steps/s), on ``--train-envs``;
- with ``--loops gap cleanrl ...``: the real loops (``harness/loops.py``), fastvec's
  default candidate against the loop's serial baseline, each in a fresh process
  (``--cases`` keeps the cases whose name contains one of the given words).

Every figure is a ratio against SyncVectorEnv measured in the same process run, so a
round compares the two builds on the same machine state; the table gives the median
over rounds and its range for each build, and the after/before ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import loops  # noqa: E402
from harness.common import write_results  # noqa: E402
from harness.processes import child_env  # noqa: E402

WORKLOADS = ("cartpole16", "cartpole64", "halfcheetah16", "pong8", "largeobs8")


def _run(cmd, build: str, timeout: float) -> subprocess.CompletedProcess:
    # cwd outside both trees: nothing there shadows the build on the path
    env = child_env(build)
    return subprocess.run(cmd, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=timeout)


def vecenv_round(build: str, workloads, out: str, timeout: float) -> dict:
    """{(workload, candidate): ratio vs SyncVectorEnv} of one ``bench_vecenv.py`` run."""
    proc = _run(
        [
            sys.executable,
            os.path.join(HERE, "bench_vecenv.py"),
            "--only",
            *workloads,
            "--repeats",
            "1",
            "--no-peers",
            "--no-charts",
            "--no-progress",
            "--out",
            out,
        ],
        build,
        timeout,
    )
    path = os.path.join(out, "results.json")
    if proc.returncode not in (0, 1) or not os.path.exists(path):
        raise RuntimeError(f"bench_vecenv.py failed on {build}: {proc.stderr[-2000:]}")
    with open(path) as f:
        res = json.load(f)
    # the build measured is the one asked for (nothing earlier on the path shadowed it)
    if not res["meta"]["fastvec_path"].startswith(os.path.join(os.path.abspath(build), "")):
        raise RuntimeError(f"bench_vecenv.py measured {res['meta']['fastvec_path']}, not {build}")
    return {
        (w["workload"], c["candidate"]): c["ratios"][0]
        for w in res["vecenv"]
        for c in w["candidates"]
        if c["candidate"] != "sync" and c.get("ratios")
    }


def train_round(build: str, out: str, envs, timeout: float) -> dict:
    """{(env, "train wall"|"train sps"): fastvec engine / SyncVectorEnv} of one transports
    run (wall: time to solve, lower is better, reported as sync/fastvec so higher is better)."""
    proc = _run(
        [
            sys.executable,
            os.path.join(HERE, "bench_train.py"),
            "--only",
            "transports",
            "--seeds",
            "1",
            "--transport-kinds",
            "sync,fastvec",
            "--transport-envs",
            ",".join(envs),
            "--out",
            out,
        ],
        build,
        timeout,
    )
    path = os.path.join(out, "train.json")
    if proc.returncode != 0 or not os.path.exists(path):
        raise RuntimeError(f"bench_train.py failed on {build}: {proc.stderr[-2000:]}")
    ratios = {}
    with open(path) as f:
        res = json.load(f)
    if not res["machine"]["fastvec_path"].startswith(os.path.join(os.path.abspath(build), "")):
        raise RuntimeError(f"bench_train.py measured {res['machine']['fastvec_path']}, not {build}")
    sections = res["transports"]
    for section in sections:
        s = section["summary"]
        fv, sync = s["fastvec"], s["sync"]
        if fv["median_wall_seconds"] and sync["median_wall_seconds"]:
            ratios[(section["env_id"], "train wall")] = sync["median_wall_seconds"] / fv["median_wall_seconds"]
            ratios[(section["env_id"], "train sps")] = fv["median_sps"] / sync["median_sps"]
    return ratios


def loops_round(build: str, chosen, cases, timeout: float) -> dict:
    """{(case, figure): fastvec / serial baseline} of one pass over the real loops."""
    cand = {"sb3": "fastvec_sb3", "train": "engine"}
    ratios = {}
    for loop, case in loops.selected(chosen, cases):
        got = []
        for c in (loops.BASELINE[loop], cand.get(loop, "fastvec")):
            res = loops.run_child(loops.spec_for(loop, case, c), timeout, fastvec_root=os.path.abspath(build))
            if "error" in res:
                raise RuntimeError(f"loop {case['case']} / {c} failed on {build}: {res['error']}")
            if not res["fastvec_path"].startswith(os.path.join(os.path.abspath(build), "")):
                raise RuntimeError(f"loop {case['case']} measured {res['fastvec_path']}, not {build}")
            got.append(loops._metric(loop, res))
        base, fast = got
        for figure in base:
            ratios[(case["case"], figure)] = fast[figure] / base[figure]
    return ratios


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="source tree of the first build (built in place)")
    p.add_argument("--after", required=True, help="source tree of the second build (built in place)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--only",
        nargs="+",
        default=list(WORKLOADS),
        choices=WORKLOADS,
        help="bench_vecenv.py workloads (default: all five)",
    )
    p.add_argument("--no-train", action="store_true", help="skip the trainer benchmark")
    p.add_argument(
        "--train-envs",
        nargs="+",
        default=["CartPole-v1", "InvertedPendulum-v5"],
        choices=("CartPole-v1", "InvertedPendulum-v5"),
        help="envs of the trainer benchmark",
    )
    p.add_argument("--no-vecenv", action="store_true", help="skip the vector-env workloads")
    p.add_argument("--loops", nargs="+", default=[], choices=loops.LOOPS, help="real loops (harness/loops.py)")
    p.add_argument("--cases", nargs="+", default=[], help="only the loop cases whose name contains one of these")
    p.add_argument("--out", required=True, help="directory for ab.json and ab.md")
    p.add_argument("--timeout", type=float, default=1800.0)
    return p


def one_round(args, build: str, work: str) -> dict:
    """Every figure of one build in one round: {(workload, candidate): ratio}."""
    got = {} if args.no_vecenv else vecenv_round(build, args.only, work, args.timeout)
    if args.loops:
        got.update(loops_round(build, args.loops, args.cases, args.timeout))
    if not args.no_train:
        got.update(train_round(build, work + "-train", args.train_envs, args.timeout))
    return got


def measure(args) -> dict:
    """(workload, candidate) -> {build: [ratio per round]}, the builds' order alternating
    from round to round."""
    builds = {"before": args.before, "after": args.after}
    rows: dict = {}
    work = tempfile.mkdtemp(prefix="fastvec-ab-")
    for r in range(args.rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for name in order:
            got = one_round(args, builds[name], os.path.join(work, f"{name}{r}"))
            for key, ratio in got.items():
                rows.setdefault(key, {"before": [], "after": []})[name].append(ratio)
            print(
                f"round {r + 1}/{args.rounds} {name}: " + ", ".join(f"{k[0]}/{k[1]} {v:.2f}x" for k, v in got.items()),
                flush=True,
            )
    return rows


def summarize(args, rows: dict, wall: float) -> tuple[list[dict], list[str]]:
    """The rows of ab.json and the lines of ab.md: medians over rounds and their ranges."""
    lines = [
        f"# Before/after, interleaved ({args.rounds} rounds, {wall:.0f} s)",
        "",
        f"`{' '.join(sys.argv)}`; before: `{args.before}`, after: `{args.after}`. Each figure is a ratio "
        "against SyncVectorEnv in the same run (higher is better; train wall: sync's time to solve "
        "over fastvec's; a real loop's: against its serial baseline, a step time's as its inverse); "
        "median over rounds, min-max in brackets.",
        "",
        "| workload | candidate | before | after | after / before |",
        "|---|---|---:|---:|---:|",
    ]
    table = []
    for (w, c), by in rows.items():
        b, a = statistics.median(by["before"]), statistics.median(by["after"])
        table.append(
            {
                "workload": w,
                "candidate": c,
                "before": by["before"],
                "after": by["after"],
                "before_median": b,
                "after_median": a,
                "after_over_before": a / b,
            }
        )
        lines.append(
            f"| {w} | {c} | {b:.2f}x ({min(by['before']):.2f}-{max(by['before']):.2f}) | "
            f"{a:.2f}x ({min(by['after']):.2f}-{max(by['after']):.2f}) | {a / b:.3f} |"
        )
    return table, lines


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.cases and not loops.selected(args.loops, args.cases):
        names = [c["case"] for loop in args.loops for c in loops.CASES[loop]]
        p.error(f"--cases {args.cases} match no case of the loops {args.loops}: {names}")
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    rows = measure(args)
    table, lines = summarize(args, rows, time.time() - t0)
    data = {"argv": sys.argv, "rounds": args.rounds, "rows": table}
    write_results(args.out, "\n".join(lines) + "\n", data, stem="ab")
    return 0


if __name__ == "__main__":
    sys.exit(main())
