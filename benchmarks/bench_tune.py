#!/usr/bin/env python
"""Does ``fastvec tune`` pick a good layout? Its pick against a grid over workers and
batch modes, timed longer and apart from the tuner.

    python benchmarks/bench_tune.py --rounds 3 --out benchmarks/results/tune

For each workload (CartPole-v1 x64, HalfCheetah-v5 x16, Pong x8) and policy stand-in
(``--policy-us``: 0 and 1,000 us of busy CPU between a step's return and the next
actions, as ``fastvec tune --policy-us`` times it):

1. ``fastvec.tune.tune`` runs as the command does (1 s per candidate) and picks;
2. every layout of the grid (1 to ``2 x cores`` workers; lock-step, two batch groups,
   ready batches of half the envs where they fit) is timed ``--seconds`` each, in a
   fresh process, interleaved over ``--rounds`` with the order rotating.

The table gives each layout's median steps/s, and the goal's ratios: the pick over the
grid's best and over the default (lock-step over ``min(envs, cores)`` workers), both
per round, median (min-max).
"""

from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness.common import Parser, machine, span  # noqa: E402
from harness.processes import child_json  # noqa: E402

WORKLOADS = {"cartpole64": ("CartPole-v1", 64), "halfcheetah16": ("HalfCheetah-v5", 16), "pong8": ("pong", 8)}


def env_fns(workload: str) -> list:
    import functools

    from harness.envs import make_gym, make_pong

    env_id, n = WORKLOADS[workload]
    return [make_pong if env_id == "pong" else functools.partial(make_gym, env_id)] * n


def grid(num_envs: int, cores: int) -> list:
    from fastvec.engine import batch_fits
    from fastvec.tune import Layout

    out = []
    for w in range(1, min(num_envs, 2 * cores) + 1):
        out.append(Layout(w))
        half = num_envs // 2
        for mode in ("groups", "ready"):
            if num_envs % 2 == 0 and batch_fits(w, num_envs, half, mode) and w >= 2:
                out.append(Layout(w, mode, half))
    return out


def _key(layout) -> str:
    return f"{layout.num_workers}/{layout.batch_mode}/{layout.batch_size}/{layout.placement}"


def _layout(key: str):
    from fastvec.tune import Layout

    w, mode, size, placement = key.split("/")
    return Layout(int(w), None if mode == "None" else mode, None if size == "None" else int(size), placement)


def main(argv=None) -> int:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0, help="timing of each grid layout (default 3)")
    p.add_argument("--only", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--policy-us", nargs="+", type=float, default=[0.0, 1000.0])
    p.add_argument("--out", default=os.path.join(HERE, "results", "tune"))
    p.add_argument("--one", nargs=4, metavar=("WORKLOAD", "LAYOUT", "POLICY_US", "SECONDS"), help="(internal)")
    p.add_argument("--pick", nargs=2, metavar=("WORKLOAD", "POLICY_US"), help="(internal)")
    args = p.parse_args(argv)
    from fastvec.options import available_cores
    from fastvec.tune import measure, tune

    if args.one:
        w, key, pol, sec = args.one
        sps, _, _ = measure(env_fns(w), _layout(key), float(pol), float(sec))
        print(json.dumps({"sps": sps}))
        return 0
    if args.pick:
        w, pol = args.pick
        result = tune(env_fns(w), float(pol), 1.0)
        print(
            json.dumps({"chosen": _key(result.chosen), "runner_up": _key(result.runner_up), "seconds": result.seconds})
        )
        return 0
    meta = machine("python benchmarks/bench_tune.py " + " ".join(sys.argv[1:] if argv is None else argv))
    t_start = time.time()
    picks: dict = {}
    for w in args.only:
        for pol in args.policy_us:
            out = _run([sys.executable, __file__, "--pick", w, str(pol)])
            picks[f"{w}/{pol:g}"] = out
            print(f"{w} policy {pol:g} us: the tuner picks {out['chosen']} in {out['seconds']:.1f} s", flush=True)
    sps: dict = {}
    cores = available_cores()
    for r in range(args.rounds):
        for w in args.only:
            for pol in args.policy_us:
                cands = grid(WORKLOADS[w][1], cores)
                picked = _layout(picks[f"{w}/{pol:g}"]["chosen"])
                if picked not in cands:  # a balanced placement, say: timed beside the grid
                    cands.append(picked)
                cands = cands[r % len(cands) :] + cands[: r % len(cands)]
                for layout in cands:
                    got = _run([sys.executable, __file__, "--one", w, _key(layout), str(pol), str(args.seconds)])
                    sps.setdefault(f"{w}/{pol:g}", {}).setdefault(_key(layout), []).append(got["sps"])
                    print(f"round {r + 1} {w} {pol:g} us {layout}: {got['sps']:,.0f}", flush=True)
    meta["seconds"] = round(time.time() - t_start)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tune.json"), "w") as f:
        json.dump({"meta": meta, "picks": picks, "sps": sps}, f, indent=1)
    report = render(meta, picks, sps, args.rounds)
    with open(os.path.join(args.out, "tune.md"), "w") as f:
        f.write(report)
    print(report)
    return 0


def _run(cmd: list) -> dict:
    return child_json(cmd, " ".join(cmd[2:]))


def render(meta: dict, picks: dict, sps: dict, rounds: int) -> str:
    import statistics

    lines = [
        "# fastvec tune: its pick against a grid of layouts",
        "",
        f"`{meta['command']}` on {meta['cpu']}, {meta['cores']} cores, {meta['date']} ({meta['seconds']} s).",
        "Env steps/s with a policy stand-in of busy CPU between steps; each grid layout timed in a fresh process, "
        f"{rounds} rounds interleaved; ratios per round, median (min-max).",
        "",
        "| workload | policy us | tuner's pick (runner-up) | pick / grid's best | pick / default | grid, median env steps/s |",
        "|---|---:|---|---:|---:|---|",
    ]
    for case, by in sps.items():
        w, pol = case.split("/")
        pick = picks[case]["chosen"]
        default = _key(_default(w, meta["cores"]))
        best_per_round = [max(v[r] for v in by.values()) for r in range(rounds)]
        pick_vals = by.get(pick)
        vs_best = [a / b for a, b in zip(pick_vals, best_per_round)] if pick_vals else []
        vs_default = [a / b for a, b in zip(pick_vals, by[default])] if pick_vals else []
        cells = ", ".join(
            f"{_layout(k)}: {statistics.median(v):,.0f}"
            for k, v in sorted(by.items(), key=lambda kv: -statistics.median(kv[1]))
        )
        lines.append(
            f"| {w} | {pol} | {_layout(pick)} ({_layout(picks[case]['runner_up'])}) | {span(vs_best)} "
            f"| {span(vs_default)} | {cells} |"
        )
    lines += ["", "Goal: pick / grid's best >= 0.9x and pick / default >= 1.0x (within noise) in every case."]
    return "\n".join(lines) + "\n"


def _default(workload: str, cores: int):
    from fastvec.tune import Layout

    return Layout(min(WORKLOADS[workload][1], cores))


if __name__ == "__main__":
    sys.exit(main())
