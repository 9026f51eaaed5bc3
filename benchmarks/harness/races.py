"""What the races to a return against a peer share (``bench_masks.py``,
``bench_dict_obs.py``): their flags, the seeds run in rotating order, a fastvec run to
the threshold with the best mean return it reached, a peer's run in a child process of
the script, and the report's header and table."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from .cli_runs import return_rows, run_train
from .common import Parser, cpu_model, rotated, span
from .processes import child_env, last_json


def race_parser(description: str, threshold: float, max_steps: int, fastvec_set: list[str]) -> Parser:
    """The flags every race takes, with the race's defaults."""
    ap = Parser(description=description)
    ap.add_argument("--out", default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--threshold", type=float, default=threshold)
    ap.add_argument("--max-steps", type=int, default=max_steps, help="env steps at most, per run")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument(
        "--fastvec-set",
        nargs="*",
        default=fastvec_set,
        metavar="KEY=VALUE",
        help="the fastvec runs' --set settings (none: the trainer's defaults)",
    )
    return ap


def race(candidates, args, one_run) -> tuple[dict, float]:
    """Every candidate on every seed (``one_run(name, seed, args)``, the order rotating
    by seed): the runs by candidate, and the seconds it all took."""
    t0 = time.perf_counter()
    runs: dict[str, list] = {n: [] for n in candidates}
    for i, seed in enumerate(args.seeds):
        for name in rotated(list(candidates), i):
            r = one_run(name, seed, args)
            runs[name].append(r)
            print(f"seed {seed} {name}: {r}", file=sys.stderr, flush=True)
    return runs, time.perf_counter() - t0


def race_header(title: str, args, wall: float) -> list[str]:
    """The report's title and how it was measured (command, machine, date, method)."""
    return [
        f"# {title} to a mean return of {args.threshold:g} ({wall / 60:.0f} min)",
        "",
        f"`{args.command}`; {cpu_model()}, {os.cpu_count()} cores, {platform.system()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Each run a fresh process, the order "
        f"rotating by seed; at most {args.max_steps:,} env steps. Medians, min-max in brackets, over "
        "the seeds that reached the threshold.",
        "",
    ]


def fastvec_run(env_id: str, seed: int, args, extra: list[str]) -> dict:
    """``fastvec train env_id`` to ``args.threshold`` (at most ``args.max_steps``, with
    ``args.fastvec_set``): solved, env steps, wall seconds, the final mean return and the
    best mean of 20 episodes it logged (at its logging points and at its end)."""
    extra = [*extra, "--stop-at-return", str(args.threshold)]
    sets = [s for s in args.fastvec_set if s]
    with tempfile.TemporaryDirectory(prefix="bench-race-") as tmp:
        logdir = os.path.join(tmp, "run")
        r = run_train(
            env_id, seed, total_steps=args.max_steps, sets=sets, extra_args=extra, logdir=logdir, timeout=args.timeout
        )
        means = [row["charts/mean_return"] for row in return_rows(logdir) if row.get("charts/episodes", 0) >= 20]
    if r["final_mean_return"] is not None and r.get("final_return_episodes", 0) >= 20:
        means.append(r["final_mean_return"])
    out = {k: r[k] for k in ("solved", "env_steps", "wall_seconds", "final_mean_return")}
    return {**out, "best_mean_return": max(means) if means else None}


def child_run(script: str, name: str, seed: int, job: dict, timeout: float) -> dict:
    """``script --_child JOB`` in a fresh process: the JSON line it prints last."""
    cmd = [sys.executable, os.path.abspath(script), "--_child", json.dumps(job)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env())
    res = last_json(proc.stdout)
    if proc.returncode != 0 or res is None:
        raise SystemExit(f"{name} seed {seed}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return res


def race_table(runs: dict, ref: str, fmt: str = "{:.2f}") -> tuple[list[str], str]:
    """The table's rows (a header, then a candidate per row: seeds that reached the
    threshold, time and steps to it, final and best mean returns, time over ``ref``'s),
    and the highest level every run of every candidate reached (``n/a`` where a run
    logged none)."""
    base = [r["wall_seconds"] for r in runs[ref] if r["solved"]]
    lines = [
        "| candidate | reached | time to it, s | env steps to it | final mean return | best mean return "
        f"| time / {ref} |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, rs in runs.items():
        ok = [r for r in rs if r["solved"]]
        t = [r["wall_seconds"] for r in ok]
        ratio = f"{statistics.median(t) / statistics.median(base):.2f}x" if t and base else "-"
        lines.append(
            f"| {name} | {len(ok)} of {len(rs)} | {span(t, '{:.1f}')} | "
            f"{span([r['env_steps'] for r in ok], '{:,.0f}')} | {span([r['final_mean_return'] for r in rs], fmt)} "
            f"| {span([r.get('best_mean_return') for r in rs], fmt)} | {ratio} |"
        )
    bests = [min(b) for rs in runs.values() if (b := [r.get("best_mean_return") for r in rs]) and None not in b]
    level = fmt.format(min(bests)) if len(bests) == len(runs) else "n/a"
    return lines, level
