"""``fastvec tune``: the layout that steps fastest on your env, measured.

    fastvec tune HalfCheetah-v5 --num-envs 16 --policy-us 1000
    fastvec tune mypackage.envs:MyEnv --env-kwargs size=8   # an env of your own

Each candidate layout (workers, lock-step or batches, placement) is timed on the envs
themselves with ``fastvec.AsyncVectorEnv``, in a loop with a stand-in for the caller's
policy; the default stays unless another beats it by ``KEEP``
(``fastvec.worker_layouts`` holds the candidates and the choice; the doors'
``num_workers="auto"`` uses it too).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence

from . import worker_layouts
from ._cli_util import OneLineParser, add_env_kwargs, positive_int
from .env_ids import env_problem, make_env
from .options import available_cores
from .worker_layouts import KEEP, Layout, TuneResult, choose, layouts

__all__ = ["KEEP", "Layout", "TuneResult", "layouts", "measure", "tune", "main"]


def measure(env_fns: Sequence[Callable], layout: Layout, policy_us: float, seconds: float, **env_kwargs) -> tuple:
    """``(env steps/s, each env's us per step, each worker's envs)`` of ``layout`` on
    ``env_fns``, run by ``fastvec.AsyncVectorEnv`` (``worker_layouts.measure``)."""
    from .doors.gymnasium import AsyncVectorEnv

    return worker_layouts.measure(AsyncVectorEnv, env_fns, layout, policy_us, seconds, **env_kwargs)


def tune(
    env_fns: Sequence[Callable],
    policy_us: float = 0.0,
    seconds: float = 1.0,
    batches: bool = True,
    candidates: list[Layout] | None = None,
    default: Layout | None = None,
    **env_kwargs,
) -> TuneResult:
    """Time every candidate layout (``layouts``, or ``candidates``) twice, the order
    reversed the second time, and choose the fastest (best of its timings) unless
    ``default`` (lock-step over ``min(num_envs, cores)`` workers) is within ``KEEP`` of
    it, or falls within ``KEEP`` of it again in two more timings of each (the mean of
    all). ``env_kwargs`` go to
    every ``AsyncVectorEnv`` made (``context``, ...)."""
    if isinstance(policy_us, bool) or not isinstance(policy_us, (int, float)) or not 0 <= policy_us < 1e6:
        raise ValueError(f"policy_us must be a number of microseconds in [0, 1e6), got {policy_us!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 60:
        raise ValueError(f"seconds must be in (0, 60], got {seconds!r}")
    return choose(
        list(env_fns),
        measure,
        policy_us,
        seconds,
        available_cores(),
        batches=batches,
        candidates=candidates,
        default=default,
        **env_kwargs,
    )


# ------------------------------------------------------------------ the command
def build_parser() -> OneLineParser:
    p = OneLineParser(
        prog="fastvec tune",
        description="Time fastvec's candidate layouts (workers, lock-step or batches, placement) on an env and "
        "print the fastest, with the runner-up.",
    )
    p.add_argument(
        "env_id", help="gymnasium env id (ALE/... needs ale-py), or your own: MODULE:ENV_ID, MODULE:CALLABLE"
    )
    add_env_kwargs(p)
    p.add_argument("--num-envs", type=positive_int, default=16, metavar="N", help="envs (default 16)")
    p.add_argument(
        "--policy-us",
        type=float,
        default=0.0,
        metavar="US",
        help="your loop's time between steps (its policy), in microseconds (default 0)",
    )
    p.add_argument("--seconds", type=float, default=1.0, metavar="S", help="timing per candidate (default 1.0)")
    p.add_argument("--no-batches", action="store_true", help="lock-step layouts only (a loop that calls step)")
    return p


def main(name: str = "tune", argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    why = env_problem(args.env_id, args.env_kwargs, agents=False)
    if why is not None:
        p.error(why)
    if not 0 <= args.policy_us < 1e6:
        p.error(f"--policy-us must be in [0, 1e6), got {args.policy_us:g}")
    if not 0 < args.seconds <= 60:
        p.error(f"--seconds must be in (0, 60], got {args.seconds:g}")
    fns = [functools.partial(make_env, args.env_id, dict(args.env_kwargs or {}))] * args.num_envs
    result = tune(fns, args.policy_us, args.seconds, batches=not args.no_batches)
    print(f"fastvec tune {args.env_id}, {args.num_envs} envs, {available_cores()} cores")
    print(result)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main("tune", sys.argv[1:]))
