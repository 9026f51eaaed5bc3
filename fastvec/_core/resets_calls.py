"""``Engine``'s resets and calls: commands sent to the workers that run the envs named,
their replies gathered in env order (``reset_async``/``reset_wait``,
``call_async``/``call_wait``, ``poll`` for either, or for a step, in flight)."""

from __future__ import annotations

from types import EllipsisType

import numpy as np

from . import channel
from . import protocol as P
from .pickled import pickle_payloads
from .protocol import WaitResult
from .supervisor import CLOSE_GRACE_S

__all__ = ["ResetsAndCalls"]

_WAIT_TIMEOUT = WaitResult.TIMEOUT


class ResetsAndCalls:
    """``Engine``'s commands other than a step (uses ``_ctl``, the doorbells;
    ``_env_worker``/``_env_local``, where each env runs; ``WorkerReplies._gather``)."""

    _pending_cmd: tuple | None  # EngineBase's: the reset or call sent, not yet waited for

    def reset_async(self, slot: int, kwargs_per_env: dict[int, dict]) -> None:
        """Send the resets of ``reset`` (``reset_wait`` collects them)."""
        self._check_usable()
        targets: dict[int, list] = {}
        for i, kwargs in kwargs_per_env.items():
            targets.setdefault(int(self._env_worker[i]), []).append((int(self._env_local[i]), kwargs))
        self._send_commands(P.CMD_RESET, slot, targets)
        self._pending_cmd = ("reset", slot, sorted(targets))

    def reset_wait(self, timeout: float | None | EllipsisType = ...) -> dict[int, dict]:
        _, slot, workers = self._take_pending("reset")
        replies = self._gather(workers, self.step_timeout if timeout is ... else timeout, "resetting")
        infos = {}
        for w, recs in replies.items():
            envs = self.worker_envs[w]
            for j, info in self._reset_infos(w, slot, recs):
                infos[int(envs[j])] = info
        self._last_slot = slot
        return infos

    def call_async(self, kind: str, name, args=(), kwargs=None, indices=None, values=None) -> None:
        """Send the calls of ``call`` (``call_wait`` collects them)."""
        self._check_usable()
        indices = self.normalize_indices(indices)
        targets: dict[int, list] = {}
        for n, i in enumerate(indices):
            value = None if values is None else values[n]
            targets.setdefault(int(self._env_worker[i]), []).append((int(self._env_local[i]), value))
        per_worker = {w: (kind, name, tuple(args), dict(kwargs or {}), t) for w, t in targets.items()}
        self._send_commands(P.CMD_CALL, 0, per_worker)
        self._pending_cmd = ("call", indices, sorted(targets), f"{kind}({name!r})")

    def call_wait(self, timeout: float | None | EllipsisType = ...) -> list:
        _, indices, workers, doing = self._take_pending("call")
        replies = self._gather(workers, self.step_timeout if timeout is ... else timeout, doing)
        cursor = {w: iter(r) for w, r in replies.items()}
        return [next(cursor[int(self._env_worker[i])]) for i in indices]

    def poll(self, timeout: float) -> bool:
        """Whether the step, reset or call in flight has every reply in (or a failure to
        report) within ``timeout`` seconds; reads nothing, so the ``*_wait`` that follows
        gets it all. False: still running (call again, or wait)."""
        if self._pending_cmd is not None:
            workers = np.asarray(self._pending_cmd[2], dtype=np.intc)
        elif self._pending_slot is not None:
            workers = self._all_workers
        else:
            raise RuntimeError("poll() called with nothing in flight")
        status, _w = self._ctl.wait(workers, max(0.0, float(timeout)))
        return status != _WAIT_TIMEOUT

    def _drain_command(self) -> None:
        pending = self._pending_cmd
        assert pending is not None  # close() drains only a command in flight
        _, _slot, workers, *_ = pending
        self._pending_cmd = None
        self._gather(workers, CLOSE_GRACE_S, "closing")

    def _send_commands(self, cmd: int, slot: int, targets: dict) -> None:
        for w, blob in pickle_payloads(targets, "arguments for the workers").items():
            try:
                self._ctl.issue(w, cmd, slot, blob)
            except (OSError, channel.PeerClosed):
                raise self._fail(w, self._sup.death_message(w, "receiving a command")) from None
