"""The gymnasium door's arguments, checked before any process starts: gymnasium's own
keywords, the autoreset mode, how many worker processes run which envs (``num_workers``,
``max_concurrency``, batches, "auto"), and the observation spaces ``observation_mode``
asks for once the engine knows the envs'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from gymnasium.spaces import Space
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_differing_spaces, batch_space

from .._core.segment import layout_of
from ..engine import batch_workers
from ..options import available_cores, check_env_fns
from ..worker_layouts import resolve_auto
from .base import check_num_workers
from .batches import check_batch_size

__all__ = [
    "ENGINE_AUTORESET",
    "ProcessPlan",
    "autoreset_mode_of",
    "check_gymnasium_keywords",
    "observation_spaces",
    "plan_processes",
]

# gymnasium's autoreset modes by the engine's names for them
ENGINE_AUTORESET = {
    AutoresetMode.NEXT_STEP: "next_step",
    AutoresetMode.SAME_STEP: "same_step",
    AutoresetMode.DISABLED: "disabled",
}


def check_gymnasium_keywords(shared_memory, worker, observation_mode) -> tuple | None:
    """gymnasium's keywords that fastvec takes as they are or refuses; returns the
    (batched, single) observation spaces ``observation_mode`` gives, or None."""
    if not isinstance(shared_memory, bool):
        raise ValueError(f"shared_memory must be True or False, got {shared_memory!r}")
    if worker is not None:
        raise ValueError(
            "fastvec.AsyncVectorEnv cannot run a custom `worker` function: its workers speak "
            "fastvec's shared-memory protocol; pass worker=None (wrap the env instead)"
        )
    return _check_observation_mode(observation_mode)


def _check_observation_mode(mode) -> tuple | None:
    """gymnasium's ``observation_mode``: "same", "different" or (batched, single) spaces."""
    if isinstance(mode, tuple):
        if len(mode) != 2 or not all(isinstance(s, Space) for s in mode):
            raise ValueError(
                "observation_mode as a tuple must be (batched observation space, single "
                f"observation space), got {mode!r}"
            )
        return mode
    if mode not in ("same", "different"):
        raise ValueError(
            "Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and "
            f"batch observation space, actual got {mode}"
        )
    return None


def autoreset_mode_of(autoreset_mode) -> AutoresetMode:
    """An ``AutoresetMode`` or its value as one, else ValueError."""
    try:
        return autoreset_mode if isinstance(autoreset_mode, AutoresetMode) else AutoresetMode(autoreset_mode)
    except ValueError:
        raise ValueError(
            f"autoreset_mode must be one of {[m.value for m in AutoresetMode]}, got {autoreset_mode!r}"
        ) from None


class ProcessPlan(NamedTuple):
    """What the engine is started with: the env functions (checked where batches need
    their count), the worker count (None: the engine's default), the placement and the
    envs' costs for it, and the batches' size (None: no batches asked for) and mode."""

    env_fns: Sequence[Callable]
    num_workers: int | None
    placement: str | Sequence[Sequence[int]]
    env_costs: Sequence[float] | None
    batch: int | None
    batch_mode: str


def plan_processes(
    door_class,
    env_fns,
    *,
    num_workers,
    max_concurrency,
    batch_size,
    batch_mode,
    placement,
    env_costs,
    context,
    observation_mode,
) -> ProcessPlan:
    """The worker count and placement for these arguments: ``max_concurrency`` caps the
    count, batches fit it to their groups, and "auto" times the candidate layouts on
    instances of ``door_class`` (``fastvec.worker_layouts``)."""
    auto, workers = check_num_workers(num_workers)  # "auto": resolved below
    if auto and max_concurrency is not None:
        raise ValueError("num_workers='auto' and max_concurrency both set the process count: give one")
    if max_concurrency is not None:
        workers = _capped(workers, max_concurrency, len(env_fns))
    batch = None
    if batch_size is not None or batch_mode != "groups":
        env_fns = check_env_fns(env_fns)
        batch = check_batch_size(len(env_fns) if batch_size is None else batch_size, len(env_fns), batch_mode)
    if auto:  # time the candidate layouts on these envs (fastvec.tune)
        layout = resolve_auto(
            door_class,
            env_fns,
            placement,
            env_costs,
            batch,
            batch_mode,
            context=context,
            observation_mode=observation_mode,
        )
        workers, placement = layout.num_workers, layout.placement
    if batch is not None:
        workers = batch_workers(workers, len(env_fns), batch, available_cores(), batch_mode)
    return ProcessPlan(env_fns, workers, placement, env_costs, batch, batch_mode)


def _capped(workers, max_concurrency, num_envs: int) -> int:
    """gymnasium 1.4's ``max_concurrency``: the worker count when none was given, else a
    bound the one given must keep."""
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, (int, np.integer)) or max_concurrency < 1:
        raise ValueError(f"max_concurrency must be a positive int or None, got {max_concurrency!r}")
    if workers is None:
        return max(1, min(num_envs, available_cores(), int(max_concurrency)))
    if workers > max_concurrency:
        raise ValueError(f"num_workers={workers} exceeds max_concurrency={max_concurrency}")
    return workers


def observation_spaces(mode, given, eng) -> tuple:
    """(batched, single) observation spaces for ``observation_mode`` (``given``: the
    spaces its tuple named, checked against the envs' layout)."""
    if given is not None:
        batched, single = given
        env0 = eng.single_observation_space
        if layout_of(single) is None or layout_of(single) != layout_of(env0):
            raise ValueError(
                f"observation_mode's single space {single} does not have the layout of the "
                f"envs' observation space {env0} (leaves, shapes, dtypes)"
            )
        return batched, single
    single = eng.single_observation_space
    if mode == "different":
        per_env = getattr(eng, "env_observation_spaces", None)
        if per_env is None:
            raise ValueError(
                f"observation_mode='different' is not available on {type(eng).__name__}; pass the spaces as a tuple"
            )
        return batch_differing_spaces(per_env), single
    return batch_space(single, eng.num_envs), single
