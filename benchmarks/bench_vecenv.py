#!/usr/bin/env python
"""Vector envs side by side: env steps/s of fastvec's two doors against every peer.

    python benchmarks/bench_vecenv.py --out benchmarks/results/vecenv   # full (~15 min on 2 cores)
    python benchmarks/bench_vecenv.py --quick --out /tmp/vecenv          # seconds: CartPole x16, tiny sweep
    python benchmarks/bench_vecenv.py --only cartpole16 pong8 --repeats 7 --no-peers sb3 envpool

fastvec.AsyncVectorEnv and fastvec.SubprocVecEnv against gymnasium's SyncVectorEnv and
AsyncVectorEnv, SB3's SubprocVecEnv, the baselines one-Pipe-per-env SubprocVecEnv and
EnvPool on five workloads, interleaved in rounds (method: ``harness/vecenv.py``), plus
a scaling sweep of fastvec over num_envs x num_workers. Writes ``OUT/results.md``,
``OUT/results.json``, ``OUT/ratios.png``, ``OUT/scaling.png``, ``OUT/latency.png`` and
``OUT/worker-output.log`` (what the envs' processes printed while measuring).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import common, report  # noqa: E402
from harness.vecenv import CANDIDATES, DEFAULT_CANDIDATES, PEERS, default_workloads, run_scaling, run_vecenv_bench  # noqa: E402  # noqa: E402

WORKLOADS = ("cartpole16", "cartpole64", "halfcheetah16", "pong8", "largeobs8")
SECTIONS = WORKLOADS + ("scaling",)
QUICK_DEFAULT = ("cartpole16", "scaling")

# Sizes of the parts, full and --quick.
FULL = dict(repeats=5, scaling=dict(num_envs=(4, 8, 16, 32, 64), num_workers=(1, 2, 3, 4), repeats=3, env_steps=32000))
QUICK = dict(
    repeats=2, steps=100, warmup=10, scaling=dict(num_envs=(4, 16), num_workers=(1, 2), repeats=1, env_steps=1600)
)


def build_parser():
    p = common.Parser(prog="bench_vecenv", description=__doc__.split("\n\n")[2].replace("\n", " "))
    p.add_argument(
        "--quick",
        action="store_true",
        help="small run (seconds): CartPole 16 envs, 2 rounds of 100 steps, tiny scaling sweep",
    )
    p.add_argument("--out", default="bench-out", metavar="DIR", help="output directory (default: bench-out)")
    p.add_argument("--only", nargs="+", metavar="PART", help=f"run only these parts: {', '.join(SECTIONS)}")
    p.add_argument(
        "--repeats",
        type=common.positive,
        metavar="N",
        help="rounds (each measures every candidate once; default 5, --quick 2); "
        "also the scaling sweep's rounds when given",
    )
    p.add_argument(
        "--steps",
        type=common.positive,
        metavar="N",
        help="timed vector steps per measurement (default: per workload, 200-8000); the scaling "
        "sweep then times about 16*N env steps per point",
    )
    p.add_argument(
        "--warmup", type=common.nonneg, metavar="N", help="untimed steps before timing (default: ~10%% of steps)"
    )
    p.add_argument(
        "--no-peers",
        nargs="*",
        metavar="PEER",
        default=None,
        help=f"skip these peers ({', '.join(PEERS)}); with no names, all of them "
        "(SyncVectorEnv and fastvec always run)",
    )
    p.add_argument(
        "--fastvec-workers",
        type=common.positive,
        metavar="N",
        help="num_workers for fastvec (default: min(num_envs, cores))",
    )
    p.add_argument("--seed", type=common.nonneg, default=0, help="seed for env resets and actions (default 0)")
    p.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def plan(args) -> dict:
    """The parts to run, the peers to skip and the output folder; ``p.error`` on bad input."""
    bad = [s for s in args.only or () if s.lower() not in SECTIONS]
    if bad:
        raise ValueError(f"unknown workload {bad[0]!r} for --only (choose from {', '.join(SECTIONS)})")
    sections = (
        list(dict.fromkeys(s.lower() for s in args.only))
        if args.only
        else list(QUICK_DEFAULT if args.quick else SECTIONS)
    )
    if args.no_peers is None:
        skip = []
    elif not args.no_peers:
        skip = list(PEERS)
    else:
        skip = [s.lower() for s in args.no_peers]
        bad = [s for s in args.no_peers if s.lower() not in PEERS]
        if bad:
            raise ValueError(f"unknown peer {bad[0]!r} for --no-peers (choose from {', '.join(PEERS)})")
    out = os.path.abspath(args.out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {args.out!r} exists and is not a directory")
    return {"sections": sections, "skip_peers": skip, "out": out}


def sizes(args) -> dict:
    """repeats, steps, warmup and the scaling sweep's grid, from --quick and the flags."""
    cfg = QUICK if args.quick else FULL
    scaling = dict(cfg["scaling"])
    if args.repeats:
        scaling["repeats"] = args.repeats
    if args.steps:
        scaling["env_steps"] = 16 * args.steps
    warmup = (
        args.warmup
        if args.warmup is not None
        else (cfg.get("warmup") if args.steps is None else max(1, args.steps // 10))
    )
    return {
        "repeats": args.repeats or cfg["repeats"],
        "steps": args.steps or cfg.get("steps"),
        "warmup": warmup,
        "scaling": scaling,
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = common.parse(parser, argv)
    if args == 2:
        return 2
    try:
        the_plan = plan(args)
        os.makedirs(the_plan["out"], exist_ok=True)
    except (ValueError, OSError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    return run(args, the_plan, sizes(args), argv)


def _count(sections, cands, size) -> int:
    """Measurements the progress bar counts."""
    wl = default_workloads()
    total = sum(
        size["repeats"] * (len(cands) + len([c for c in wl[s].extra_candidates if c not in cands]))
        for s in sections
        if s in wl
    )
    if "scaling" in sections:
        sc = size["scaling"]
        total += sc["repeats"] * sum(1 + sum(1 for k in sc["num_workers"] if k <= n) for n in sc["num_envs"])
    return total


def measure_all(args, sections, cands, size, bar, notes) -> tuple[dict, bool]:
    """The workloads, then the scaling sweep; (results, whether fastvec or Sync failed)."""
    results, failed = {}, False
    wl = default_workloads()
    chosen = [wl[s] for s in sections if s in wl]
    if chosen:
        results["vecenv"] = run_vecenv_bench(
            chosen,
            cands,
            repeats=size["repeats"],
            steps=size["steps"],
            warmup=size["warmup"],
            fastvec_workers=args.fastvec_workers,
            seed=args.seed,
            progress=bar,
            notes=notes,
        )
        failed = any(
            c["errors"] for w in results["vecenv"] for c in w["candidates"] if c["candidate"] in ("sync", "fastvec")
        )
    if "scaling" in sections:
        try:
            results["scaling"] = run_scaling(seed=args.seed, progress=bar, **size["scaling"])
            for p in results["scaling"]["points"]:
                for e in p["errors"]:
                    failed = True
                    notes.append(
                        f"scaling {p['candidate']} num_envs={p['num_envs']} num_workers={p['num_workers']}: {e}"
                    )
        except Exception as exc:
            failed = True
            notes.append(f"scaling sweep failed: {type(exc).__name__}: {exc}")
    return results, failed


def run(args, the_plan, size, argv) -> int:
    sections, out = the_plan["sections"], the_plan["out"]
    cands = [c for c in DEFAULT_CANDIDATES if CANDIDATES[c].peer not in the_plan["skip_peers"]]
    notes: list[str] = []
    if the_plan["skip_peers"]:
        notes.append("peers skipped by --no-peers: " + ", ".join(the_plan["skip_peers"]))
    meta = common.machine(" ".join(["python benchmarks/bench_vecenv.py", shlex.join(argv)]).strip())
    meta.update(
        quick=bool(args.quick),
        repeats=size["repeats"],
        steps=size["steps"],
        warmup=size["warmup"],
        fastvec_workers=args.fastvec_workers,
        seed=args.seed,
        sections=sections,
        candidates=cands,
    )
    results: dict = {"meta": meta, "notes": notes}
    t_start = time.perf_counter()
    log_path = os.path.join(out, "worker-output.log")
    open(log_path, "w").close()
    interrupted = failed = False
    with common.capture_process_output(log_path) as term:
        bar = common.Progress(_count(sections, cands, size), term, not args.no_progress)
        try:
            got, failed = measure_all(args, sections, cands, size, bar, notes)
            results.update(got)
        except KeyboardInterrupt:
            interrupted = True
            notes.append("interrupted: partial results")
        finally:
            bar.close()
    meta["loadavg_end"] = common.loadavg()
    meta["wall_s"] = time.perf_counter() - t_start
    charts = []
    if not args.no_charts:
        try:
            charts = report.render_charts(results, out)
        except Exception as exc:  # charts are a nicety; the tables are the result
            notes.append(f"charts failed: {type(exc).__name__}: {exc}")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=common.json_default)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(report.render_markdown(results, charts))
    print_summary(results, out, charts)
    if interrupted:
        return 130
    return 1 if failed else 0


def print_summary(results, out, charts) -> None:
    lines = []
    rows = report.summary_rows(results)
    if rows:
        lines += report._table(
            ["workload", "candidate", "median steps/s", "median ratio vs Sync", "spread"], rows, "llrrr"
        )
    for t in report.target_rows(results):
        met = "—" if t["met"] is None else ("met" if t["met"] else "MISSED")
        lines.append(
            f"target {t['workload']}: {t['metric']} >= {t['target']:g}x: {report._ratio(t['measured'])} ({met})"
        )
    lines += [f"note: {n}" for n in results.get("notes", [])]
    lines.append(
        f"wrote {os.path.join(out, 'results.md')}, results.json" + (", " + ", ".join(charts) if charts else "")
    )
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
