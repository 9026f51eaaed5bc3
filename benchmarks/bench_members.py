#!/usr/bin/env python
"""Members (``fastvec train --seeds K [--sweep ...]``) against the same runs one by one.

    python benchmarks/bench_members.py cartpole --rounds 3 --out benchmarks/results/members
    python benchmarks/bench_members.py halfcheetah --steps 300000 --out benchmarks/results/members
    python benchmarks/bench_members.py sweep --steps 300000 --out benchmarks/results/members
    python benchmarks/bench_members.py pbt --steps 300000 --out benchmarks/results/members

Each workload runs, in fresh ``fastvec train`` processes as a user runs them, one
population (all its members in one process) and the same runs alone one after another
(``--seed S`` and, in a sweep, ``--set KEY=V``), the candidates' order alternating by
round. Reported: the process wall time (start-up included) of the population and of the
runs alone in sequence, and for CartPole one run alone's; each member's and each run's
final mean return; where the population's time went (acting, envs, targets, learning).

- ``cartpole``: 8 seeds to a mean return of 475 each (``--stop-at-return 475``).
- ``halfcheetah``: 8 seeds of the HalfCheetah-v5 preset, ``--steps`` env steps each.
- ``pbt``: HalfCheetah-v5, 8 members with ``--pbt`` (an exploit every tenth of the
  steps) against 8 independent members, the same seeds; their final returns.
- ``sweep``: HalfCheetah-v5, ``lr`` 1e-4, 3e-4, 1e-3 times 4 seeds; the population's
  ``report.md`` (IQM and intervals per setting) and the same report over the runs alone
  (``fastvec report``), and whether the two rank the settings alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from harness.cli_runs import FASTVEC, run_fastvec, train_command
from harness.common import machine, rotated, span, write_results

WORKLOADS = ("cartpole", "halfcheetah", "sweep", "pbt")


def _timed(args: list[str]) -> tuple[dict, float]:
    t0 = time.perf_counter()
    out = run_fastvec(args)
    return out, time.perf_counter() - t0


def _population(env_id, seeds: int, steps, extra, d: str) -> dict:
    cmd = train_command(env_id, 1, total_steps=steps, extra_args=["--seeds", str(seeds), *extra], logdir=d)
    out, wall = _timed(cmd[len(FASTVEC) :])
    return {
        "process_wall": wall,
        "wall_seconds": out["wall_seconds"],
        "time_breakdown": out["time_breakdown"],
        "returns": [r["final_mean_return"] for r in out["results"]],
        "labels": out["labels"],
        "solved": [r["solved"] for r in out["results"]],
        "learned_at_once": out["learned_at_once"],
    }


def _alone(env_id, seeds, steps, extra, d: str, settings=((),)) -> dict:
    runs, wall = [], 0.0
    for sets in settings:
        for s in seeds:
            name = ",".join([*sets, f"seed-{s}"])
            cmd = train_command(env_id, s, total_steps=steps, sets=sets, extra_args=extra, logdir=os.path.join(d, name))
            out, w = _timed(cmd[len(FASTVEC) :])
            wall += w
            runs.append(
                {
                    "label": name,
                    "process_wall": w,
                    "return": out["final_mean_return"],
                    "solved": out["solved"],
                    "time_breakdown": out["time_breakdown"],
                }
            )
    return {"process_wall": wall, "runs": runs}


def run_pbt_round(args, i: int, tmp: str) -> dict:
    out = {}
    for cand in rotated(["independent", "pbt"], i):
        extra = ["--pbt"] if cand == "pbt" else []
        out[cand] = _population("HalfCheetah-v5", args.seeds, args.steps, extra, os.path.join(tmp, f"r{i}-{cand}"))
    return out


def run_round(args, i: int, tmp: str) -> dict:
    env_id = "CartPole-v1" if args.workload == "cartpole" else "HalfCheetah-v5"
    extra = ["--stop-at-return", "475"] if args.workload == "cartpole" else []
    steps = None if args.workload == "cartpole" else args.steps
    seeds = list(range(1, 1 + args.seeds))
    sweep = args.workload == "sweep"
    settings = [(f"lr={v}",) for v in args.lrs] if sweep else [()]
    pop_extra = [*extra, "--sweep", "lr=" + ",".join(args.lrs)] if sweep else extra
    out = {}
    for cand in rotated(["population", "alone"], i):
        d = os.path.join(tmp, f"r{i}-{cand}")
        if cand == "population":
            out[cand] = _population(env_id, args.seeds, steps, pop_extra, d)
        else:
            out[cand] = _alone(env_id, seeds, steps, extra, d, settings)
            if args.workload == "cartpole":  # one run alone, for the "2x one run" goal
                out["one"] = {"process_wall": out[cand]["runs"][0]["process_wall"]}
        if sweep:
            out[cand]["report"] = _report(d, cand, args.lrs)
            if cand == "population" and args.out and i == 0:  # its report's plot, for docs/benchmarks.md
                os.makedirs(args.out, exist_ok=True)
                shutil.copy(os.path.join(d, "report.png"), os.path.join(args.out, "sweep.png"))
    return out


def _report(d: str, cand: str, lrs) -> dict:
    """The settings compared by ``fastvec report``, over the population's members or the runs alone."""
    # (a member's directory names its setting as the config prints it, a run alone's as given)
    groups = [
        f"lr:{v}=" + os.path.join(d, f"lr={_g(v)},seed-*" if cand == "population" else f"lr={v},seed-*") for v in lrs
    ]
    with tempfile.TemporaryDirectory() as out_dir:
        p = subprocess.run([*FASTVEC, "report", *groups, "--out", out_dir], capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(f"fastvec report: {p.stderr.strip()}")
        with open(os.path.join(out_dir, "report.json")) as f:
            rep = json.load(f)
    return {name: {"iqm": g["iqm"], "mean": g["mean"], "scores": g["scores"]} for name, g in rep["groups"].items()}


def _g(v: str) -> str:
    return f"{float(v):g}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("workload", choices=WORKLOADS)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--seeds", type=int, default=None, help="members (default: 8; 4 per setting in a sweep)")
    p.add_argument("--steps", type=int, default=300_000)
    p.add_argument("--lrs", nargs="+", default=["1e-4", "3e-4", "1e-3"])
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.seeds = args.seeds or (4 if args.workload == "sweep" else 8)
    command = "python benchmarks/bench_members.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    info = machine(command)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="fastvec-members-") as tmp:
        for i in range(args.rounds):
            rounds.append((run_pbt_round if args.workload == "pbt" else run_round)(args, i, tmp))
            print(json.dumps({"round": i, **{k: v["process_wall"] for k, v in rounds[-1].items()}}), flush=True)
    text = _pbt_markdown(args, info, rounds) if args.workload == "pbt" else _markdown(args, info, rounds)
    write_results(args.out, text, {"machine": info, "rounds": rounds}, args.workload)
    return 0


def _pbt_markdown(args, info, rounds) -> str:
    from fastvec import run_stats

    lines = [
        f"# Members: PBT against independent seeds, {args.seeds} members, HalfCheetah-v5, {args.steps:,} steps",
        "",
        f"`{info['command']}`; {info['cpu']}, {info['cores']} cores; {len(rounds)} round(s).",
        "",
        "| | process wall s | final mean returns | IQM [95% CI] |",
        "|---|---|---|---|",
    ]
    for cand in ("independent", "pbt"):
        pops = [r[cand] for r in rounds]
        scores = [x for p in pops for x in p["returns"]]
        agg = run_stats.aggregate(scores)["iqm"]
        lines.append(
            f"| {cand} | {span([p['process_wall'] for p in pops], '{:.1f}')} | {span(scores, '{:.0f}')} | {agg.point:.0f} [{agg.low:.0f}, {agg.high:.0f}] |"
        )
    both = [[x for r in rounds for x in r[c]["returns"]] for c in ("pbt", "independent")]
    p = run_stats.probability_of_improvement(*both)
    lines += ["", f"P(a PBT member beats an independent one): {p.point:.2f} [{p.low:.2f}, {p.high:.2f}]."]
    return "\n".join(lines)


def _markdown(args, info, rounds) -> str:
    pop, alone = [r["population"] for r in rounds], [r["alone"] for r in rounds]
    ratio = [p["process_wall"] / a["process_wall"] for p, a in zip(pop, alone)]
    lines = [
        f"# Members: {args.workload}, {args.seeds} seeds"
        + (f" x lr {', '.join(args.lrs)}" if args.workload == "sweep" else ""),
        "",
        f"`{info['command']}`; {info['cpu']}, {info['cores']} cores; {len(rounds)} round(s), medians (min-max).",
        "",
        "| | process wall s | final mean returns |",
        "|---|---|---|",
        f"| one population (`--seeds`) | {span([p['process_wall'] for p in pop], '{:.1f}')} | {span([x for p in pop for x in p['returns']], '{:.0f}')} |",
        f"| the runs alone, one after another | {span([a['process_wall'] for a in alone], '{:.1f}')} | {span([x['return'] for a in alone for x in a['runs']], '{:.0f}')} |",
    ]
    if "one" in rounds[0]:
        one = [r["one"]["process_wall"] for r in rounds]
        lines.append(f"| one run alone | {span(one, '{:.1f}')} | |")
        lines += ["", f"Population / one run alone: {span([p['process_wall'] / o for p, o in zip(pop, one)])}x."]
    lines += [
        "",
        f"Population / runs alone in sequence: {span(ratio)}x. Members learned at once: {pop[0]['learned_at_once']}.",
        "",
        "Where the population's time went (s, summed over members; env: the shared wait): "
        + ", ".join(
            f"{k} {span([p['time_breakdown'][k] for p in pop], '{:.1f}')}" for k in ("act", "env", "prepare", "learn")
        ),
        "Where the runs alone's went (s, summed over runs): "
        + ", ".join(
            f"{k} {span([sum(x['time_breakdown'][k] for x in a['runs']) for a in alone], '{:.1f}')}"
            for k in ("act", "env", "prepare", "learn")
        ),
    ]
    if args.workload == "sweep":
        lines += ["", "| setting | population IQM [95% CI] | runs alone IQM [95% CI] |", "|---|---|---|"]
        rp, ra = pop[0]["report"], alone[0]["report"]
        for name in rp:
            fmt = lambda g: f"{g['iqm'][0]:.0f} [{g['iqm'][1]:.0f}, {g['iqm'][2]:.0f}]"  # noqa: E731
            lines.append(f"| {name} | {fmt(rp[name])} | {fmt(ra[name])} |")
        rank = lambda rep: sorted(rep, key=lambda n: -rep[n]["iqm"][0])  # noqa: E731
        lines += [
            "",
            f"Ranking by IQM: population {' > '.join(rank(rp))}; runs alone {' > '.join(rank(ra))} "
            f"({'the same' if rank(rp) == rank(ra) else 'different'}).",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
