#!/usr/bin/env python
"""Real loops: fastvec where users train, against the serial vector env in the same run.

    python benchmarks/bench_loops.py --out benchmarks/results/loops          # every loop (~1 h on 2 cores)
    python benchmarks/bench_loops.py --loops gap cleanrl --repeats 3 --out /tmp/loops
    python benchmarks/bench_loops.py --loops train --cases CartPole Pong --out /tmp/loops

The loops (``gap``, ``policy``, ``sb3``, ``cleanrl``, ``train``), their cases and the
method are in ``harness/loops.py``: each measurement in a fresh process, candidates
interleaved over rounds, ratios to the serial baseline of the same round. Writes
``OUT/results.md``, ``OUT/results.json``, ``OUT/loops.png`` and ``OUT/worker-output.log``.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import common, loops  # noqa: E402


def build_parser():
    p = common.Parser(prog="bench_loops", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument(
        "--loops",
        nargs="+",
        metavar="LOOP",
        default=["all"],
        help=f"loops to run: all (default) or some of {', '.join(loops.LOOPS)}",
    )
    p.add_argument(
        "--cases", nargs="+", metavar="WORD", default=[], help="only the cases whose name contains one of these words"
    )
    p.add_argument("--repeats", type=common.positive, default=3, metavar="N", help="rounds (default 3)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one measurement may take")
    p.add_argument("--out", default="bench-out/loops", metavar="DIR", help="output directory")
    p.add_argument("--no-charts", action="store_true", help="skip loops.png")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def plan(args) -> list[str]:
    """The loops to run ("all" stands for every loop); ValueError on bad input."""
    chosen = []
    for name in args.loops:
        key = name.lower()
        if key not in ("all",) + loops.LOOPS:
            raise ValueError(f"unknown loop {name!r} for --loops (choose from all, {', '.join(loops.LOOPS)})")
        chosen += list(loops.LOOPS) if key == "all" else [key]
    chosen = list(dict.fromkeys(chosen))
    if args.cases and not any(w in c["case"] for lp in chosen for c in loops.CASES[lp] for w in args.cases):
        raise ValueError(f"--cases {' '.join(args.cases)} match no case of the loops {', '.join(chosen)}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ValueError(f"--out {args.out!r} exists and is not a directory")
    return chosen


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = common.parse(parser, argv)
    if args == 2:
        return 2
    try:
        chosen = plan(args)
        os.makedirs(args.out, exist_ok=True)
    except (ValueError, OSError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    notes: list[str] = []
    meta = common.machine(" ".join(["python benchmarks/bench_loops.py", shlex.join(argv)]).strip())
    meta.update(repeats=args.repeats, loops=chosen, cases=args.cases)
    results = {"meta": meta, "notes": notes}
    t0 = time.perf_counter()
    total = args.repeats * sum(
        len(c["cands"])
        for lp in chosen
        for c in loops.CASES[lp]
        if not args.cases or any(w in c["case"] for w in args.cases)
    )
    log_path = os.path.join(args.out, "worker-output.log")
    open(log_path, "w").close()
    interrupted = False
    with common.capture_process_output(log_path) as term:
        bar = common.Progress(total, term, not args.no_progress)
        try:
            results["loops"] = loops.run_loops(
                chosen, repeats=args.repeats, progress=bar, notes=notes, timeout=args.timeout, cases=args.cases
            )
        except KeyboardInterrupt:
            interrupted = True
            notes.append("interrupted: partial results")
        finally:
            bar.close()
    meta.update(loadavg_end=common.loadavg(), wall_s=time.perf_counter() - t0)
    charts = []
    if results.get("loops") and not args.no_charts:
        try:
            if loops.render_chart(results["loops"], os.path.join(args.out, "loops.png")):
                charts.append("loops.png")
        except Exception as exc:  # the chart is a nicety; the tables are the result
            notes.append(f"chart failed: {type(exc).__name__}: {exc}")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=common.json_default)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(render(results, charts))
    print(f"wrote {os.path.join(args.out, 'results.md')}, results.json" + "".join(", " + c for c in charts))
    if interrupted:
        return 130
    failed = any(
        row["errors"]
        for case in results.get("loops", [])
        for row in case["candidates"]
        if row["candidate"] in ("sync", "dummy", "fastvec", "fastvec_sb3", "engine")
    )
    return 1 if failed else 0


def render(results: dict, charts: list) -> str:
    meta = results["meta"]
    lines = [
        "# Real loops",
        "",
        f"- Command: `{meta['command']}`",
        f"- Date: {meta['date']}; wall time {meta['wall_s']:.0f} s",
        f"- Machine: {meta['cores']} usable cores ({meta['cpu']}), {meta['platform']}",
        f"- Load average (1 min) before / after: {meta['loadavg_start']} / {meta['loadavg_end']}",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        "",
        "## Real loops: a policy (or its stand-in) between steps",
        "",
        "Each loop as a user runs it, at torch's default thread count, every candidate in a fresh "
        "process, interleaved over rounds; ratios are to the serial baseline of the same round "
        "(median and min-max over rounds). Step times are medians; higher ratios are better.",
        "",
    ]
    if "loops.png" in charts:
        lines += ["![real loops](loops.png)", ""]
    lines += loops.render_markdown(results.get("loops", [])).splitlines()
    if results["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in results["notes"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
