"""What both front doors share: the engine, the ring of result slots, open and closed,
and the checks of the arguments both take (seeds, timeouts, ``num_workers``).

Each ``step``/``reset`` writes into the slot after the one last returned, so a view
handed out earlier stays intact for ``num_slots - 1`` further calls.
"""

from __future__ import annotations

from collections.abc import Callable
from types import EllipsisType
from typing import Literal, overload

import numpy as np

from .._core.infos import StepResult
from ..engine import Engine
from ..errors import ClosedError, NoPendingCallError, PendingCallError
from ..options import EngineOptions
from .threads import TorchThreads


def check_open(door) -> None:
    """ClosedError where ``door`` (a vector env of either door) is closed."""
    if door.closed:
        raise ClosedError(f"this {type(door).__name__} is closed")


@overload
def check_seed(seed: None, where: str) -> None: ...
@overload
def check_seed(seed: int | np.integer, where: str) -> int: ...
def check_seed(seed, where: str) -> int | None:
    """A seed: None or a non-negative int, else ValueError naming ``where``."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"{where} must be a non-negative int or None, got {seed!r}")
    return int(seed)


def check_timeout(timeout) -> None:
    """A wait's ``timeout``: a non-negative number of seconds, else ValueError."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ValueError(f"timeout must be a non-negative number of seconds or None, got {timeout!r}")


def check_num_workers(num_workers) -> tuple[bool, int | None]:
    """Whether ``num_workers`` asks for the timed layout ("auto"), and the count it
    gives otherwise (None: the default; a number is checked where it is used). Any
    other string raises ValueError."""
    if isinstance(num_workers, str):
        if num_workers != "auto":
            raise ValueError(f"num_workers must be a positive int, None or 'auto', got {num_workers!r}")
        return True, None
    return False, num_workers


class EngineDoor:
    closed: bool
    num_envs: int
    close: Callable[..., None]  # each door's own (gymnasium's VectorEnv.close, SubprocVecEnv.close)
    _engine: Engine
    _workers_share_our_cores = True  # False for Ray's doors: actors may run elsewhere

    def _make_engine(
        self, env_fns, options: EngineOptions, num_workers: int | None, placement="contiguous", env_costs=None
    ) -> Engine:
        """The engine behind this door (``fastvec.ray``'s doors build a ``RayEngine``)."""
        return Engine(env_fns, options, num_workers=num_workers, placement=placement, env_costs=env_costs)

    def _open_door(self, engine: Engine, copy: bool, torch: TorchThreads) -> None:
        self._engine = engine
        self.copy = bool(copy)
        self._slot = 0  # the slot whose results were returned last
        self._next_slot = 0  # the slot a step in flight writes
        self.waiting = False
        # The caller's torch gets the cores the workers leave (only they share ours).
        torch.num_workers = engine.num_workers if self._workers_share_our_cores else None
        self._torch = torch
        torch.apply()

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def worker_pids(self) -> list[int]:
        return self._engine.worker_pids

    @property
    def num_workers(self) -> int:
        return self._engine.num_workers

    @property
    def placement(self):
        """Which envs each worker runs and what each costs per step, measured in the
        workers' step loop (a ``fastvec.PlacementReport``; ``print`` it for a table)."""
        self._check_open()
        report = getattr(self._engine, "placement_report", None)
        if report is None:
            raise NotImplementedError(f"{type(self).__name__} has no worker placement to report")
        return report()

    def _check_open(self) -> None:
        check_open(self)

    def _free_slot(self) -> int:
        return (self._slot + 1) % self._engine.num_slots

    _writable_views = False  # copy=False: read-only views (the gymnasium door's are writable)

    def _observation(self, slot: int):
        return self._engine.observation(slot, self.copy, self._writable_views)

    def _send_step(self, actions) -> None:
        self._check_open()
        if self.waiting:
            raise PendingCallError(
                "Calling `step_async` while waiting for a pending call to `step` to "
                "complete (step_async() twice without step_wait()).",
                "step",
            )
        slot = self._free_slot()
        self._engine.step_async(actions, slot)
        self._next_slot = slot
        self.waiting = True

    def _receive_step(self, timeout: float | None | EllipsisType = ...) -> StepResult:
        """Wait for the step in flight."""
        self._check_open()
        if not self.waiting:
            raise NoPendingCallError("Calling `step_wait` without any prior call to `step_async`.", "step")
        self.waiting = False
        result = self._engine.step_wait(timeout)
        self._slot = self._next_slot
        return result

    def _step(self, actions) -> StepResult:
        """``_send_step`` and ``_receive_step`` in one go, through the engine's fused step."""
        self._check_open()
        if self.waiting:
            raise PendingCallError(
                "Calling `step` while waiting for a pending call to `step` to complete "
                "(a step_async() waits for step_wait()).",
                "step",
            )
        slot = self._free_slot()
        result = self._engine.step(actions, slot)
        self._slot = self._next_slot = slot
        return result

    def _idle(self) -> None:
        """Before any other command: open, and no step left in flight."""
        self._check_open()
        self._torch.apply()  # torch may have been imported since the door opened
        if self.waiting:
            self.waiting = False
            self._engine.step_wait()
            self._slot = self._next_slot

    def _close_door(self) -> None:
        self.waiting = False
        if hasattr(self, "_torch"):
            self._torch.restore()
        if hasattr(self, "_engine"):
            self._engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        return f"fastvec.{type(self).__name__}(num_envs={self.num_envs}, num_workers={self._engine.num_workers})"
