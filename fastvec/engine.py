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
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
from collections.abc import Callable, Sequence
from types import EllipsisType

import numpy as np

from ._core import channel
from ._core import protocol as P
from ._core.actions import ActionWriter
from ._core.base import IN_SLOT, EngineBase
from ._core.infos import InfoTable, StepResult, join_parts
from ._core.infotable import mask_full
from ._core.pickled import PickledRows, pickle_payloads
from ._core.placement import PlacementReport, as_ranges, balance, check_placement_args, contiguous
from ._core.protocol import WaitResult
from ._core.replies import TABLE_REPORT, WorkerReplies
from ._core.segment import Ring, create_segment, layout_of, leaves_of, pickled_arrays, plan_segment
from ._core.supervisor import CLOSE_GRACE_S, Supervisor
from .errors import ClosedError, SpaceMismatchError, WorkerError
from .options import (
    EngineOptions,
    check_env_fns,
    check_positive_int,
    default_num_workers,
)

_MODE_CODES = {
    "same_step": P.AUTORESET_SAME_STEP,
    "next_step": P.AUTORESET_NEXT_STEP,
    "disabled": P.AUTORESET_DISABLED,
}

# The two wait results the step path tests, hoisted: a module global compares as fast as
# a bare int, where ``WaitResult.DONE`` costs an attribute lookup (~0.1 us) per step.
_WAIT_DONE = WaitResult.DONE
_WAIT_TIMEOUT = WaitResult.TIMEOUT


# How long each worker times its envs at start-up with placement="balanced" (seconds;
# at least PROBE_ROUNDS steps of each env, fastvec._core.worker).
PROBE_S = 0.2


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


class Engine(WorkerReplies, EngineBase):
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
            self,
            ctx,
            env_fns,
            self.worker_envs,
            num_envs,
            _MODE_CODES[opts.autoreset_mode],
            opts.daemon,
        )
        self._finalizer = self._sup.finalizer
        try:
            self._start(probe)
        except BaseException:
            self._finalizer()
            raise
        self._closed = False

    def _place(self, worker_envs: list[np.ndarray]) -> None:
        """Worker w runs envs ``worker_envs[w]`` (sorted); ``groups``: their ``[start,
        stop)`` runs when each worker's envs are one run in worker order (batches need
        that), else None."""
        self.worker_envs = worker_envs
        self.groups = as_ranges(worker_envs)
        self._env_worker = np.empty(self.num_envs, dtype=np.intp)
        self._env_local = np.empty(self.num_envs, dtype=np.intp)
        for w, envs in enumerate(worker_envs):
            self._env_worker[envs] = w
            self._env_local[envs] = np.arange(envs.size)

    # ------------------------------------------------------------------ start-up
    def _start(self, probe: bool) -> None:
        self._all_workers = np.arange(self.num_workers, dtype=np.intc)
        for w in range(self.num_workers):
            self._sup.spawn(w, PROBE_S if probe else 0.0)
        if probe:  # Phase 0: time the envs, place them by cost, then build them.
            costs = self._read_replies(range(self.num_workers), "timing the envs (placement probe)")
            env_ns = np.empty(self.num_envs)
            for w, envs in enumerate(self.worker_envs):
                env_ns[envs] = costs[w]
            self._placed_by = env_ns / 1e3
            self._place(balance(self._placed_by, self.num_workers))
            self._sup.place(self.worker_envs)
            for w in range(self.num_workers):
                self._sup.build(w)

        # Phase 1: every worker builds its envs and reports their spaces.
        replies = self._read_replies(range(self.num_workers), "starting")
        per_env: list = [None] * self.num_envs
        for w, envs in enumerate(self.worker_envs):
            for i, entry in zip(envs, replies[w]):
                per_env[i] = entry
        obs_space, act_space, metadata, render_mode, spec = per_env[0]
        self._check_spaces(per_env, obs_space, act_space, range(self.num_envs))
        self.env_observation_spaces = [entry[0] for entry in per_env]
        self.single_observation_space = obs_space
        self.single_action_space = act_space
        self.env_metadata = metadata
        self.render_mode = render_mode
        self.spec = spec
        allow = self.options.pickled_leaves
        self.obs_leaves_info = leaves_of(obs_space, pickled=allow)
        self.act_leaves_info = leaves_of(act_space, pickled=allow)
        self._action_writer = ActionWriter(act_space, self.num_envs, self.options.action_check)

        # Phase 2: one segment for everything, laid out once.
        plan = plan_segment(
            obs_space, act_space, self.num_slots, self.num_envs, self.num_workers, P.CTL_COLS, P.INFO_COLS
        )
        segment = create_segment(plan.size)
        self._sup.segment_box.append(segment)
        self.shm_name = segment.name
        # where each array lies in the segment: another process maps the same arrays with
        # SegmentPlan.from_entries(segment_entries).arrays(attach_segment(shm_name))
        self.segment_entries = list(plan.entries)
        arrays = plan.arrays(segment.buf)
        arrays.update(pickled_arrays(obs_space, act_space, self.num_slots, self.num_envs))
        self._bind_ring(arrays)
        self._pickled = PickledRows.of(Ring.of(arrays), self.obs_leaves_info, self.act_leaves_info)
        self._pickled_actions = self._pickled is not None and bool(self._pickled.act)
        self._table = InfoTable(arrays["info_table"], arrays["info_mask"], self.worker_envs, P.INFO_COLS)
        self._env_cost = arrays["env_cost"]
        # step()'s action fast path: one plain leaf with a compiled bounds check.
        writer = self._action_writer
        self._fast_action = None if writer.nested or writer.checks[0].fast is None else writer.checks[0]
        self._ctl = channel.Controller(arrays["ctl"], self._sup.fds, _spin_arg(self.main_spin_us))
        self._attach_payload = pickle.dumps((segment.name, plan.entries, obs_space, act_space, _spin_arg(self.spin_us)))
        self._attach(range(self.num_workers))

    def _attach(self, workers) -> None:
        for w in workers:
            channel.send_header(int(self._sup.fds[w]), P.CMD_SPACES, 0, 0, self._attach_payload)
        self._read_replies(workers, "attaching shared memory")

    def _read_replies(self, workers, doing: str) -> dict:
        return self._decode(self._sup.read_replies(workers, self.options.start_timeout, doing, self._fail), doing)

    def _check_spaces(self, per_env, obs_space, act_space, indices) -> None:
        """Every env's spaces (``per_env``, those of envs ``indices``) against env 0's."""
        layout = self.options.space_check == "layout"
        for i, (o, a, *_rest) in zip(indices, per_env):
            for what, mine, want in (("observation", o, obs_space), ("action", a, act_space)):
                lax = layout and what == "observation"
                if lax and (mine_layout := layout_of(mine)) is not None and mine_layout == layout_of(want):
                    continue
                if mine != want:
                    if lax:
                        rule = f"share the leaves, shapes and dtypes of their {what} spaces"
                    else:
                        rule = f"share their {what} spaces"
                        if what == "observation":  # gymnasium's words, for its users
                            rule += (
                                " (the sub-environments observation spaces are not equivalent. If this "
                                "is intentional, use `observation_mode='different'` instead.)"
                            )
                    raise SpaceMismatchError(
                        f"env {i} has {what} space {mine}, but env 0 has {want}: all envs of a vector env must {rule}"
                    )

    def _replace(self, w: int, slot: int) -> dict[int, dict]:
        """Replace worker w by a fresh process, reset its envs into ``slot``.

        Returns {env_index: reset info}. Raises WorkerError if the new worker fails too.
        """
        self._sup.stop(w)
        self._sup.spawn(w)
        self._ctl.forget(w)
        self._table.forget(w)
        replies = self._read_replies([w], "restarting")
        envs = self.worker_envs[w]
        self._check_spaces(replies[w], self.single_observation_space, self.single_action_space, envs)
        self._attach([w])
        self._send_commands(P.CMD_RESET, slot, {w: [(j, {}) for j in range(envs.size)]})
        recs = self._reset_infos(w, slot, self._gather([w], self.step_timeout, "resetting restarted envs")[w])
        return {int(envs[j]): info for j, info in recs}

    def _reset_infos(self, w: int, slot: int, reply) -> list:
        """A reset reply's ``[(local env, info)]``, its pickled rows written into ``slot``."""
        if self._pickled is None:
            return reply
        return self._pickled.take_reset(slot, self.worker_envs[w], reply)

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

    # ------------------------------------------------------------------ batch groups
    # Some workers step while others wait for the caller (fastvec.doors.batches): a step
    # is sent to a batch group's workers only and collected from them only.
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

    # ------------------------------------------------------------------ commands
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


def _spin_arg(spin_us: float | None) -> float:
    """The channel's spin argument: < 0 asks for waits that learn the loop."""
    return -1.0 if spin_us is None else float(spin_us)
