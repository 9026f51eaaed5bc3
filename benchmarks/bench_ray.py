#!/usr/bin/env python
"""fastvec.ray beside the single-machine engine, on the same machine.

    python benchmarks/bench_ray.py                        # CartPole-v1 x16 and Pong x8 (~5 min on 2 cores)
    python benchmarks/bench_ray.py --only pong --repeats 7
    python benchmarks/bench_ray.py --out benchmarks/results/ray   # also writes ray.json / ray.md

Candidates (same env factories, same number of env worker processes in total)
----------------------------------------------------------------------------
local
    ``fastvec.AsyncVectorEnv(fns, num_workers=W)``: the single-machine engine.
ray
    ``fastvec.ray.AsyncVectorEnv(fns, num_actors=1, workers_per_actor=W)``: one Ray actor
    hosting the engine. The actor runs on the driver's node, so steps go through the
    driver's shared memory and a Unix-socket doorbell (the default ``local_fast_path``).
ray-tasks
    The same with ``local_fast_path=False``: every step is a Ray actor task, actions go
    as task arguments and results come back through Ray's object store. This is the
    path (and the per-step cost, less the network) of an actor on another node.
ray-tasks x2
    Two actors (``workers_per_actor=W/2``), both on the Ray task path: the cost of one
    more actor per step, with the two actors' calls in flight together.

The Ray candidates reserve no CPUs in Ray (``num_cpus_per_actor=0``) so that they can all
live at once on one machine. All candidates stay alive for the whole run and are measured in interleaved rounds
(the order rotates every round), ``--steps`` random-action ``step()`` calls each after a
warm-up; the tables show medians and min-max. Per-step overhead = the extra wall time
of one vector step against ``local``: ``num_envs * (1/sps - 1/sps_local)``.
A Ray no-op actor call (round trip of a method returning its small argument) and the
transfer of one Pong batch through the object store are measured too: the fixed costs
an actor on another node pays per step.

Every Ray process listens on 127.0.0.1 only (fastvec's local instance pins it).
The machine is shared and noisy: compare candidates within one run, not across runs.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
import time

import numpy as np
from harness.common import cpu_model, write_results

from fastvec.options import available_cores

HERE = os.path.dirname(os.path.abspath(__file__))

WORKLOADS = {
    "cartpole": {"title": "CartPole-v1, 16 envs", "num_envs": 16, "steps": 2000, "warmup": 200},
    "pong": {
        "title": "Pong (ALE/Pong-v5 + AtariPreprocessing + FrameStack 4), 8 envs",
        "num_envs": 8,
        "steps": 300,
        "warmup": 40,
    },
}
GOALS = {"pong": 0.8}  # ray / local on Pong, same envs (issue 7)


def _fns(name: str, n: int):
    from harness.envs import make_gym, make_pong

    if name == "pong":
        return [make_pong] * n
    return [functools.partial(make_gym, "CartPole-v1")] * n


def _vector_env(kind: str, fns, workers: int):
    import fastvec
    import fastvec.ray

    if kind == "local":
        return fastvec.AsyncVectorEnv(fns, num_workers=workers)
    if kind == "ray":
        return fastvec.ray.AsyncVectorEnv(fns, num_actors=1, workers_per_actor=workers, num_cpus_per_actor=0)
    if kind == "ray-tasks":
        return fastvec.ray.AsyncVectorEnv(
            fns, num_actors=1, workers_per_actor=workers, num_cpus_per_actor=0, local_fast_path=False
        )
    if kind == "ray-tasks x2":
        return fastvec.ray.AsyncVectorEnv(
            fns, num_actors=2, workers_per_actor=max(1, workers // 2), num_cpus_per_actor=0, local_fast_path=False
        )
    raise ValueError(kind)


def _time_steps(env, actions) -> float:
    t0 = time.perf_counter()
    for a in actions:
        env.step(a)
    return time.perf_counter() - t0


def bench_workload(name: str, kinds, repeats: int, steps: int | None, seed: int, progress: bool) -> dict:
    spec = WORKLOADS[name]
    n = spec["num_envs"]
    steps = steps or spec["steps"]
    workers = min(n, available_cores())
    fns = _fns(name, n)
    envs = {}
    try:
        for kind in kinds:
            t0 = time.perf_counter()
            envs[kind] = _vector_env(kind, fns, workers)
            envs[kind].reset(seed=seed)
            if progress:
                print(f"[{name}] {kind}: started in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        space = envs[kinds[0]].action_space
        space.seed(seed)
        actions = [space.sample() for _ in range(steps)]
        for kind in kinds:
            _time_steps(envs[kind], actions[: spec["warmup"]])
        sps = {kind: [] for kind in kinds}
        for r in range(repeats):
            order = kinds[r % len(kinds) :] + kinds[: r % len(kinds)]
            for kind in order:
                sps[kind].append(n * steps / _time_steps(envs[kind], actions))
            if progress:
                print(
                    f"[{name}] round {r + 1}/{repeats}: " + ", ".join(f"{k} {sps[k][-1]:,.0f}" for k in kinds),
                    file=sys.stderr,
                )
    finally:
        for env in envs.values():
            env.close()
    local = statistics.median(sps["local"])
    rows = []
    for kind in kinds:
        med = statistics.median(sps[kind])
        rows.append(
            {
                "candidate": kind,
                "steps_per_s": med,
                "min": min(sps[kind]),
                "max": max(sps[kind]),
                "ratio": med / local,
                "ratio_min": min(sps[kind]) / local,
                "ratio_max": max(sps[kind]) / local,
                "overhead_us_per_step": n * (1.0 / med - 1.0 / local) * 1e6,
                "all": sps[kind],
            }
        )
    return {
        "workload": name,
        "title": spec["title"],
        "num_envs": n,
        "workers": workers,
        "steps_per_measure": steps,
        "repeats": repeats,
        "rows": rows,
    }


def bench_ray_calls(repeats: int) -> dict:
    """Fixed costs of an actor on another node: a no-op Ray actor call, and one Pong
    batch (8 x 4 x 84 x 84 uint8) through the object store."""
    import ray

    import fastvec.ray as fr

    # Reuse (or start) fastvec's loopback instance through a tiny engine.
    holder = fr.RayEngine([functools.partial(_noop_env)], num_actors=1, num_cpus_per_actor=0)
    try:

        @ray.remote(num_cpus=0)
        class Echo:
            def echo(self, x):
                return x

            def batch(self, shape):
                return np.zeros(shape, np.uint8)

        actor = Echo.remote()
        ray.get(actor.echo.remote(0))
        small = np.zeros(8, np.int64)
        out = {"noop_call_us": [], "pong_batch_us": []}
        for _ in range(repeats):
            for _ in range(50):
                ray.get(actor.echo.remote(small))
            t0 = time.perf_counter()
            for _ in range(300):
                ray.get(actor.echo.remote(small))
            out["noop_call_us"].append((time.perf_counter() - t0) / 300 * 1e6)
            t0 = time.perf_counter()
            for _ in range(100):
                ray.get(actor.batch.remote((8, 4, 84, 84)))
            out["pong_batch_us"].append((time.perf_counter() - t0) / 100 * 1e6)
        ray.kill(actor)
    finally:
        holder.close()
    return {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in out.items()}


def _noop_env():
    import gymnasium as gym

    return gym.make("CartPole-v1")


def _md(results: dict) -> str:
    lines = ["# fastvec.ray beside the single-machine engine (same machine)", ""]
    m = results["machine"]
    lines += [
        f"Machine: {m['cpu']}, {m['cores']} cores; load average {m['load_before']} before, "
        f"{m['load_after']} after. Python {m['python']}, Ray {m['ray']}, numpy {m['numpy']}.",
        f"Command: `{results['command']}`. Medians of {results['repeats']} interleaved rounds "
        "(min-max in brackets); every Ray process on 127.0.0.1.",
        "",
    ]
    for w in results["workloads"]:
        lines += [
            f"## {w['title']}",
            "",
            f"{w['workers']} env worker processes in every candidate, {w['steps_per_measure']} "
            "random-action `step()` calls per measurement.",
            "",
            "| candidate | env steps/s | vs local | overhead per vector step |",
            "| --- | ---: | ---: | ---: |",
        ]
        for r in w["rows"]:
            over = "–" if r["candidate"] == "local" else f"{r['overhead_us_per_step']:,.0f} µs"
            lines.append(
                f"| {r['candidate']} | {r['steps_per_s']:,.0f} ({r['min']:,.0f}–{r['max']:,.0f}) | "
                f"{r['ratio']:.2f}x ({r['ratio_min']:.2f}–{r['ratio_max']:.2f}) | {over} |"
            )
        goal = GOALS.get(w["workload"])
        if goal is not None:
            ray_row = next(r for r in w["rows"] if r["candidate"] == "ray")
            verdict = "met" if ray_row["ratio"] >= goal else "MISSED"
            lines += ["", f"Goal: fastvec.ray >= {goal}x the local engine: **{ray_row['ratio']:.2f}x, {verdict}**."]
        lines.append("")
    c = results.get("ray_calls")
    if c:

        def us_span(d):
            return f"{d['median']:,.0f} µs ({d['min']:,.0f}–{d['max']:,.0f})"

        lines += [
            "## Fixed costs of the Ray task path",
            "",
            f"- no-op Ray actor call (small numpy argument and result): {us_span(c['noop_call_us'])}",
            f"- one Pong batch (8x4x84x84 uint8, 226 KB) returned through the object store: {us_span(c['pong_batch_us'])}",
            "",
        ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=None, help="step() calls per measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--candidates", nargs="+", default=["local", "ray", "ray-tasks", "ray-tasks x2"])
    p.add_argument("--out", default=None, help="directory for ray.json and ray.md")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    kinds = list(dict.fromkeys(["local"] + args.candidates))

    import ray

    load_before = tuple(round(x, 2) for x in os.getloadavg())
    results = {
        "command": "python benchmarks/bench_ray.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "repeats": args.repeats,
        "workloads": [],
    }
    for name in args.only:
        results["workloads"].append(
            bench_workload(name, kinds, args.repeats, args.steps, args.seed, not args.no_progress)
        )
    results["ray_calls"] = bench_ray_calls(args.repeats)
    results["machine"] = {
        "cpu": cpu_model(),
        "cores": available_cores(),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "numpy": np.__version__,
        "load_before": load_before,
        "load_after": tuple(round(x, 2) for x in os.getloadavg()),
    }
    write_results(args.out, _md(results), results, stem="ray")
    return 0


if __name__ == "__main__":
    sys.exit(main())
