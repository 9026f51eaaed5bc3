"""The engine: worker processes, one shared-memory segment, tiny control messages.

Both front doors (``fastvec.SubprocVecEnv`` and ``fastvec.AsyncVectorEnv``) and the
trainer drive an ``Engine``; none of them touches a socket. The engine lays out the
segment from the spaces, writes actions into a slot, wakes the workers with one
16-byte header each, and turns every failure into a ``WorkerError``. What it returns
from a step is a ``StepResult`` (see ``fastvec._core.infos``); what is common to every
engine (slots, action checks, the order of a step, restarts) is ``EngineBase``.

Slots: every array in the segment has a leading ``num_slots`` axis. A step reads its
actions from slot k and writes its results into slot k, so results of earlier steps
stay readable in place until their slot is reused.

``Engine`` itself holds the constructor, the fused lock-step ``step``, the diagnostics
and closing; its other parts are mixins in ``fastvec._core``: ``WorkerStartup``
(``startup``: spawning, placing, laying out the segment, replacing a worker),
``BatchGroups`` (``batch_groups``: ``group_send``/``group_ready``/``group_recv``),
``ResetsAndCalls`` (``resets_calls``) and ``WorkerReplies`` (``replies``: reading the
workers' replies).
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Sequence
from types import EllipsisType

import numpy as np

from ._core import channel
from ._core import protocol as P
from ._core.base import IN_SLOT, EngineBase
from ._core.batch_groups import BatchGroups
from ._core.infos import StepResult, join_parts
from ._core.infotable import mask_full
from ._core.placement import PlacementReport, balance, check_placement_args, contiguous
from ._core.protocol import WaitResult
from ._core.replies import TABLE_REPORT, WorkerReplies
from ._core.resets_calls import ResetsAndCalls
from ._core.startup import PROBE_S, WorkerStartup
from ._core.supervisor import CLOSE_GRACE_S, Supervisor
from .errors import ClosedError, WorkerError
from .options import (
    EngineOptions,
    check_env_fns,
    check_positive_int,
    default_num_workers,
)

__all__ = ["IN_SLOT", "PROBE_S", "Engine", "batch_fits", "batch_workers"]

_MODE_CODES = {
    "same_step": P.AUTORESET_SAME_STEP,
    "next_step": P.AUTORESET_NEXT_STEP,
    "disabled": P.AUTORESET_DISABLED,
}

# The two wait results the step path tests, hoisted: a module global compares as fast as
# a bare int, where ``WaitResult.DONE`` costs an attribute lookup (~0.1 us) per step.
_WAIT_DONE = WaitResult.DONE


def batch_fits(num_workers: int, num_envs: int, batch_size: int, mode: str = "groups") -> bool:
    """Whether ``num_workers`` workers can serve batches of ``batch_size`` of ``num_envs``
    envs. Groups: each of the ``num_envs / batch_size`` groups gets whole workers with as
    many envs each. Ready: a batch is whole workers' envs, so their shares divide it."""
    if mode == "ready":
        return num_envs % num_workers == 0 and batch_size % (num_envs // num_workers) == 0
    groups = num_envs // batch_size
    return num_workers % groups == 0 and batch_size % (num_workers // groups) == 0


def batch_workers(num_workers: int | None, num_envs: int, batch_size: int, cores: int, mode: str = "groups") -> int:
    """Workers for batches of ``batch_size`` envs (the gymnasium door's ``batch_size``,
    the trainer's ``env_groups``). Groups: each of the ``num_envs / batch_size`` groups
    needs whole workers of its own with as many envs each, so the count is a multiple of
    the number of groups whose share divides ``batch_size``. Ready: a batch is whole
    workers' envs, so the count divides ``num_envs`` into shares that divide
    ``batch_size``. Default: about ``min(num_envs, cores)``."""
    groups = num_envs // batch_size
    if mode == "ready":
        if num_workers is None:  # at least num_envs / batch_size: a batch is not every env
            return min(
                w
                for w in range(max(min(num_envs, cores), groups), num_envs + 1)
                if batch_fits(w, num_envs, batch_size, mode)
            )
        if not batch_fits(num_workers, num_envs, batch_size, mode):
            raise ValueError(
                f"num_workers={num_workers} must divide num_envs={num_envs} into shares that divide "
                f"batch_size={batch_size}: batch_mode='ready' returns whole workers' envs"
            )
        return num_workers
    if num_workers is None:
        want = max(1, -(-min(num_envs, cores) // groups))  # workers per group
        per = max(d for d in range(1, want + 1) if batch_size % d == 0)
        return groups * per
    if not batch_fits(num_workers, num_envs, batch_size, mode):
        raise ValueError(
            f"num_workers={num_workers} must be a multiple of num_envs / batch_size = {groups} "
            f"whose share per group divides batch_size={batch_size}: each batch group runs on "
            "workers of its own, with as many envs each"
        )
    return num_workers


class Engine(WorkerStartup, BatchGroups, ResetsAndCalls, WorkerReplies, EngineBase):
    """Runs ``len(env_fns)`` envs in ``num_workers`` processes over shared memory.

    Parameters
    ----------
    env_fns : sequence of callables
        Each returns a gymnasium env; pickled with cloudpickle (lambdas work).
    options : EngineOptions, optional
        How to run them (``fastvec.options.EngineOptions``: ``num_slots``,
        ``autoreset_mode``, ``context``, ``step_timeout``, ``start_timeout``,
        ``restart_on_error``, ``spin_us``, ``main_spin_us``); its fields may also be
        given as keywords.
    num_workers : int, optional
        Worker processes; defaults to ``min(num_envs, cores)`` (or the length of an
        explicit ``placement``).
    placement : "contiguous", "balanced" or a list of env index lists
        Which envs each worker runs (``worker_envs[w]``); env ``i``'s results are at
        index ``i`` whatever the placement. "contiguous" (default): runs of envs whose
        sizes differ by at most one. "balanced": by cost, so that every worker's share
        of a lock-step step costs about the same (``fastvec._core.placement.balance``);
        the costs are ``env_costs`` when given, else each worker times throwaway
        instances of its envs for about ``PROBE_S`` seconds at start-up. A list: one
        list of env indices per worker, every env exactly once.
    env_costs : sequence of float, optional
        One relative cost per env (say, microseconds per step) for
        ``placement="balanced"``, instead of the probe.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable],
        options: EngineOptions | None = None,
        *,
        num_workers: int | None = None,
        placement: str | Sequence[Sequence[int]] = "contiguous",
        env_costs: Sequence[float] | None = None,
        **option_kwargs,
    ):
        self._closed = True  # until fully started
        self._take_options(EngineOptions(**option_kwargs) if options is None else options.replace(**option_kwargs))
        env_fns = check_env_fns(env_fns)
        num_envs = len(env_fns)
        mode, given, costs, num_workers = check_placement_args(placement, env_costs, num_envs, num_workers)
        if num_workers is None:
            num_workers = default_num_workers(num_envs)
        num_workers = check_positive_int(num_workers, "num_workers")
        if num_workers > num_envs:
            raise ValueError(f"num_workers={num_workers} exceeds num_envs={num_envs}")
        self.placement_mode = mode
        self._placed_by = costs  # the costs a balanced placement was chosen from (probed: after the probe)
        if given is None and costs is not None:
            given = balance(costs, num_workers)
        probe = mode == "balanced" and given is None and num_workers > 1
        opts = self.options
        # None: waits that learn the loop (csrc/fastvec/_core/forecast.pxd); a number: a fixed spin, then sleep.
        self.spin_us = opts.spin_us
        self.main_spin_us = opts.main_spin_us
        ctx = mp.get_context(opts.context)
        self.context = ctx.get_start_method()
        self.num_envs = num_envs
        self.num_workers = num_workers
        self._place(contiguous(num_envs, num_workers) if given is None else given)
        self.restarts: list[dict] = []  # one record per worker replaced
        self._sup = Supervisor(
            self, ctx, env_fns, self.worker_envs, mode=_MODE_CODES[opts.autoreset_mode], daemon=opts.daemon
        )
        self._finalizer = self._sup.finalizer
        try:
            self._start(probe)
        except BaseException:
            self._finalizer()
            raise
        self._closed = False

    # ------------------------------------------------------------------ plumbing
    @property
    def worker_pids(self) -> list[int]:
        return self._sup.pids

    def wait_counts(self) -> dict:
        """How the waits went so far (a diagnostic: ``benchmarks/bench_loops.py``, the tests).
        ``parent``: of its waits for the workers' replies, how many napped towards a
        forecast and how many slept until a worker rang; ``workers[w]``: the same for
        worker w's waits for the next command. Every other wait was spun through. A
        replaced worker counts from 0. ``lost`` (each side): sleeps that ended on the
        periodic look at the flags (every 100 ms) with what they waited for already
        there, the doorbell that should have woken them never rung; 0 unless
        something is wrong. ``long`` (each side): waits forecast past the spin-through
        (``forecast.pxd``), the only ones that may nap (one whose nap would end at once
        is spun through all the same)."""
        if self._closed:
            raise ClosedError("this vector env is closed")
        keys = ("naps", "sleeps", "lost", "long")
        workers = [dict(zip(keys, self._ctl.worker_waits(w))) for w in range(self.num_workers)]
        ctl = self._ctl
        return {"parent": dict(zip(keys, map(int, (ctl.naps, ctl.sleeps, ctl.lost, ctl.longs)))), "workers": workers}

    def placement_report(self) -> PlacementReport:
        """Which envs each worker runs and what they cost per step, measured in the
        workers' step loop since start-up (``fastvec._core.placement``)."""
        if self._closed:
            raise ClosedError("this vector env is closed")
        ns, steps = self._env_cost[:, 0].astype(np.float64), self._env_cost[:, 1]
        env_us = np.where(steps > 0, ns / np.maximum(steps, 1) / 1e3, np.nan)
        return PlacementReport(
            workers=tuple(tuple(int(i) for i in envs) for envs in self.worker_envs),
            env_us=tuple(float(x) for x in env_us),
            share_us=tuple(float(np.nansum(env_us[envs])) for envs in self.worker_envs),
            mode=self.placement_mode,
            probe_us=None if self._placed_by is None else tuple(float(x) for x in self._placed_by),
        )

    def envs_of(self, w: int) -> np.ndarray:
        return self.worker_envs[w]

    def pause(self, envs, paused: bool = True) -> None:
        """From the next step on, leave the envs ``envs`` (indices) unstepped (``paused``),
        or step them again: a paused env keeps its state, mid-episode too, and its rows of
        a step read a reward of 0, no end and whatever observation the slot held before.
        Resets still reach it. What a population's members that have finished ask for
        (``fastvec.train``): their envs no longer cost their workers a step."""
        if self._closed:
            raise ClosedError("this vector env is closed")
        idx = np.asarray(envs)
        if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
            raise ValueError(f"pause takes a sequence of env indices, got {envs!r}")
        idx = idx.astype(np.int64)  # (an empty list: no env)
        bad = idx[(idx < 0) | (idx >= self.num_envs)]
        if bad.size:
            raise ValueError(f"pause: env {int(bad[0])} is not one of the {self.num_envs} envs")
        self._paused[idx] = 1 if paused else 0

    def _unit(self, w: int) -> str:
        return f"worker {w}"

    def _fail(self, w: int, message: str, **extra) -> WorkerError:
        self._broken = message
        return WorkerError(message, worker=w, env_indices=self.worker_envs[w].tolist(), **extra)

    # ------------------------------------------------------------------ stepping
    def _dispatch(self, slot: int) -> None:
        if self._pickled_actions:
            self._send_pickled_step(range(self.num_workers), slot)
            return
        try:
            self._ctl.issue_all(P.CMD_STEP, slot)
        except OSError as exc:
            raise self._fail(0, f"could not reach the workers: {exc}") from None

    def step(self, actions, slot: int, timeout: float | None | EllipsisType = ...) -> StepResult:
        """``step_async`` then ``step_wait``, fused for the common step: the doorbells
        are rung and waited for in one compiled call (so a worker sharing the parent's
        CPU gets it at once), and a step whose replies are all payload-less is read
        from shared memory alone. The parent runs this with caches cold from the envs
        that just ran on its core: on Pong the layered path took ~55 us of a ~1.8 ms
        step, this one ~36 us."""
        if self._pickled_actions:  # the actions travel with the commands: the layered path
            return super().step(actions, slot, timeout)
        fast = self._fast_action
        self._check_step_slot(slot)
        if (
            fast is not None
            and type(actions) is np.ndarray
            and actions.shape == fast.shape
            and fast.fast_in_bounds(actions)
        ):
            self.act_bufs[0][slot] = actions
        elif actions is not IN_SLOT:  # anything else: the full checks, which word every error
            self._action_writer.write(self._action_writer.validate(actions), self.act_bufs, slot)
        if timeout is ...:
            timeout = self.step_timeout
        try:
            waited = self._ctl.issue_all_wait(P.CMD_STEP, slot, self._all_workers, -1.0 if timeout is None else timeout)
        except channel.DoorbellError as exc:
            raise self._fail(0, f"could not reach the workers: {exc}") from None
        except KeyboardInterrupt:
            self._broken = "interrupted while waiting for the workers"
            raise
        if waited[0] == _WAIT_DONE:
            n_table = self._ctl.plain_step_replies(slot)
            if n_table == 0:  # no env had an info to report
                self._last_slot = slot
                return StepResult(self, slot)
            if n_table == self.num_workers and (table := self._table.form) is not None:
                self._last_slot = slot
                return StepResult(self, slot, table=table)
        # Anything else (payloads, errors, a dead or silent worker): the general path,
        # starting from what this wait found.
        reports, failures = self._collect(range(self.num_workers), timeout, "stepping", slot=slot, waited=waited)
        return self._finish_step(slot, reports, failures)

    def _collect_step(self, slot: int, timeout):
        return self._collect(range(self.num_workers), timeout, "stepping", slot=slot)

    def _result(self, slot: int, reports: dict) -> StepResult:
        """Workers' step reports -> one ``StepResult``."""
        if len(reports) == self.num_workers and all(r is TABLE_REPORT for r in reports.values()):
            table = self._table.form
            if table is not None:
                return StepResult(self, slot, table=table)
        parts, records = [], []
        for w, report in reports.items():
            if report is None:
                continue
            envs = self.worker_envs[w]
            if report[0] == "objs":  # pickled observation leaves, then the records (or None)
                assert self._pickled is not None  # only workers with pickled leaves send "objs"
                body = self._pickled.take_step(slot, envs, report)
                if body is not None:
                    records += [(int(envs[j]), step_info, reset_info) for j, step_info, reset_info in body]
                continue
            kind, body = report
            if kind == "table":
                parts.append((None, self._table.worker_columns(w, slot)))
            elif kind == "cols":
                parts.append((envs, body))
            else:
                records += [(int(envs[j]), step_info, reset_info) for j, step_info, reset_info in body]
        columns, records = join_parts(parts, records)
        return StepResult(self, slot, columns=columns, records=records)

    def table_general(self, slot: int) -> tuple:
        """``StepResult.general()`` of a step whose infos are all in the table."""
        return self._table.general(slot, mask_full)

    # ------------------------------------------------------------------ close
    def _drain(self) -> None:
        self._gather(range(self.num_workers), CLOSE_GRACE_S, "closing")

    def close(self) -> None:
        if self._pending_groups and self._broken is None and not self._closed:
            try:  # batch steps in flight finish first, so the workers are idle when told to close
                self._gather(sorted(self._pending_groups), CLOSE_GRACE_S, "closing")
            except Exception:
                pass
        self._pending_groups = None
        super().close()

    def _drop_views(self) -> None:
        super()._drop_views()
        self._ctl = None
        self._table = None  # type: ignore[assignment]  # closed: nothing reads it again (every call checks _closed first)
