#!/usr/bin/env python
"""Envs of uneven cost: placement by cost against contiguous runs, SyncVectorEnv and
gymnasium's AsyncVectorEnv.

    python benchmarks/bench_placement.py --rounds 5 --out benchmarks/results/placement

Env steps per second of lock-step loops, each measurement in a fresh process, the
candidates interleaved over rounds (the order rotates), medians with ranges; ratios are
taken within a round. Workloads (8 envs, 2 workers):

- ``uneven``: ``BusyEnv`` (harness/envs.py), four envs at 4x the step cost of the other
  four (1,000 and 250 us), given in the order that puts the four together;
- ``even``: eight envs at 625 us, the same total cost spread evenly: the ``ideal`` for
  ``uneven`` (every worker's share the same), and the equal-cost case, where
  ``balanced`` must change nothing;
- ``cheetah``: HalfCheetah-v5, the first four with ``frame_skip=20``, the others with
  the default 5 (one observation and action shape, uneven by a setting);
- ``mt10``, ``mt20``: Meta-World's MT10, one env per task (10 envs) and two per task (20),
  task by task as MT10 lists them (``metaworld`` pins its own MuJoCo: run these in a venv
  of their own, ``--only mt10 mt20 --out benchmarks/results/placement_mt10``).

Candidates: ``contiguous`` (fastvec's default), ``balanced`` (``placement="balanced"``:
the costs probed at start-up), ``sync`` (gymnasium's SyncVectorEnv), ``gym_async``
(gymnasium's AsyncVectorEnv, one process per env). ``--policy mlp`` acts with a 2x64 tanh
MLP in torch (its default threads) between steps, as a training loop's inference does;
``none`` sends random actions at once.
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

WORKLOADS = {
    "uneven": {"candidates": ["sync", "contiguous", "balanced"], "steps": 1500},
    "even": {"candidates": ["contiguous", "balanced"], "steps": 1500},
    "cheetah": {"candidates": ["sync", "gym_async", "contiguous", "balanced"], "steps": 3000},
    "mt10": {"candidates": ["sync", "gym_async", "contiguous", "balanced"], "steps": 800},
    "mt20": {"candidates": ["sync", "gym_async", "contiguous", "balanced"], "steps": 400},
}
NUM_ENVS, NUM_WORKERS = 8, 2
METAWORLD = ("mt10", "mt20")  # not run by default: metaworld pins its own MuJoCo


def env_fns(workload: str) -> list:
    import functools

    from harness.envs import BusyEnv, make_gym, metaworld_mt10

    if workload in ("mt10", "mt20"):
        return metaworld_mt10(per_task=2 if workload == "mt20" else 1)
    if workload == "uneven":
        return [functools.partial(BusyEnv, 1000.0)] * 4 + [functools.partial(BusyEnv, 250.0)] * 4
    if workload == "even":
        return [functools.partial(BusyEnv, 625.0)] * NUM_ENVS
    return [functools.partial(make_gym, "HalfCheetah-v5", frame_skip=20)] * 4 + [
        functools.partial(make_gym, "HalfCheetah-v5")
    ] * 4


def _policy(kind: str, env):
    import numpy as np

    space = env.single_action_space
    if kind == "none":
        return lambda obs: env.action_space.sample()
    import torch
    from torch import nn

    n_in = int(np.prod(env.single_observation_space.shape))
    n_out = int(space.n) if hasattr(space, "n") else int(np.prod(space.shape))
    net = nn.Sequential(nn.Linear(n_in, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, n_out))

    @torch.no_grad()
    def act(obs):
        out = net(torch.as_tensor(np.asarray(obs), dtype=torch.float32))
        if hasattr(space, "n"):
            return out.argmax(1).numpy()
        return torch.tanh(out).numpy()

    return act


def run_one(workload: str, candidate: str, policy: str, steps: int) -> dict:
    """One measurement in this process: env steps/s, and fastvec's placement."""
    import warnings

    from gymnasium.vector import AsyncVectorEnv as GymAsync
    from gymnasium.vector import SyncVectorEnv

    import fastvec

    fns = env_fns(workload)
    if candidate == "sync":
        env = SyncVectorEnv(fns)
    elif candidate == "gym_async":
        env = GymAsync(fns)
    else:
        env = fastvec.AsyncVectorEnv(fns, num_workers=NUM_WORKERS, copy=False, placement=candidate)
    act = _policy(policy, env)
    try:
        obs, _ = env.reset(seed=0)
        warm = steps // 10
        for _ in range(warm):
            obs = env.step(act(obs))[0]
        t0 = time.perf_counter()
        for _ in range(steps):
            obs = env.step(act(obs))[0]
        sps = steps * len(fns) / (time.perf_counter() - t0)
        placement = probe = None
        if isinstance(env, fastvec.AsyncVectorEnv):
            report = env.placement
            placement = [list(w) for w in report.workers]
            probe = None if report.probe_us is None else list(report.probe_us)
        return {"sps": sps, "placement": placement, "probe_us": probe}
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            env.close()


def main(argv=None) -> int:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", nargs="+", default=[w for w in WORKLOADS if w not in METAWORLD], choices=list(WORKLOADS))
    p.add_argument("--policies", nargs="+", default=["none", "mlp"], choices=["none", "mlp"])
    p.add_argument("--steps-scale", type=float, default=1.0)
    p.add_argument("--out", default=os.path.join(HERE, "results", "placement"))
    p.add_argument("--one", nargs=4, metavar=("WORKLOAD", "CANDIDATE", "POLICY", "STEPS"), help="(internal)")
    args = p.parse_args(argv)
    if args.one:
        w, c, pol, n = args.one
        print(json.dumps(run_one(w, c, pol, int(n))))
        return 0
    meta = machine("python benchmarks/bench_placement.py " + " ".join(sys.argv[1:] if argv is None else argv))
    runs: dict = {}
    t_start = time.time()
    for r in range(args.rounds):
        for pol in args.policies:
            jobs = [(w, c) for w in args.only for c in WORKLOADS[w]["candidates"]]
            jobs = jobs[r % len(jobs) :] + jobs[: r % len(jobs)]
            for w, c in jobs:
                steps = max(10, int(WORKLOADS[w]["steps"] * args.steps_scale))
                got = child_json([sys.executable, __file__, "--one", w, c, pol, str(steps)], f"{w}/{c}/{pol}")
                runs.setdefault(f"{pol}/{w}/{c}", []).append(got)
                print(f"round {r + 1}/{args.rounds} {pol} {w} {c}: {got['sps']:,.0f} steps/s", flush=True)
    meta["seconds"] = round(time.time() - t_start)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "placement.json"), "w") as f:
        json.dump({"meta": meta, "runs": runs}, f, indent=1)
    report = render(meta, runs, args.policies, args.only)
    with open(os.path.join(args.out, "placement.md"), "w") as f:
        f.write(report)
    print(report)
    return 0


def render(meta: dict, runs: dict, policies: list, workloads: list) -> str:
    """The table: steps/s and the per-round ratios that the goals are stated in."""

    def sps(key):
        return [x["sps"] for x in runs.get(key, [])]

    def ratio(a, b):
        return [x / y for x, y in zip(sps(a), sps(b))]

    lines = [
        "# Placement by cost: envs of uneven cost",
        "",
        f"`{meta['command']}` on {meta['cpu']}, {meta['cores']} cores, {meta['date']} ({meta['seconds']} s).",
        f"{NUM_ENVS} envs{' (mt10: 10, mt20: 20)' if set(workloads) & set(METAWORLD) else ''}, "
        f"{NUM_WORKERS} workers, lock-step; env steps/s, median (min-max) over rounds, each "
        "measurement in a fresh process, candidates interleaved; ratios within a round.",
        "",
        "| policy | workload | candidate | env steps/s | / contiguous | / sync | placement |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for pol in policies:
        for w in workloads:
            for c in WORKLOADS[w]["candidates"]:
                key = f"{pol}/{w}/{c}"
                placement = runs[key][-1]["placement"]
                lines.append(
                    f"| {pol} | {w} | {c} | {span(sps(key), '{:,.0f}')} "
                    f"| {span(ratio(key, f'{pol}/{w}/contiguous'))} "
                    f"| {span(ratio(key, f'{pol}/{w}/sync')) if f'{pol}/{w}/sync' in runs else ''} "
                    f"| {'' if placement is None else placement} |"
                )
    if "uneven" in workloads and "even" in workloads:
        lines += ["", "Goals (uneven): balanced / contiguous >= 1.5x; balanced / ideal (`even`, contiguous) >= 0.9x."]
        for pol in policies:
            lines.append(
                f"- {pol}: balanced / contiguous {span(ratio(f'{pol}/uneven/balanced', f'{pol}/uneven/contiguous'))}; "
                f"balanced / ideal {span(ratio(f'{pol}/uneven/balanced', f'{pol}/even/contiguous'))}; "
                f"even: balanced / contiguous {span(ratio(f'{pol}/even/balanced', f'{pol}/even/contiguous'))}"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
