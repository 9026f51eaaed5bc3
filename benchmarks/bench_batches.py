#!/usr/bin/env python
"""Batches (``batch_size``, groups and ready modes) against lock-step and SyncVectorEnv.

    python benchmarks/bench_batches.py --rounds 5 --out benchmarks/results/batches

Env steps per second of loops a user runs, each candidate in a fresh process, the
candidates interleaved over rounds (the order rotates), medians with ranges:

- ``sync``: gymnasium's SyncVectorEnv over ``--sync-envs`` envs, lock-step;
- ``lockstep``: fastvec.AsyncVectorEnv over ``--envs`` envs, lock-step ``step``;
- ``groups``: the same envs with ``batch_size = envs / 2``: ``recv`` one batch, act,
  ``send``, so one batch steps while the caller acts on the other;
- ``ready``: the same with ``batch_mode="ready"``: each ``recv`` returns the first
  workers done (the default workers: one per core here, so a batch is one worker's envs).

``--policy none`` sends random actions at once (the envs' own speed); ``--policy cnn``
runs the Nature-CNN of Atari PPO (torch, its default threads) on each batch's
observations before acting, as a training loop's inference does. Workloads: Pong
(AtariPreprocessing, 4 stacked frames) and HalfCheetah-v5 (``--policy cnn`` is for
Pong; HalfCheetah takes ``--policy mlp``, a 2x64 tanh MLP).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness.processes import child_json  # noqa: E402

WORKLOADS = {
    "pong": {"envs": 16, "sync_envs": 8, "steps": 3000},
    "halfcheetah": {"envs": 32, "sync_envs": 32, "steps": 20000},
}


def _policy(kind, obs_space, act_space):
    """A function batch-of-observations -> batch of actions."""
    import numpy as np

    if kind == "none":
        rng = np.random.default_rng(0)
        if hasattr(act_space, "n"):
            return lambda obs: rng.integers(0, act_space.n, len(obs))
        return lambda obs: rng.uniform(-1, 1, (len(obs),) + act_space.shape).astype(np.float32)
    import torch
    from torch import nn

    if kind == "cnn":
        c = obs_space.shape[0]
        net = nn.Sequential(
            nn.Conv2d(c, 32, 8, 4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, 2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(3136, 512),
            nn.ReLU(),
            nn.Linear(512, act_space.n),
        )
    else:
        n = int(np.prod(obs_space.shape))
        net = nn.Sequential(
            nn.Linear(n, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, int(np.prod(act_space.shape)))
        )

    @torch.no_grad()
    def act(obs):
        x = torch.as_tensor(np.asarray(obs), dtype=torch.float32)
        if kind == "cnn":
            x = x / 255.0
        out = net(x)
        if kind == "cnn":
            return torch.distributions.Categorical(logits=out).sample().numpy()
        return torch.tanh(out).numpy()

    return act


def run_one(workload, candidate, policy, steps):
    """One measurement in this process: env steps per second."""
    from gymnasium.vector import SyncVectorEnv

    import fastvec

    cfg = WORKLOADS[workload]
    from harness.envs import workload_envs

    fn = workload_envs(workload)
    if candidate == "sync":
        env = SyncVectorEnv([fn] * cfg["sync_envs"])
    elif candidate == "lockstep":
        env = fastvec.AsyncVectorEnv([fn] * cfg["envs"], copy=False)
    else:
        env = fastvec.AsyncVectorEnv([fn] * cfg["envs"], batch_size=cfg["envs"] // 2, copy=False, batch_mode=candidate)
    act = _policy(policy, env.single_observation_space, env.single_action_space)
    warm = steps // 10
    try:
        if candidate in ("groups", "ready"):
            env.async_reset(seed=0)
            done = 0
            t0 = None
            while done < steps + warm:
                obs, *_rest, infos = env.recv()
                env.send(act(obs))
                done += len(obs)
                if t0 is None and done >= warm:
                    t0, start = time.perf_counter(), done
        else:
            obs, _ = env.reset(seed=0)
            done = 0
            t0 = None
            while done < steps + warm:
                obs = env.step(act(obs))[0]
                done += len(obs)
                if t0 is None and done >= warm:
                    t0, start = time.perf_counter(), done
        elapsed = time.perf_counter() - t0
        return (done - start) / elapsed
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # batches: the last ones sent are still in flight
            env.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument(
        "--policies",
        nargs="+",
        default=["none", "net"],
        help="none: random actions; net: the workload's network (cnn for Pong, mlp for HalfCheetah)",
    )
    p.add_argument("--steps-scale", type=float, default=1.0)
    p.add_argument("--out", default=os.path.join(HERE, "results", "batches"))
    p.add_argument("--one", nargs=4, metavar=("WORKLOAD", "CANDIDATE", "POLICY", "STEPS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        w, c, pol, n = args.one
        print(json.dumps({"sps": run_one(w, c, pol, int(n))}))
        return
    os.makedirs(args.out, exist_ok=True)
    cands = ["sync", "lockstep", "groups", "ready"]
    results: dict = {}
    t_start = time.time()
    for r in range(args.rounds):
        for w in args.only:
            for pol_name in args.policies:
                pol = pol_name if pol_name == "none" else ("cnn" if w == "pong" else "mlp")
                steps = int(WORKLOADS[w]["steps"] * args.steps_scale)
                order = cands[r % len(cands) :] + cands[: r % len(cands)]
                for c in order:
                    cmd = [sys.executable, __file__, "--one", w, c, pol, str(steps)]
                    sps = child_json(cmd, f"{w}/{c}/{pol}")["sps"]
                    results.setdefault((w, pol), {}).setdefault(c, []).append(sps)
                    print(f"round {r + 1}/{args.rounds} {w} {pol} {c}: {sps:,.0f} steps/s", flush=True)
    rows = []
    for (w, pol), by in results.items():
        sync = by["sync"]
        for c in cands:
            ratios = [v / s for v, s in zip(by[c], sync)]
            rows.append({"workload": w, "policy": pol, "candidate": c, "sps": by[c], "ratios": ratios})
    json.dump(
        {"rows": rows, "machine": platform.platform(), "cores": os.cpu_count()},
        open(os.path.join(args.out, "batches.json"), "w"),
        indent=1,
    )
    lines = [
        f"# Batches (groups and ready modes) against lock-step and SyncVectorEnv ({args.rounds} rounds, "
        f"{time.time() - t_start:.0f} s)",
        "",
        f"`python benchmarks/bench_batches.py {' '.join(sys.argv[1:])}` on {platform.platform()}, "
        f"{os.cpu_count()} cores. Env steps/s, median over rounds (min-max); the ratio is to SyncVectorEnv "
        "measured in the same round (Pong: SyncVectorEnv over 8 envs, fastvec over 16; HalfCheetah: 32 "
        "and 32). Each measurement in a fresh process.",
        "",
        "| workload | policy | candidate | env steps/s | / SyncVectorEnv |",
        "|---|---|---|---:|---:|",
    ]
    for row in rows:
        sps, ratios = row["sps"], row["ratios"]
        lines.append(
            f"| {row['workload']} | {row['policy']} | {row['candidate']} | {statistics.median(sps):,.0f} "
            f"({min(sps):,.0f}-{max(sps):,.0f}) | {statistics.median(ratios):.2f}x "
            f"({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
    open(os.path.join(args.out, "batches.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
