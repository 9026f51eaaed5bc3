"""``fastvec bench``: how much faster fastvec steps your env than gymnasium's SyncVectorEnv.

    fastvec bench                          # CartPole-v1, 16 envs: a few seconds
    fastvec bench HalfCheetah-v5 --num-envs 8 --steps 500 --repeats 5
    fastvec bench mypackage.envs:MyEnv --env-kwargs size=8   # an env of your own

Measures env steps per second of ``fastvec.AsyncVectorEnv`` and of
``gymnasium.vector.SyncVectorEnv`` on the same env, with the same random actions
(drawn before timing), in interleaved rounds (each round measures both, the order
alternating), and prints the median and the min-max over rounds. The project's own
measurements (every peer, the real training loops, charts) live in the source
tree's ``benchmarks/`` folder, not in the package.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time

from ._cli_util import OneLineParser, add_env_kwargs, positive_int
from .env_ids import env_problem, make_env

__all__ = ["main", "run"]

ACTION_BATCHES = 32  # pre-drawn action batches, cycled through while timing


def build_parser() -> OneLineParser:
    p = OneLineParser(
        prog="fastvec bench",
        description="Env steps/s of fastvec.AsyncVectorEnv against gymnasium's SyncVectorEnv "
        "on one env, median and range over interleaved rounds.",
    )
    p.add_argument(
        "env_id",
        nargs="?",
        default="CartPole-v1",
        help="gymnasium env id (default CartPole-v1; ALE/... needs ale-py), or your own: MODULE:ENV_ID, MODULE:CALLABLE",
    )
    add_env_kwargs(p)
    p.add_argument("--num-envs", type=positive_int, default=16, metavar="N", help="envs per vector env (default 16)")
    p.add_argument(
        "--steps",
        type=positive_int,
        default=1000,
        metavar="N",
        help="timed vector steps per measurement (default 1000)",
    )
    p.add_argument(
        "--num-workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="fastvec's worker processes (default: min(num_envs, cores))",
    )
    p.add_argument("--repeats", type=positive_int, default=3, metavar="N", help="rounds (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed for env resets and actions (default 0)")
    return p


def _measure(build, actions: list, steps: int, seed: int) -> float:
    """Env steps/s of one fresh vector env: reset, ~10% warm-up steps, ``steps`` timed."""
    env = build()
    try:
        env.reset(seed=seed)
        k = len(actions)
        for i in range(max(1, steps // 10)):
            env.step(actions[i % k])
        t0 = time.perf_counter()
        for i in range(steps):
            env.step(actions[i % k])
        return steps * env.num_envs / (time.perf_counter() - t0)
    finally:
        env.close()


def run(
    env_id: str = "CartPole-v1",
    num_envs: int = 16,
    steps: int = 1000,
    num_workers: int | None = None,
    repeats: int = 3,
    seed: int = 0,
    *,
    env_kwargs: dict | None = None,
) -> dict:
    """Measure both vector envs; returns ``{"sync": [sps per round], "fastvec": [...], ...}``.
    ``env_kwargs``: the env's settings (``fastvec.env_ids.make_env``)."""
    import gymnasium as gym
    import numpy as np

    import fastvec

    fns = [functools.partial(make_env, env_id, dict(env_kwargs or {}))] * num_envs
    candidates = {
        "sync": lambda: gym.vector.SyncVectorEnv(fns),
        "fastvec": lambda: fastvec.AsyncVectorEnv(fns, num_workers=num_workers),
    }
    probe = fns[0]()
    try:
        space = probe.action_space
        space.seed(seed)
        actions = [np.stack([np.asarray(space.sample()) for _ in range(num_envs)]) for _ in range(ACTION_BATCHES)]
    finally:
        probe.close()
    sps: dict = {key: [] for key in candidates}
    for r in range(repeats):
        for key in list(candidates) if r % 2 == 0 else list(candidates)[::-1]:
            sps[key].append(_measure(candidates[key], actions, steps, seed))
    ratios = [f / s for f, s in zip(sps["fastvec"], sps["sync"])]
    return {
        "env_id": env_id,
        "num_envs": num_envs,
        "steps": steps,
        "repeats": repeats,
        "num_workers": num_workers,
        "sps": sps,
        "ratios": ratios,
    }


def render(res: dict) -> str:
    """The result of :func:`run` as a short text table."""
    from .options import available_cores

    workers = res["num_workers"] or f"min(num_envs, cores) = {min(res['num_envs'], available_cores())}"
    lines = [
        f"{res['env_id']}, {res['num_envs']} envs, {res['steps']} timed steps x {res['repeats']} rounds, "
        f"{available_cores()} cores; fastvec num_workers: {workers}",
        "",
    ]
    rows = [("vector env", "env steps/s: median (min-max)", "vs SyncVectorEnv")]
    names = {"sync": "gymnasium SyncVectorEnv", "fastvec": "fastvec.AsyncVectorEnv"}
    for key, name in names.items():
        v = res["sps"][key]
        r = [1.0] * len(v) if key == "sync" else res["ratios"]
        rows.append(
            (
                name,
                f"{statistics.median(v):,.0f} ({min(v):,.0f}-{max(v):,.0f})",
                f"{statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        lines.append(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))
            ).rstrip()
        )
    lines += ["", "Every peer, the real training loops and charts: benchmarks/ in the source tree."]
    return "\n".join(lines)


def main(name: str = "bench", argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
        why = env_problem(args.env_id, args.env_kwargs, agents=False)
        if why:
            parser.error(why)
    except SystemExit as exc:  # a usage error, already printed as one line (or --help: 0)
        if exc.code == 2:
            return 2
        raise
    try:
        res = run(
            args.env_id,
            args.num_envs,
            args.steps,
            args.num_workers,
            args.repeats,
            args.seed,
            env_kwargs=args.env_kwargs,
        )
    except Exception as exc:  # the env failed to build or step: one line, not a traceback
        text = str(exc).strip().splitlines()
        print(f"fastvec bench: failed: {type(exc).__name__}: {text[0] if text else ''}", file=sys.stderr)
        return 1
    print(render(res))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main("bench", sys.argv[1:]))
