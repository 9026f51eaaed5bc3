#!/usr/bin/env python
"""One shared policy learns mpe2's simple_spread: the training return against random play
and a published figure.

    python benchmarks/bench_agents_train.py --out benchmarks/results/agents_train
    python benchmarks/bench_agents_train.py --quick           # 1 seed, 50k steps, no files

Each seed is ``fastvec train pettingzoo:mpe2.simple_spread_v3`` (its preset: 3 agents x
16 copies = 48 rows) in a fresh process, for ``--steps`` agent steps, once per candidate
(the preset; the preset with an LSTM core; the preset with ``pipeline=async``, policy lag
1), the candidates' order rotating from seed to seed; its
``metrics.jsonl`` gives the curve (the mean over the last 100 agent episodes at each
logging point). Random play: uniform actions on the same env, ``--random-episodes``
episodes. The returns are per agent per episode (25 steps), PettingZoo's defaults
(N=3, local_ratio 0.5).

The published figure beside it (see the benchmarks page for the conversion): MARLlib's
IPPO with one shared policy (a GRU) on PettingZoo's simple_spread_v2, 4 seeds, its
result files ``results/mpe_cooperative/simple_spread/ppo_gru_simple_spread/
shared_policy_curve_file_*.csv`` (Replicable-MARL/MARLlib, 2022): -33.67 at 1M steps and
-33.35 at 20M per agent, on an env version whose reward counted each agent's collision
with itself (-0.5 a step, fixed in PettingZoo 1.22.4): -21.2 and -20.85 in v3's terms.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.cli_runs import return_rows, run_train  # noqa: E402
from harness.common import Parser, machine, rotated, span, write_results  # noqa: E402

ENV = "pettingzoo:mpe2.simple_spread_v3"
PUBLISHED = {"source": "MARLlib IPPO, shared GRU policy (simple_spread_v2 + 12.5)", "1M": -21.2, "20M": -20.85}
MARKS = (100_000, 250_000, 500_000, 1_000_000)
CANDIDATES = {
    "preset": [],
    "preset + LSTM": ["--set", "policy_core=lstm", "--set", "bptt=16"],
    "preset, async": ["--set", "pipeline=async"],
}


def random_play(episodes: int, seed: int) -> list[float]:
    from mpe2 import simple_spread_v3

    env, rng, returns = simple_spread_v3.parallel_env(), np.random.default_rng(seed), []
    for ep in range(episodes):
        env.reset(seed=seed + ep)
        total = dict.fromkeys(env.agents, 0.0)
        while env.agents:
            _obs, rewards, *_ = env.step({a: int(rng.integers(5)) for a in env.agents})
            for a, r in rewards.items():
                total[a] += r
        returns.extend(total.values())
    return returns


def train_seed(seed: int, steps: int, extra: list[str]) -> dict:
    """One seed's run in a fresh process (``extra``: the candidate's flags): its result and its curve."""
    with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "run")
        result = run_train(ENV, seed, total_steps=steps, extra_args=extra, logdir=run)
        curve = [(r["env_steps"], r["charts/mean_return"]) for r in return_rows(run)]
    return {"seed": seed, "result": result, "curve": curve}


def at(curve, steps: int):
    """The curve's last point at or before ``steps`` (None before its first)."""
    points = [ret for s, ret in curve if s <= steps]
    return points[-1] if points else None


def markdown(res: dict) -> str:
    m, runs, rnd = res["machine"], res["runs"], res["random"]
    lines = [
        f"# One shared policy on simple_spread ({m['date']})",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores. Command: `{m['command']}`. Per agent per episode",
        f"(25 steps), {res['seeds']} seeds, {res['steps']:,} agent steps each; medians (min-max).",
        "",
        "| agent steps | "
        + " | ".join(f"fastvec train ({name})" for name in runs)
        + " | random play | published (MARLlib IPPO, v3 terms) |",
        "|---|" + "---|" * (len(runs) + 2),
    ]
    for mark in [k for k in MARKS if k <= res["steps"]] + ([res["steps"]] if res["steps"] not in MARKS else []):
        cells = []
        for rs in runs.values():
            vals = [v for v in (at(r["curve"], mark) for r in rs) if v is not None]
            cells.append(span(vals) if vals else "n/a")
        pub = PUBLISHED["1M"] if mark == 1_000_000 else ""
        lines.append(f"| {mark:,} | {' | '.join(cells)} | {np.mean(rnd):.2f} | {pub} |")
    lines += [
        "",
        f"Random play: {np.mean(rnd):.2f} (std {np.std(rnd):.2f}, {len(rnd)} agent episodes). Published at 20M",
        f"steps: {PUBLISHED['20M']}.",
        "",
        "| candidate | wall time per run, s | agent steps/s |",
        "|---|---|---|",
    ]
    for name, rs in runs.items():
        wall = [r["result"]["wall_seconds"] for r in rs]
        sps = [r["result"]["sps"] for r in rs]
        lines.append(f"| {name} | {span(wall, '{:.1f}')} | {span(sps, '{:,.0f}')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--random-episodes", type=int, default=300)
    p.add_argument("--quick", action="store_true", help="1 seed, 50k steps, no files")
    p.add_argument("--candidates", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES))
    p.add_argument("--out", help="write results.md and results.json here")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.random_episodes, args.out = 50_000, 1, 20, None
    command = "python benchmarks/bench_agents_train.py " + " ".join(argv if argv is not None else sys.argv[1:])
    res = {"machine": machine(command.strip()), "steps": args.steps, "seeds": args.seeds, "published": PUBLISHED}
    res["random"] = random_play(args.random_episodes, 0)
    names = args.candidates
    res["runs"] = {name: [] for name in names}
    for seed in range(1, args.seeds + 1):
        for name in rotated(names, seed - 1):
            run = train_seed(seed, args.steps, CANDIDATES[name])
            res["runs"][name].append(run)
            print(f"seed {seed} {name}: {run['result']['final_mean_return']:.2f}", file=sys.stderr)
    write_results(args.out, markdown(res), res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
