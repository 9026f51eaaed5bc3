"""What an engine is asked to do, checked once: ``EngineOptions`` and its validators.

Every engine (``fastvec.engine.Engine``, ``fastvec.ray.RayEngine``) and every front door
takes the same options; they travel as one ``EngineOptions`` instead of a keyword list
written out per class.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, overload

import numpy as np

AUTORESET_MODES = ("same_step", "next_step", "disabled")


def available_cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def default_num_workers(num_envs: int) -> int:
    """The engine's worker count when none is given: one per core, at most one per env."""
    return min(num_envs, available_cores())


def check_env_fns(env_fns) -> list:
    """``env_fns`` as a non-empty list of callables, or ValueError."""
    if isinstance(env_fns, (str, bytes)) or not isinstance(env_fns, Sequence):
        try:
            env_fns = list(env_fns)
        except TypeError:
            raise ValueError("env_fns must be a sequence of callables that return envs") from None
    if len(env_fns) == 0:
        raise ValueError("env_fns is empty: give at least one env factory")
    for i, fn in enumerate(env_fns):
        if not callable(fn):
            raise ValueError(f"env_fns[{i}] is not callable (got {type(fn).__name__})")
    return list(env_fns)


@overload
def check_positive_int(value, name: str, allow_none: Literal[False] = False) -> int: ...
@overload
def check_positive_int(value, name: str, allow_none: bool) -> int | None: ...
def check_positive_int(value, name: str, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer{' or None' if allow_none else ''}, got {value!r}")
    return int(value)


def check_timeout(value, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")
    return float(value)


def check_spin(value, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
        raise ValueError(f"{name} must be a number of microseconds in [0, 1e6), got {value!r}")
    return float(value)


@dataclass
class EngineOptions:
    """How an engine runs its envs (the same for every engine and front door).

    num_slots : int
        Depth of the ring of result slots (>= 1): results of a step stay readable in
        place until ``num_slots - 1`` further steps or resets have returned.
    autoreset_mode : {"same_step", "next_step", "disabled"}
        What a worker does when an episode ends.
    context : str, optional
        Start method: "fork", "forkserver" or "spawn"; default: multiprocessing's.
    step_timeout : float, optional
        Seconds to wait for workers before raising ``WorkerError``; None waits forever
        (a dead worker is still noticed at once).
    start_timeout : float, optional
        Seconds to wait for workers to build their envs.
    restart_on_error : bool
        Replace a worker that died, hung past ``step_timeout`` or whose env raised in
        ``step``, reset its envs and go on; their episode ends truncated there.
    spin_us, main_spin_us : float, optional
        None (default): each side learns when its next message comes (a worker: the
        caller's gap between steps; the parent: the workers' step time), naps until
        shortly before, then spins briefly. A number overrides that for workers (resp.
        the parent): spin that many microseconds on shared memory, yielding the CPU,
        then sleep on the socket; 0 always sleeps.
    daemon : bool, default True
        Start the workers as daemonic processes (multiprocessing then forbids an env to
        start processes of its own: pass False for such envs). Workers exit with the
        parent either way (they watch it).
    space_check : {"equal", "layout"}
        How the envs' spaces must agree with env 0's: "equal" (SB3's rule), or "layout":
        the same leaves, shapes and dtypes, bounds may differ (gymnasium's
        ``observation_mode``; the shared memory only needs the layout).
    action_check : {"bounds", "dtype"}
        What is checked of a batch of actions before anything is sent (shapes and the
        number of envs always): "bounds" (fastvec's rule): numbers of the space's kind
        within its bounds, so a bad action never reaches a worker; "dtype" (what
        gymnasium passes through): any value the space's dtype holds exactly, so the env
        decides what an out-of-range value means (floats round to a float space's
        precision; a float for an integer space must be a whole number).
    pickled_leaves : bool, default False
        Carry spaces without a fixed size (Text, Graph, Sequence, OneOf, custom spaces)
        pickled beside the shared arrays (the gymnasium door does); False refuses them
        with a ``ValueError`` at start-up, for users of the ring that need fixed-size
        arrays (SB3's buffers, the trainer).
    """

    num_slots: int = 2
    autoreset_mode: str = "same_step"
    context: str | None = None
    step_timeout: float | None = None
    start_timeout: float | None = 300.0
    restart_on_error: bool = False
    spin_us: float | None = None
    main_spin_us: float | None = None
    daemon: bool = True
    space_check: str = "equal"
    action_check: str = "bounds"
    pickled_leaves: bool = False

    def __post_init__(self) -> None:
        self.num_slots = check_positive_int(self.num_slots, "num_slots")
        if self.autoreset_mode not in AUTORESET_MODES:
            raise ValueError(f"autoreset_mode must be one of {sorted(AUTORESET_MODES)}, got {self.autoreset_mode!r}")
        self.step_timeout = check_timeout(self.step_timeout, "step_timeout")
        self.start_timeout = check_timeout(self.start_timeout, "start_timeout")
        self.spin_us = check_spin(self.spin_us, "spin_us")
        self.main_spin_us = check_spin(self.main_spin_us, "main_spin_us")
        if self.context is not None and self.context not in mp.get_all_start_methods():
            # multiprocessing's own words first (SB3's tests match them), then what is allowed
            raise ValueError(
                f"cannot find context for {self.context!r}: the start method must be one of "
                f"{mp.get_all_start_methods()}"
            )
        self.restart_on_error = bool(self.restart_on_error)
        if not isinstance(self.daemon, bool):
            raise ValueError(f"daemon must be True or False, got {self.daemon!r}")
        if self.space_check not in ("equal", "layout"):
            raise ValueError(f"space_check must be 'equal' or 'layout', got {self.space_check!r}")
        if self.action_check not in ("bounds", "dtype"):
            raise ValueError(f"action_check must be 'bounds' or 'dtype', got {self.action_check!r}")

    def replace(self, **changes) -> EngineOptions:
        return dataclasses.replace(self, **changes)
