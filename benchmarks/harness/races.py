"""What the races to a return against a peer share (``bench_masks.py``,
``bench_dict_obs.py``): a fastvec run to the threshold with the best mean return it
reached, a peer's run in a child process of the script, and the report's table."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from .cli_runs import return_rows, run_train
from .common import span
from .processes import child_env, last_json


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
