"""``Engine``'s batch groups: some workers step while others wait for the caller.

``fastvec.doors.batches`` (and the trainer's env groups) step whole workers' envs
apart from the rest: a step is sent to a group's workers only (``group_send``), waited
for (``group_poll``, ``group_ready``) and collected from them only (``group_recv``).
``Engine._pending_groups`` holds ``{worker: slot}`` of the steps in flight.
"""

from __future__ import annotations

from types import EllipsisType

import numpy as np

from . import channel
from . import protocol as P
from .actions import ActionWriter
from .base import IN_SLOT
from .infos import StepResult
from .protocol import WaitResult
from .replies import TABLE_REPORT

__all__ = ["BatchGroups"]

_WAIT_TIMEOUT = WaitResult.TIMEOUT


class BatchGroups:
    """``Engine``'s steps of some workers at a time (uses ``_ctl``, the doorbells, and
    the step path's ``_collect``, ``_finish_step`` and ``_result``)."""

    _pending_groups: dict | None  # EngineBase's: {worker: slot} of the steps in flight

    def group_send(self, workers: np.ndarray, envs: tuple, arrays: list, writer: ActionWriter, slot: int) -> None:
        """Start a step of ``workers`` (the whole workers running envs ``[a, b)``) on
        ``arrays``, the actions of those envs checked by ``writer``, writing into ``slot``;
        ``arrays=IN_SLOT``: the caller wrote them into the slot already (the trainer)."""
        self._check_step_slot(slot, batches_ok=True)  # closed, broken, a lock-step command in flight
        if self._pending_groups is None:
            self._pending_groups = {}
        pending = self._pending_groups
        busy = [int(w) for w in workers if int(w) in pending]
        if busy:
            raise RuntimeError(f"worker {busy[0]} has a step in flight: group_recv it first")
        if arrays is not IN_SLOT:
            writer.write(arrays, self.act_bufs, slot, envs[0])
        if self._pickled_actions:
            self._send_pickled_step(workers, slot)
        else:
            for w in workers:
                try:
                    self._ctl.issue(int(w), P.CMD_STEP, slot)
                except (OSError, channel.PeerClosed):
                    raise self._fail(int(w), self._sup.death_message(int(w), "receiving a command")) from None
        for w in workers:
            pending[int(w)] = slot

    def _send_pickled_step(self, workers, slot: int) -> None:
        """A step whose actions have pickled leaves: each worker's rows go with its command."""
        rows = self._pickled
        assert rows is not None  # actions with pickled leaves have pickled rows
        self._send_commands(P.CMD_STEP, slot, {int(w): rows.action_rows(slot, self.worker_envs[w]) for w in workers})

    def group_poll(self, workers: np.ndarray, timeout: float) -> bool:
        """Whether ``workers``' step in flight is done (or failed) within ``timeout``."""
        status, _w = self._ctl.wait(workers, max(0.0, timeout))
        return status != _WAIT_TIMEOUT

    def group_ready(self, workers: np.ndarray, timeout: float | None) -> list[int]:
        """Those of ``workers`` (each with a step in flight) that are done, or failed:
        at least one unless ``timeout`` seconds (None: no limit) pass first. The first
        to finish rings (``Controller.wait_any``); ``group_recv`` then reads each."""
        done = [int(w) for w in workers if self._ctl.is_done(int(w))]
        if done or timeout == 0:
            return done
        status, w = self._ctl.wait_any(workers, -1.0 if timeout is None else float(timeout))
        done = [int(v) for v in workers if self._ctl.is_done(int(v))]
        if status in (WaitResult.DIED, WaitResult.GARBLED) and w not in done:
            done.append(int(w))  # dead or garbled: group_recv reports (or restarts) it
        return done

    def group_recv(
        self, workers: np.ndarray, slot: int, prev_slot: int, timeout: float | None | EllipsisType = ...
    ) -> StepResult:
        """Finish the step ``group_send`` started on ``workers``: its ``StepResult``
        (infos with global env indices). ``prev_slot``: where those envs' previous
        observations are (a replaced worker's envs end their episode with them)."""
        pending = self._pending_groups or {}
        if any(pending.get(int(w)) != slot for w in workers):
            raise RuntimeError(
                f"group_recv() of workers {list(map(int, workers))} in slot {slot} without their group_send()"
            )
        for w in workers:
            del pending[int(w)]
        if timeout is ...:
            timeout = self.step_timeout
        reports, failures = self._collect(workers, timeout, "stepping", slot=slot)
        self._last_slot = prev_slot
        if not failures and len(reports) < self.num_workers:
            if all(r is None for r in reports.values()):
                return StepResult(self, slot)  # no env of these workers had an info
            if all(r is TABLE_REPORT for r in reports.values()) and self._table.form is not None:
                # Every info in the table under one schema: the door reads these envs' rows
                # (StepResult.general() would read every env's: use group_columns instead).
                return StepResult(self, slot, table=self._table.form)
        return self._finish_step(slot, reports, failures)

    def group_columns(self, workers: np.ndarray, slot: int) -> StepResult:
        """A batch step's infos read from the table as columns of ``workers``' envs only."""
        return self._result(slot, dict.fromkeys((int(w) for w in workers), TABLE_REPORT))
