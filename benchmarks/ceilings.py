#!/usr/bin/env python
"""What this machine allows: the ceilings of the speed goals that sit near them.

    python benchmarks/ceilings.py --rounds 3 --out benchmarks/results/ceilings

Two bounds, each from measurements taken here, every measurement in a fresh process,
interleaved over rounds, medians with ranges:

- **A vector env of Python envs** on C cores steps at best C envs at once, each as fast
  as in a plain Python loop over its share of the envs (``k = envs / C`` of them, its own
  resets included, nothing else: a worker with k envs has their memory to cycle through,
  and that costs here, e.g. HalfCheetah-v5 ~127 us a step looping over 4 envs, ~158 us
  over 16). Its ceiling over SyncVectorEnv is ``C x loop / sync`` (env steps/s of that
  loop, and of SyncVectorEnv over the goal's number of envs). No waits, no transport,
  no parent: a goal above it cannot be met by any vector env on this machine.
- **A trainer** spends wall time where no vector env helps: acting, targets, the
  learner. From ``fastvec train``'s own time breakdown (``time_breakdown``):
  on the Sync backend, the engine's wall time is at best the Sync run's with its env
  time divided by the vector-env ceiling above (everything else unchanged); in
  lock-step, batch groups can at best hide all of acting behind the envs, so the groups
  run takes at least the lock-step wall time minus its acting time (on any number of
  cores; on C busy cores less still is hidden).
- **The async pipeline** (a learner process beside the collector) can at best spread
  the lock-step run's work over the cores: it takes at least the lock-step run's CPU
  time (the trainer's and its workers', from the kernel's accounting of the finished
  process tree, less the child's start-up before the clock started, counted as one busy
  core) divided by C. Its ceiling over lock-step is ``wall / (run CPU / C)``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# The goals these bounds are about (issue: what it asks; figures are ratios).
VEC_GOALS = [
    # (label, workload, the vector env's envs, SyncVectorEnv's envs, goal)
    ("Pong, 16 envs in batches of 8 (ready mode), over SyncVectorEnv x8", "pong", 16, 8, 2.1),
    ("Pong, 16 envs in batches of 8 (groups mode), over SyncVectorEnv x8", "pong", 16, 8, 2.0),
    ("HalfCheetah-v5, 32 envs in batches of 16, over SyncVectorEnv x32", "halfcheetah", 32, 32, 2.0),
    ("HalfCheetah-v5 x8 (the trainer's preset), over SyncVectorEnv x8", "halfcheetah", 8, 8, None),
]
TRAIN_ENV, TRAIN_STEPS = "HalfCheetah-v5", 102_400
STEPS = {"pong": 2000, "halfcheetah": 16000}


def child(spec: dict) -> dict:
    """One measurement in this process: env steps/s of a plain loop over ``envs`` envs
    (``kind="loop"``) or of SyncVectorEnv over them (``"sync"``)."""
    from harness.envs import workload_envs

    fn, steps, n = workload_envs(spec["workload"]), spec["steps"], spec["envs"]
    if spec["kind"] == "loop":
        envs = [fn() for _ in range(n)]
        for i, env in enumerate(envs):
            env.reset(seed=i)
            env.action_space.seed(i)
        acts = [envs[0].action_space.sample() for _ in range(64)]

        def run(loops):
            for k in range(loops):
                a = acts[k % 64]
                for env in envs:
                    if any(env.step(a)[2:4]):
                        env.reset()

        loops = max(1, steps // n)
        run(loops // 10)
        t0 = time.perf_counter()
        run(loops)
        sps = loops * n / (time.perf_counter() - t0)
        for env in envs:
            env.close()
        return {"sps": sps}
    from gymnasium.vector import SyncVectorEnv

    env = SyncVectorEnv([fn] * n)
    env.reset(seed=0)
    env.action_space.seed(0)
    acts = [env.action_space.sample() for _ in range(16)]
    loops = max(1, steps // n)
    for k in range(loops // 10):
        env.step(acts[k % 16])
    t0 = time.perf_counter()
    for k in range(loops):
        env.step(acts[k % 16])
    sps = loops * n / (time.perf_counter() - t0)
    env.close()
    return {"sps": sps}


def measure(name: str, train_steps: int) -> dict:
    """One candidate in a fresh process."""
    kind, *rest = name.split(":")
    if kind == "train":
        spec = {"loop": "train", "env": TRAIN_ENV, "steps": train_steps, "cand": rest[0]}
        from harness.loops import run_child  # the real loops' train child, in a fresh process

        res = run_child(spec, 900.0)
        if "error" in res:
            raise RuntimeError(f"train:{rest[0]} failed: {res['error']}")
        return res
    workload, n = rest
    spec = {"kind": kind, "workload": workload, "steps": STEPS[workload], "envs": int(n)}
    from harness.processes import child_env, child_json

    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    return child_json(cmd, f"{name} measurement", 900.0, env=child_env(ROOT))


def _med(xs):
    return statistics.median(xs), min(xs), max(xs)


def bounds(runs: dict, cores: int, train_steps: int) -> dict:
    """Per round, the ceilings (so that their medians and ranges can be reported)."""
    out = {}
    rounds = len(runs["train:sync"])
    for label, workload, n, n_sync, goal in VEC_GOALS:
        loop = runs[f"loop:{workload}:{max(1, n // cores)}"]
        out[label] = {
            "goal": goal,
            "per_round": [cores * loop[r]["sps"] / runs[f"sync:{workload}:{n_sync}"][r]["sps"] for r in range(rounds)],
        }
    hc8 = out[VEC_GOALS[3][0]]["per_round"]
    eng, syn, asy = [], [], []
    for r in range(rounds):
        s, e = runs["train:sync"][r], runs["train:engine"][r]
        if e.get("env_groups", 1) != 1:
            raise RuntimeError(f"the {TRAIN_ENV} preset is not in lock-step: this bound needs a lock-step run")
        env_s = s["times"]["env"]
        syn.append(s["wall_s"] / (s["wall_s"] - env_s * (1.0 - 1.0 / hc8[r])))
        eng.append(e["wall_s"] / (e["wall_s"] - e["times"]["act"]))
        run_cpu = e["cpu_s"] - (e["process_wall_s"] - e["wall_s"])
        asy.append(e["wall_s"] / (run_cpu / cores))
    steps = f"{train_steps / 1000:g}k steps"
    out[f"fastvec train {TRAIN_ENV} ({steps}), engine over its Sync backend"] = {"goal": 1.3, "per_round": syn}
    out[f"fastvec train {TRAIN_ENV} ({steps}), batch groups over lock-step"] = {"goal": 1.15, "per_round": eng}
    out[f"fastvec train {TRAIN_ENV} ({steps}), async pipeline over lock-step"] = {"goal": 1.2, "per_round": asy}
    return out


def render(runs: dict, bnds: dict, cores: int, rounds: int, wall: float, argv: list[str]) -> str:
    lines = [
        f"# Ceilings of the speed goals on this machine ({rounds} rounds, {wall:.0f} s)",
        "",
        f"`python benchmarks/ceilings.py {' '.join(argv)}` on {platform.platform()}, {cores} cores. "
        "Every measurement in a fresh process, interleaved over rounds; medians (min-max) over rounds. "
        "How each ceiling is computed: the docstring of `benchmarks/ceilings.py`.",
        "",
        "The last column is the share of its ceiling a goal asks for: a vector env or trainer "
        "meets a goal of 100% only with no cost of its own at all.",
        "",
        "| goal | asked | ceiling here | asked / ceiling |",
        "|---|---:|---:|---:|",
    ]
    for label, b in bnds.items():
        m, lo, hi = _med(b["per_round"])
        goal = b["goal"]
        share = "" if goal is None else f"{100 * goal / m:.0f}%" + (" (above every round's)" if goal > hi else "")
        lines.append(
            f"| {label} | {'-' if goal is None else f'{goal:.2f}x'} | {m:.2f}x ({lo:.2f}-{hi:.2f}) | {share} |"
        )
    lines += ["", "Measured (env steps/s, or seconds):", "", "| measurement | median (min-max) |", "|---|---:|"]
    for name, rs in runs.items():
        if name.startswith("train:"):
            for key in ("wall_s", "cpu_s", "act", "env", "prepare", "learn"):
                xs = [r[key] if key in ("wall_s", "cpu_s") else r["times"][key] for r in rs]
                m, lo, hi = _med(xs)
                lines.append(f"| {name} {key} (s) | {m:.2f} ({lo:.2f}-{hi:.2f}) |")
        else:
            m, lo, hi = _med([r["sps"] for r in rs])
            lines.append(f"| {name} | {m:,.0f} ({lo:,.0f}-{hi:,.0f}) |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=TRAIN_STEPS)
    ap.add_argument("--out", default=None, help="folder for ceilings.md and ceilings.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    if args.rounds < 1 or args.train_steps < 1:
        ap.error("--rounds and --train-steps must be positive")
    sys.path.insert(0, ROOT)
    from fastvec.options import available_cores

    cores = available_cores()
    names = []
    for _label, workload, n, n_sync, _goal in VEC_GOALS:
        for name in (f"loop:{workload}:{max(1, n // cores)}", f"sync:{workload}:{n_sync}"):
            if name not in names:
                names.append(name)
    names += ["train:sync", "train:engine"]
    runs = {n: [] for n in names}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            print(f"round {r + 1}/{args.rounds}: {n}", file=sys.stderr, flush=True)
            runs[n].append(measure(n, args.train_steps))
    bnds = bounds(runs, cores, args.train_steps)
    text = render(runs, bnds, cores, args.rounds, time.perf_counter() - t0, argv)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "ceilings.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "ceilings.json"), "w") as f:
            json.dump({"cores": cores, "runs": runs, "bounds": bnds}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
