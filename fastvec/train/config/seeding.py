"""How ``fastvec train`` seeds its envs: one independent stream per env.

Env ``i`` of a run (its index in the whole run: across ranks, the groups of a mix, the
copies of a PettingZoo env) is reset with a 32-bit seed drawn from
``numpy.random.SeedSequence(entropy=seed, spawn_key=(member, i))``: the ``"spawned"``
scheme. ``member`` is 0 for a run alone, and for each member of a population
(``fastvec train --seeds``): a member is its run alone, and the members' seeds differ,
so no two share a stream (the members of a sweep with one seed share that seed's
streams, as two runs alone with it would: a paired comparison). A resumed run
needs new episodes: after ``env_steps`` steps it resets env ``i`` from
``spawn_key=(member, i, env_steps)``, a stream of its own (the same for every resume
from the same checkpoint). A start's keys and a resume's differ in length, so their
streams are apart (for seeds below 2**128, which numpy pads to its four-word pool before
it appends the key). Another ``member`` gives a seed a second set of streams.

The ``"offset"`` scheme is the one before: env ``i`` gets ``seed + i``, and
``seed + env_steps + i`` on a resume. Its streams overlap between runs (seeds 1 and 2
share all but one env's); a checkpoint that names no scheme was written under it, and
resumes with it. The front doors (``fastvec.AsyncVectorEnv``, ``fastvec.SubprocVecEnv``)
keep ``seed + i``: gymnasium's and SB3's vector envs seed that way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["SPAWNED", "OFFSET", "SCHEMES", "check_scheme", "env_seeds", "seeds_for"]

SPAWNED = "spawned"
"""Env i from ``SeedSequence(seed, spawn_key=(member, i))`` (``+ (env_steps,)`` on a resume)."""
OFFSET = "offset"
"""Env i with ``seed + i`` (``seed + env_steps + i`` on a resume): checkpoints written before."""
SCHEMES = (SPAWNED, OFFSET)


def check_scheme(scheme) -> str:
    """``scheme`` if it is one of ``SCHEMES``; ValueError otherwise."""
    if scheme not in SCHEMES:
        raise ValueError(f"env seeding must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    return scheme


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


def env_seeds(
    seed: int,
    first: int,
    count: int,
    *,
    scheme: str = SPAWNED,
    env_steps: int | None = None,
    member: int = 0,
) -> list[int]:
    """The reset seeds of the run's envs ``first .. first + count - 1`` under ``scheme``
    (see the module's docstring): a fresh start, or (``env_steps``) a resume after that
    many env steps. ``member``: another set of streams for the same seed (0: the run's own)."""
    seed, first, count = _count("seed", seed), _count("first env", first), _count("env count", count)
    member = _count("member", member)
    steps = None if env_steps is None else _count("env_steps", env_steps)
    if check_scheme(scheme) == OFFSET:
        if member:
            raise ValueError("env seeding 'offset' has no members (it is one run's seed + i)")
        base = seed + (steps or 0)
        return [base + i for i in range(first, first + count)]
    tail = () if steps is None else (steps,)
    return [
        int(np.random.SeedSequence(seed, spawn_key=(member, i, *tail)).generate_state(1, np.uint32)[0])
        for i in range(first, first + count)
    ]


def seeds_for(seed: int | Sequence[int] | None, count: int) -> list[int] | None:
    """What a storage's ``reset(seed)`` takes, as one seed per env of its ``count``:
    None (no seeds), an int (env i gets ``seed + i``) or a sequence of ``count`` ints."""
    if seed is None:
        return None
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return [int(seed) + i for i in range(count)]
    if isinstance(seed, (str, bytes)) or not isinstance(seed, Sequence | np.ndarray):
        raise ValueError(f"reset seeds must be None, an int or one int per env, got {type(seed).__name__}")
    seeds = list(seed)
    if len(seeds) != count:
        raise ValueError(f"reset takes one seed per env ({count}), got {len(seeds)}")
    return [_count("a reset seed", s) for s in seeds]
