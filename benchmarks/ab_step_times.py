#!/usr/bin/env python
"""Two builds' own step times, interleaved: fastvec's median ``step()`` time on Pong x8
(or ``--workload cartpole16`` / ``halfcheetah16``; 2 workers), each door, each build in a
fresh process per round, the builds' order alternating. A check of ``ab_builds.py``'s ratios when the host is noisy: a ratio
against SyncVectorEnv moves with the serial run measured beside it, a step time only
with the build.

    python benchmarks/ab_step_times.py --before /path/to/old --after . --rounds 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness.processes import child_env, child_json  # noqa: E402

CHILD = """
import json, sys, time
import numpy as np
sys.path.insert(0, {here!r})
import functools
from harness.envs import make_gym, make_pong
import fastvec

door, steps, workload = sys.argv[1], int(sys.argv[2]), sys.argv[3]
fn, n = {{"pong8": (make_pong, 8), "cartpole16": (functools.partial(make_gym, "CartPole-v1"), 16),
         "halfcheetah16": (functools.partial(make_gym, "HalfCheetah-v5"), 16)}}[workload]
if door == "gym":
    env = fastvec.AsyncVectorEnv([fn] * n, num_workers=2)
    env.reset(seed=0)
else:
    env = fastvec.SubprocVecEnv([fn] * n, num_workers=2)
    env.seed(0)
    env.reset()
env.action_space.seed(0)
if door == "gym":
    acts = [env.action_space.sample() for _ in range(32)]
else:
    acts = [np.stack([env.action_space.sample() for _ in range(n)]) for _ in range(32)]
for i in range(100):  # warm-up: the waits learn the loop
    env.step(acts[i % 32])
ts = []
for i in range(steps):
    t0 = time.perf_counter()
    env.step(acts[i % 32])
    ts.append(time.perf_counter() - t0)
env.close()
print(json.dumps({{"fastvec": fastvec.__file__, "median_us": float(np.median(ts)) * 1e6}}))
"""


def step_time(build: str, door: str, steps: int, workload: str = "pong8") -> float:
    cmd = [sys.executable, "-c", CHILD.format(here=HERE), door, str(steps), workload]
    # cwd outside both trees: nothing there shadows the build on the path
    res = child_json(cmd, f"{build} {door}", 600, cwd=tempfile.gettempdir(), env=child_env(build))
    if not res["fastvec"].startswith(os.path.join(os.path.abspath(build), "")):
        raise RuntimeError(f"measured {res['fastvec']}, not {build}")
    return res["median_us"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="source tree of the first build (built in place)")
    p.add_argument("--after", required=True, help="source tree of the second build (built in place)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=600, help="timed steps per measurement")
    p.add_argument("--workload", default="pong8", choices=("pong8", "cartpole16", "halfcheetah16"))
    args = p.parse_args(argv)
    if args.rounds < 1 or args.steps < 1:
        p.error("--rounds and --steps must be positive")
    got: dict = {}
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for name in order:
            for door in ("gym", "sb3"):
                us = step_time(getattr(args, name), door, args.steps, args.workload)
                got.setdefault((door, name), []).append(us)
                print(f"round {r + 1}/{args.rounds} {name} {door}: {us:.0f} us", flush=True)
    print("\n| door | before, median us (range) | after | after / before |\n|---|---:|---:|---:|")
    for door in ("gym", "sb3"):
        b, a = got[(door, "before")], got[(door, "after")]
        mb, ma = statistics.median(b), statistics.median(a)
        print(
            f"| {door} | {mb:.0f} ({min(b):.0f}-{max(b):.0f}) | {ma:.0f} ({min(a):.0f}-{max(a):.0f}) | {ma / mb:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
