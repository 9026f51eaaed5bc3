"""The gymnasium door's calls: those in flight (gymnasium's ``*_async``/``*_wait``
pairs, at most one at a time) and the calls to the envs themselves (``call``,
``get_attr``, ``set_attr``, ``render``). Mixins of ``fastvec.AsyncVectorEnv``.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from ..errors import NoPendingCallError, PendingCallError
from .base import EngineDoor, check_timeout
from .batches import Batches

__all__ = ["PendingCalls", "EnvCalls"]


class PendingCalls(EngineDoor):
    """The call sent and not yet waited for, as gymnasium keeps it: another command
    before its ``*_wait`` raises ``PendingCallError``."""

    _batches: Batches
    _pending: tuple | None = None  # ("reset", slot, targets) or ("call",) sent, not waited for

    def _no_pending(self, what: str) -> None:
        if self._pending is not None:
            raise PendingCallError(
                f"Calling `{what}` while waiting for a pending call to `{self._pending[0]}` to complete.",
                self._pending[0],
            )

    def _idle(self, what: str = "this") -> None:
        """Before a command: open, and (as gymnasium) no call in flight."""
        self._check_open()
        self._no_pending(what)
        if self.waiting:
            raise PendingCallError(f"Calling `{what}` while waiting for a pending call to `step` to complete.", "step")
        self._batches.check_lockstep(what)
        self._torch.apply()  # torch may have been imported since the door opened

    def _take(self, what: str, timeout) -> tuple:
        """The pending ``what`` call, now taken (after waiting ``timeout`` for it)."""
        self._check_open()
        if self._pending is None or self._pending[0] != what:
            raise NoPendingCallError(f"Calling `{what}_wait` without any prior call to `{what}_async`.", what)
        if timeout is not None:
            self._poll_or_raise(f"{what}_wait", timeout)
        pending, self._pending = self._pending, None
        return pending

    def _poll_or_raise(self, what: str, timeout) -> None:
        check_timeout(timeout)
        if not self._engine.poll(float(timeout)):
            raise multiprocessing.TimeoutError(
                f"The call to `{what}` has timed out after {timeout} second(s) (still in flight: "
                f"call `{what}` again to get its results)."
            )


class EnvCalls(PendingCalls):
    """gymnasium's calls to every env: a method, an attribute read or set, a frame."""

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        self.call_async(name, *args, **kwargs)
        return self.call_wait()

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Send ``call(name, *args, **kwargs)`` to every env; ``call_wait`` returns the results."""
        self._idle("call_async")
        self._engine.call_async("call", name, args, kwargs)
        self._pending = ("call",)

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """The results of ``call_async``, env by env; ``timeout`` as ``reset_wait``'s."""
        self._take("call", timeout)
        return tuple(self._engine.call_wait())

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        self._idle("set_attr")
        if not isinstance(values, (list, tuple)):
            values = [values for _ in range(self.num_envs)]
        if len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {self.num_envs} environments."
            )
        self._engine.call("set_wrapper_attr", name, values=list(values))

    def render(self) -> tuple | None:
        self._idle("render")
        return tuple(self._engine.call("render", None))
