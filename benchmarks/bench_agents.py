#!/usr/bin/env python
"""Many agents: mpe2's simple_spread (3 agents) x 16 copies, 48 rows, random actions.

    pip install --no-deps --target /tmp/supersuit supersuit==3.11.0 tinyscaler
    python benchmarks/bench_agents.py --supersuit-path /tmp/supersuit --out benchmarks/results/agents
    python benchmarks/bench_agents.py --quick                 # seconds, no files

Candidates, each stepping the same seeded action arrays (``[steps, 48]`` ints):

* ``fastvec_gym``: ``fastvec.AgentVectorEnv`` (2 workers);
* ``fastvec_sb3``: ``fastvec.AgentVecEnv`` (2 workers);
* ``supersuit``: SuperSuit 3.11.0's ``concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(env),
  16, num_cpus=2, base_class="stable_baselines3")`` (its ProcConcatVec: 2 processes of 8
  copies, behind SB3's VecEnv API), imported from ``--supersuit-path`` (a ``pip install
  --target`` folder, so SuperSuit stays out of the project's venv);
* ``serial``: a loop over the 16 ParallelEnvs in this process (dict actions, a copy
  reset once its agents are gone).

One run: every repeat runs every candidate once, each in a fresh process, in an order
that rotates by repeat; a child resets with seed 0, steps ``--warmup`` steps untimed and
then ``--steps`` timed. Reported: rows' steps/s (agent-steps; 48 per step), medians over
the repeats with min-max, and each candidate against SuperSuit and the serial loop.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.common import Parser, machine, span, write_results  # noqa: E402
from harness.processes import child_json  # noqa: E402

CANDIDATES = ("fastvec_gym", "fastvec_sb3", "supersuit", "serial")
COPIES, AGENTS, ACTIONS = 16, 3, 5


def make_env():
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=AGENTS, max_cycles=25)


def actions_for(steps: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, ACTIONS, size=(steps, COPIES * AGENTS))


def serial_stepper():
    envs = [make_env() for _ in range(COPIES)]
    for c, env in enumerate(envs):
        env.reset(seed=c)
    names = envs[0].possible_agents

    def step(row_actions):
        for c, env in enumerate(envs):
            base = c * AGENTS
            env.step({a: int(row_actions[base + j]) for j, a in enumerate(names) if a in env.agents})
            if not env.agents:
                env.reset()

    return step, lambda: [e.close() for e in envs]


def door_stepper(name: str):
    fns = [make_env] * COPIES
    if name == "fastvec_gym":
        import fastvec

        env = fastvec.AgentVectorEnv(fns, num_workers=2)
        env.reset(seed=0)
    elif name == "fastvec_sb3":
        import fastvec

        env = fastvec.AgentVecEnv(fns, num_workers=2)
        env.seed(0)
        env.reset()
    else:
        from supersuit import concat_vec_envs_v1, pettingzoo_env_to_vec_env_v1

        env = concat_vec_envs_v1(
            pettingzoo_env_to_vec_env_v1(make_env()), COPIES, num_cpus=2, base_class="stable_baselines3"
        )
        env.venv.reset(seed=0)  # SB3's seed() reaches ProcConcatVec, which has none
    assert env.num_envs == COPIES * AGENTS, env.num_envs
    return env.step, env.close


def child(name: str, steps: int, warmup: int, seed: int) -> dict:
    actions = actions_for(warmup + steps, seed)
    step, close = serial_stepper() if name == "serial" else door_stepper(name)
    try:  # close whatever happens: SuperSuit's processes would keep the child alive
        for t in range(warmup):
            step(actions[t])
        start = time.perf_counter()
        for t in range(warmup, warmup + steps):
            step(actions[t])
        seconds = time.perf_counter() - start
    finally:
        close()
    return {"candidate": name, "steps": steps, "seconds": seconds, "rows_per_s": steps * COPIES * AGENTS / seconds}


def run_child(name: str, args) -> dict:
    env = dict(os.environ)
    if name == "supersuit":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (args.supersuit_path, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name]
    cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed)]
    return child_json(cmd, name, 600, env=env)


def agent_versions(supersuit_path: str | None) -> dict:
    """The multi-agent packages' versions (SuperSuit's from its folder, where given)."""
    import importlib.metadata as md

    out = {}
    for dist in ("pettingzoo", "mpe2", "supersuit"):
        found = list(md.distributions(name=dist, path=[supersuit_path])) if supersuit_path else []
        try:
            out[dist] = found[0].version if found else md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def markdown(result: dict) -> str:
    m, runs = result["machine"], result["runs"]

    def ratios(c: str, k: str) -> str:  # round by round, against the same round's run of k
        if k not in runs:
            return "n/a"
        return span([a["rows_per_s"] / b["rows_per_s"] for a, b in zip(runs[c], runs[k])])

    lines = [
        "# Many agents: simple_spread, 3 agents x 16 copies",
        "",
        f"`{m['command']}`; {m['cpu']}, {m['cores']} cores, {m['date']}, load {m['loadavg_start']} at the "
        f"start; {', '.join(f'{k} {v}' for k, v in result.get('versions', {}).items())}. mpe2 simple_spread_v3 "
        f"(N=3, max_cycles=25), 16 copies = 48 rows, random actions (seed {result['seed']}, the same "
        f"arrays for every candidate), {result['warmup']} untimed then {result['steps']} timed steps; "
        f"{result['repeats']} repeats, each candidate a fresh process, the order rotating by repeat. "
        "Rows' steps/s (agent-steps), median (min-max); the ratios round by round, against the "
        "same round's run.",
        "",
        "| candidate | rows' steps/s | copies' steps/s | x SuperSuit | x serial |",
        "|---|---:|---:|---:|---:|",
    ]
    for c in runs:
        rows = [r["rows_per_s"] for r in runs[c]]
        copies = [v / AGENTS for v in rows]
        vs = [ratios(c, k) for k in ("supersuit", "serial")]
        lines.append(f"| {c} | {span(rows, '{:,.0f}')} | {span(copies, '{:,.0f}')} | {vs[0]} | {vs[1]} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--child", choices=CANDIDATES, help=argparse.SUPPRESS)  # one measurement, in this process
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", nargs="+", choices=CANDIDATES, default=list(CANDIDATES))
    p.add_argument("--supersuit-path", help="a folder SuperSuit was installed into (pip install --target)")
    p.add_argument("--quick", action="store_true", help="200 steps, 1 repeat, no files")
    p.add_argument("--out", help="write results.md and results.json here")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.warmup, args.seed)))
        return 0
    if args.quick:
        args.steps, args.repeats, args.out = 200, 1, None
    command = "python benchmarks/bench_agents.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = {"machine": machine(command.strip()), "seed": args.seed, "steps": args.steps}
    result["versions"] = agent_versions(args.supersuit_path)
    result.update(warmup=args.warmup, repeats=args.repeats, runs={c: [] for c in args.only})
    for r in range(args.repeats):
        order = args.only[r % len(args.only) :] + args.only[: r % len(args.only)]
        for name in order:
            result["runs"][name].append(run_child(name, args))
            print(f"repeat {r + 1}: {name} {result['runs'][name][-1]['rows_per_s']:,.0f} rows/s", file=sys.stderr)
    write_results(args.out, markdown(result), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
