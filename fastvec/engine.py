"""The engine: worker processes, one shared-memory segment, tiny control messages.

Both front doors (``fastvec.SubprocVecEnv`` and ``fastvec.AsyncVectorEnv``) and the
trainer drive an ``Engine``; none of them touches a socket. The engine lays out the
segment from the spaces, writes actions into a slot, wakes the workers with one
16-byte header each, and turns every failure into a ``WorkerError``.

Slots: every array in the segment has a leading ``num_slots`` axis. A step reads its
actions from slot k and writes its results into slot k, so results of earlier steps
stay readable in place until their slot is reused.
"""
from __future__ import annotations

import multiprocessing as mp
import operator
import os
import pickle
import time
import warnings
import weakref
from collections.abc import Callable, Sequence

import cloudpickle
import numpy as np
from gymnasium import spaces

from . import _engine as E
from .actions import ActionWriter
from .errors import ClosedError, WorkerError
from .infos import columns_to_records, join_parts, with_quiet_ends
from .layout import build_nested, leaves_of, map_nested, plan_segment, readonly_view
from .shm import create_segment, release_segment
from .worker import worker_main

AUTORESET_MODES = {
    "same_step": E.AUTORESET_SAME_STEP,
    "next_step": E.AUTORESET_NEXT_STEP,
    "disabled": E.AUTORESET_DISABLED,
}
_CLOSE_GRACE_S = 2.0
# How long a waiting side spins on shared memory (yielding the CPU) before sleeping on
# its socket. A socket wake-up costs ~25 us one way on a small VM: workers spin long
# enough to catch the parent's next command; the parent spins briefly. Measured on 2
# cores (CartPole-v1 and HalfCheetah-v5, 16 envs): 200/20 beat 50/20, 20/20 and 0/0,
# and spinning only while recent waits were short (an adaptive rule) lost to all.
DEFAULT_SPIN_US = 200.0
DEFAULT_MAIN_SPIN_US = 20.0
# A worker's step report when its infos are in the shared info table.
_TABLE_REPORT = ("table", None)


def _vector_dtype(kind, is_int: bool):
    """The dtype gymnasium's vector infos give a column of ``kind`` values, or None when
    it is the table's own int64/float64."""
    dtype = np.dtype(kind)
    return None if dtype == np.dtype(np.int64 if is_int else np.float64) else dtype


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def split_envs(num_envs: int, num_workers: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) groups whose sizes differ by at most one."""
    base, extra = divmod(num_envs, num_workers)
    groups, start = [], 0
    for w in range(num_workers):
        stop = start + base + (1 if w < extra else 0)
        groups.append((start, stop))
        start = stop
    return groups


def pickle_payloads(targets: dict, what: str) -> dict:
    """``{key: cloudpickled payload}``, all or nothing: a payload that cannot be pickled
    raises ValueError before anything is sent, so no worker is left with a command."""
    blobs = {}
    for key, payload in targets.items():
        try:
            blobs[key] = cloudpickle.dumps(payload)
        except Exception as exc:
            raise ValueError(f"could not pickle the {what}: {exc}") from None
    return blobs


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


def _check_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_timeout(value, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")
    return float(value)


def _index(i) -> int:
    if isinstance(i, bool):
        raise TypeError("bool is not an env index")
    return operator.index(i)


def _check_spin(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
        raise ValueError(f"{name} must be a number of microseconds in [0, 1e6), got {value!r}")
    return float(value)


def _shutdown(procs, conns, segment_box, grace: float) -> None:
    """Stop workers and free the segment. Module-level so a finalizer can call it
    without keeping the engine alive; safe to run twice.

    Closing our end of a worker's socket is the close command: the worker reads end of
    file, closes its envs and exits. Stragglers (an env stuck in a step) get SIGTERM,
    then SIGKILL.
    """
    procs = [p for p in procs if p is not None]
    for conn in conns:
        if conn is None:
            continue
        try:
            conn.close()
        except OSError:
            pass
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)
    for proc in procs:
        try:
            proc.close()
        except ValueError:
            pass
    segment = segment_box.pop() if segment_box else None
    release_segment(segment, unlink=True)


class EngineBase:
    """What every engine shares on its caller's side: the ring of result slots, action
    validation, step start-up and the views of observations. ``Engine`` (worker
    processes on this machine) and ``fastvec.ray.RayEngine`` (actors over a cluster)
    implement ``_start_step``, ``step_wait_report``, ``reset``, ``call`` and ``close``."""

    _closed: bool
    _broken: str | None

    def _start_step(self, slot: int) -> None:
        raise NotImplementedError

    def _bind_ring(self, arrays: dict) -> None:
        """The ring's arrays, by the names ``plan_segment`` gives them."""
        n_obs, n_act = len(self.obs_leaves_info), len(self.act_leaves_info)
        self.obs_bufs = [arrays[f"obs{i}"] for i in range(n_obs)]
        self.final_bufs = [arrays[f"final{i}"] for i in range(n_obs)]
        self.act_bufs = [arrays[f"act{i}"] for i in range(n_act)]
        self.rewards = arrays["rewards"]
        self.terminated = arrays["terminated"]
        self.truncated = arrays["truncated"]
        # A plain (not Dict/Tuple) observation: one leaf, handed out without rebuilding.
        self._flat_obs = n_obs == 1 and not isinstance(self.single_observation_space, (spaces.Dict, spaces.Tuple))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_usable(self) -> None:
        if self._closed:
            raise ClosedError("this vector env is closed")
        if self._broken is not None:
            raise WorkerError(f"the vector env is unusable after an earlier failure: {self._broken}; close it")
        if self._pending_slot is not None:
            raise RuntimeError("a step is in flight: call step_wait() before anything else")

    def validate_actions(self, actions) -> list[np.ndarray]:
        """Check a batch of actions; ValueError (with nothing dispatched) if bad."""
        return self._action_writer.validate(actions)

    def step_async(self, actions, slot: int) -> None:
        """Write ``actions`` into ``slot`` and wake every worker."""
        self._write_actions(actions, slot)
        self._start_step(slot)

    def _write_actions(self, actions, slot: int) -> None:
        self._check_step_slot(slot)
        self._action_writer.write(self._action_writer.validate(actions), self.act_bufs, slot)

    def step_async_written(self, slot: int) -> None:
        """Wake the workers for actions already written into ``act_bufs[.][slot]``."""
        self._check_step_slot(slot)
        self._start_step(slot)

    def step_report(self, actions, slot: int, timeout: float | None = ...):
        """``step_async`` then ``step_wait_report``: what a front door's ``step`` does."""
        self.step_async(actions, slot)
        return self.step_wait_report(timeout)

    def step_vector(self, actions, slot: int, timeout: float | None = ...):
        """``step_report`` for gymnasium's front door: ``(infos, columns, records)``.
        ``infos`` is gymnasium's vector-info dict when the engine built it directly (then
        ``columns`` and ``records`` are None); otherwise it is None and the other two are
        what ``step_report`` returns. This default has no faster way."""
        return (None, *self.step_report(actions, slot, timeout))

    def step_env_infos(self, actions, slot: int, timeout: float | None = ...):
        """``step_vector`` for SB3's front door: ``infos`` is then a list of per-env
        info dicts (the envs' own keys, values and types)."""
        return (None, *self.step_report(actions, slot, timeout))

    def _check_step_slot(self, slot: int) -> None:
        self._check_usable()
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot must be in [0, {self.num_slots}), got {slot}")

    def step_wait(self, timeout: float | None = ...) -> list:
        """Wait for the step in flight. Returns a list of ``(env_index, step_info,
        reset_info)`` for the envs that reported something (ended episodes, infos),
        in env order.
        """
        columns, records = self.step_wait_report(timeout)
        records = records if columns is None else columns_to_records(columns)
        if self.autoreset_mode == "same_step":
            records = with_quiet_ends(records, self.terminated[self._last_slot] | self.truncated[self._last_slot])
        return records

    def normalize_indices(self, indices) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        if isinstance(indices, (int, np.integer)) and not isinstance(indices, bool):
            indices = [indices]
        try:
            out = [_index(i) for i in indices]
        except TypeError:
            raise ValueError(f"indices must be None, an int or a sequence of ints, got {indices!r}") from None
        for i in out:
            if not -self.num_envs <= i < self.num_envs:
                raise ValueError(f"env index {i} out of range for {self.num_envs} envs")
        return [i % self.num_envs for i in out]

    def obs_view(self, slot: int, space=None):
        """The batched observation of ``slot`` as views (Dict/Tuple rebuilt)."""
        return build_nested(space or self.single_observation_space, [b[slot] for b in self.obs_bufs])[0]

    def observation(self, slot: int, copy: bool):
        """What a front door returns: fresh arrays, or read-only views into the ring."""
        if self._flat_obs:
            arr = self.obs_bufs[0][slot]
            return arr.copy() if copy else readonly_view(arr)
        return map_nested(np.copy if copy else readonly_view, self.obs_view(slot))

    def final_obs_of(self, slot: int, i: int):
        """A copy of env i's final observation of the episode that ended in ``slot``."""
        parts = [np.array(b[slot, i]) for b in self.final_bufs]
        return build_nested(self.single_observation_space, parts)[0]

    def obs_of(self, slot: int, i: int):
        parts = [np.array(b[slot, i]) for b in self.obs_bufs]
        return build_nested(self.single_observation_space, parts)[0]


class Engine(EngineBase):
    """Runs ``len(env_fns)`` envs in ``num_workers`` processes over shared memory.

    Parameters
    ----------
    env_fns : sequence of callables
        Each returns a gymnasium env; pickled with cloudpickle (lambdas work).
    num_workers : int, optional
        Worker processes; defaults to ``min(num_envs, cores)``.
    num_slots : int
        Depth of the ring of result slots (>= 1).
    autoreset_mode : {"same_step", "next_step", "disabled"}
        What a worker does when an episode ends (see ``_engine.Stepper.step``).
    context : str, optional
        Start method: "fork", "forkserver" or "spawn"; default: multiprocessing's.
    step_timeout : float, optional
        Seconds to wait for workers before raising ``WorkerError``; None waits forever
        (a dead worker is still noticed at once).
    start_timeout : float, optional
        Seconds to wait for workers to build their envs.
    restart_on_error : bool
        Replace a worker that died, hung past ``step_timeout`` or whose env raised in
        ``step``, reset its envs and go on (see ``step_wait``); ``restarts`` lists them.
    spin_us, main_spin_us : float, optional
        Microseconds a waiting worker (resp. the parent) polls shared memory, yielding
        the CPU, before it sleeps on its socket; 0 always sleeps.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable],
        *,
        num_workers: int | None = None,
        num_slots: int = 2,
        autoreset_mode: str = "same_step",
        context: str | None = None,
        step_timeout: float | None = None,
        start_timeout: float | None = 300.0,
        spin_us: float | None = None,
        main_spin_us: float | None = None,
        restart_on_error: bool = False,
    ):
        self._closed = True  # until fully started
        env_fns = check_env_fns(env_fns)
        num_envs = len(env_fns)
        if num_workers is None:
            num_workers = min(num_envs, available_cores())
        num_workers = _check_positive_int(num_workers, "num_workers")
        if num_workers > num_envs:
            raise ValueError(f"num_workers={num_workers} exceeds num_envs={num_envs}")
        self.num_slots = _check_positive_int(num_slots, "num_slots")
        if autoreset_mode not in AUTORESET_MODES:
            raise ValueError(f"autoreset_mode must be one of {sorted(AUTORESET_MODES)}, got {autoreset_mode!r}")
        self.autoreset_mode = autoreset_mode
        self.step_timeout = _check_timeout(step_timeout, "step_timeout")
        self.spin_us = _check_spin(DEFAULT_SPIN_US if spin_us is None else spin_us, "spin_us")
        self.main_spin_us = _check_spin(
            DEFAULT_MAIN_SPIN_US if main_spin_us is None else main_spin_us, "main_spin_us")
        start_timeout = _check_timeout(start_timeout, "start_timeout")
        if context is not None and context not in mp.get_all_start_methods():
            raise ValueError(f"context must be one of {mp.get_all_start_methods()}, got {context!r}")
        ctx = mp.get_context(context)
        self.context = ctx.get_start_method()

        self.num_envs = num_envs
        self.num_workers = num_workers
        self.groups = split_envs(num_envs, num_workers)
        self._env_worker = np.repeat(np.arange(num_workers), [b - a for a, b in self.groups])

        self._procs, self._conns = [], []
        self._segment_box: list = []
        self._finalizer = weakref.finalize(
            self, _shutdown, self._procs, self._conns, self._segment_box, _CLOSE_GRACE_S
        )
        self._broken: str | None = None
        self._pending_slot: int | None = None
        self._last_slot = 0
        self.restart_on_error = bool(restart_on_error)
        self.restarts: list[dict] = []  # one record per worker replaced
        try:
            self._start(ctx, env_fns, start_timeout)
        except BaseException:
            self._finalizer()
            raise
        self._closed = False

    # ------------------------------------------------------------------ start-up
    def _start(self, ctx, env_fns, start_timeout) -> None:
        self._ctx = ctx
        self._start_timeout = start_timeout
        self._blobs = [cloudpickle.dumps(list(env_fns[a:b])) for a, b in self.groups]
        self._fds = np.full(self.num_workers, -1, dtype=np.intc)
        self._all_workers = np.arange(self.num_workers, dtype=np.intc)
        for w in range(self.num_workers):
            self._conns.append(None)
            self._procs.append(None)
        for w in range(self.num_workers):
            self._spawn(w)

        # Phase 1: every worker builds its envs and reports their spaces.
        replies = self._gather_raw(range(self.num_workers), start_timeout, "starting")
        per_env = []
        for w in range(self.num_workers):
            per_env += replies[w]
        obs_space, act_space, metadata, render_mode, spec = per_env[0]
        self._check_spaces(per_env, obs_space, act_space, 0)
        self.single_observation_space = obs_space
        self.single_action_space = act_space
        self.env_metadata = metadata
        self.render_mode = render_mode
        self.spec = spec
        self.obs_leaves_info = leaves_of(obs_space)
        self.act_leaves_info = leaves_of(act_space)
        self._action_writer = ActionWriter(act_space, self.num_envs)

        # Phase 2: one segment for everything, laid out once.
        plan = plan_segment(obs_space, act_space, self.num_slots, self.num_envs, self.num_workers, E.CTL_COLS,
                            E.INFO_COLS)
        segment = create_segment(plan.size)
        self._segment_box.append(segment)
        self.shm_name = segment.name
        arrays = plan.arrays(segment.buf)
        self._bind_ring(arrays)
        n_obs, n_act = len(self.obs_leaves_info), len(self.act_leaves_info)
        self._info_f = arrays["info_table"]
        self._info_i = self._info_f.view(np.int64)
        self._info_mask = arrays["info_mask"]
        self._schemas: list[list] = [[] for _ in range(self.num_workers)]  # per worker: [(key, type, is_int)]
        self._uniform_schema: list | None = None  # every worker's schema, when they agree
        self._table_cols_for: list | None = None  # the schema _table_cols_spec was made for
        self._table_cols_spec: list | None = None
        # _step_table's action fast path: one plain leaf with a compiled bounds check.
        writer = self._action_writer
        self._fast_action = None if writer.nested or writer.checks[0].fast is None else writer.checks[0]
        self._ctl = E.Controller(arrays["ctl"], self._fds, self.main_spin_us)
        self._attach_payload = pickle.dumps(
            (segment.name, plan.entries, self.num_slots, obs_space, act_space, n_obs, n_act, self.spin_us)
        )
        self._attach(range(self.num_workers))

    def _spawn(self, w: int) -> None:
        """Start the process of worker w (again, after a failure)."""
        start, _stop = self.groups[w]
        parent, child = self._ctx.Pipe(duplex=True)
        # With fork the child inherits every socket of ours; it closes all but its own.
        close_fds = [c.fileno() for c in self._conns if c is not None] + [parent.fileno()] \
            if self._ctx.get_start_method() == "fork" else []
        proc = self._ctx.Process(
            target=worker_main,
            args=(w, child, self._blobs[w], start, self.num_envs,
                  AUTORESET_MODES[self.autoreset_mode], os.getpid(), close_fds),
            name=f"fastvec-worker-{w}",
            daemon=True,
        )
        try:
            proc.start()
        finally:
            child.close()
        self._conns[w] = parent
        self._procs[w] = proc
        self._fds[w] = parent.fileno()  # in place: the Controller reads this array

    def _attach(self, workers) -> None:
        for w in workers:
            E.send_header(int(self._fds[w]), E.CMD_SPACES, 0, 0, self._attach_payload)
        self._gather_raw(workers, self._start_timeout, "attaching shared memory")

    def _check_spaces(self, per_env, obs_space, act_space, first: int) -> None:
        for i, (o, a, *_rest) in enumerate(per_env, start=first):
            if o != obs_space:
                raise ValueError(
                    f"env {i} has observation space {o}, but env 0 has {obs_space}: "
                    "all envs of a vector env must share their spaces"
                )
            if a != act_space:
                raise ValueError(
                    f"env {i} has action space {a}, but env 0 has {act_space}: "
                    "all envs of a vector env must share their spaces"
                )

    def _restart(self, w: int, slot: int) -> dict[int, dict]:
        """Replace worker w by a fresh process, reset its envs into ``slot``.

        Returns {env_index: reset info}. Raises WorkerError if the new worker fails too.
        """
        proc = self._procs[w]
        if proc.is_alive():
            proc.terminate()
            proc.join(_CLOSE_GRACE_S)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        try:
            self._conns[w].close()
        except OSError:
            pass
        self._conns[w] = None
        proc.close()
        self._spawn(w)
        self._ctl.forget(w)
        self._set_schema(w, [])
        replies = self._gather_raw([w], self._start_timeout, "restarting")
        self._check_spaces(replies[w], self.single_observation_space, self.single_action_space,
                           self.groups[w][0])
        self._attach([w])
        a, b = self.groups[w]
        self._send_commands(E.CMD_RESET, slot, {w: [(j, {}) for j in range(b - a)]})
        recs = self._gather([w], self.step_timeout, "resetting restarted envs")[w]
        return {a + j: info for j, info in recs}

    # ------------------------------------------------------------------ plumbing
    @property
    def worker_pids(self) -> list[int]:
        return [int(p.pid) for p in self._procs]

    def _worker_desc(self, w: int) -> str:
        a, b = self.groups[w]
        pid = self._procs[w].pid if w < len(self._procs) else None
        return f"worker {w} (pid {pid}, envs {a}..{b - 1})"

    def _fail(self, w: int, message: str, **extra) -> WorkerError:
        self._broken = message
        return WorkerError(message, worker=w, env_indices=range(*self.groups[w]), **extra)

    def _death_message(self, w: int, doing: str) -> str:
        proc = self._procs[w]
        proc.join(0.5)
        code = proc.exitcode
        if code is None:
            how = "closed its control socket"
        elif code < 0:
            how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        return f"{self._worker_desc(w)} {how} while {doing}"

    def _gather_raw(self, workers, timeout, doing: str) -> dict:
        """Start-up replies, read straight off the sockets (no doorbells yet)."""
        from multiprocessing.connection import wait

        workers = list(workers)
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: dict[int, tuple] = {}
        by_conn = {id(self._conns[w]): w for w in workers}
        while len(replies) < len(workers):
            left = [self._conns[w] for w in workers if w not in replies]
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(left, remaining)
            if not ready:
                w = by_conn[id(left[0])]
                raise self._fail(w, f"{self._worker_desc(w)} did not answer within {timeout:g} s while {doing}")
            for conn in ready:
                w = by_conn[id(conn)]
                try:
                    cmd, rslot, arg, n = E.recv_header(conn.fileno())
                    replies[w] = (cmd, rslot, arg, E.recv_payload(conn.fileno(), n) if n else None)
                except E.PeerClosed:
                    raise self._fail(w, self._death_message(w, doing)) from None
                except ValueError as exc:
                    raise self._fail(w, f"{self._worker_desc(w)} sent a malformed message while {doing}: {exc}") from None
        return self._decode(replies, doing)

    def _gather(self, workers, timeout, doing: str, slot: int | None = None) -> dict:
        """Collect one reply from each worker in ``workers``: {worker: payload object}.

        A dead, silent or garbling worker breaks the engine (``WorkerError``); an env
        that raised is reported as ``WorkerError`` after every reply is in, and the
        engine stays usable.
        """
        results, failures = self._collect(workers, timeout, doing, slot)
        if failures:
            w, (exc, fatal) = next(iter(failures.items()))
            if fatal:
                self._broken = str(exc)
            raise exc
        return results

    def _collect(self, workers, timeout, doing: str, slot: int | None = None, waited: tuple | None = None):
        """Wait for every worker in ``workers``; never stop at the first failure, so the
        healthy workers' replies are consumed and they stay consistent. ``waited``: the
        ``(status, worker)`` a first wait over every worker already returned.

        Returns ``(results, failures)``: {w: payload object} and {w: (WorkerError, fatal)},
        fatal meaning the worker is dead, silent or garbling (not just an env that raised).
        """
        failures: dict[int, tuple] = {}
        pending = [int(w) for w in workers]
        # Every worker (a step): the first wait takes the precomputed array.
        first = self._all_workers if len(pending) == self.num_workers else None
        deadline = None if timeout is None else time.monotonic() + timeout

        def fail(w, message):
            failures[w] = (WorkerError(message, worker=w, env_indices=range(*self.groups[w])), True)

        try:
            while pending:
                left = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
                if waited is not None:
                    status, w = waited
                    waited = None
                else:
                    status, w = self._ctl.wait(first if first is not None else np.asarray(pending, dtype=np.intc), left)
                first = None
                if status == 0:
                    break
                if status == 2:
                    fail(w, self._death_message(w, doing))
                    pending.remove(w)
                    continue
                if status == 3:
                    fail(w, f"{self._worker_desc(w)} sent a malformed message while {doing}")
                    pending.remove(w)
                    continue
                for v in list(pending):  # timed out: every worker still silent has failed
                    if not self._ctl.is_done(v):
                        fail(v, f"{self._worker_desc(v)} did not answer within {timeout:g} s while {doing}")
                        pending.remove(v)
        except KeyboardInterrupt:
            # Replies still in flight would be mistaken for later ones: give up on this engine.
            self._broken = "interrupted while waiting for the workers"
            raise
        if slot is not None and not failures and len(workers) == self.num_workers:
            # The common step: payload-less DONEs, infos (if any) in the table.
            n_table = self._ctl.plain_step_replies(slot)
            if n_table == 0:
                return dict.fromkeys(range(self.num_workers)), failures
            if n_table == self.num_workers:
                return dict.fromkeys(range(self.num_workers), _TABLE_REPORT), failures
        replies = {}
        for w in workers:
            w = int(w)
            if w in failures:
                continue
            try:
                replies[w] = self._ctl.reply(w)
            except E.PeerClosed:
                fail(w, self._death_message(w, doing))
                continue
            except ValueError as exc:
                fail(w, f"{self._worker_desc(w)} sent a malformed message while {doing}: {exc}")
                continue
            if slot is not None and replies[w][0] == E.REPLY_DONE and replies[w][1] != slot:
                fail(w, f"{self._worker_desc(w)} answered for slot {replies[w][1]} instead of {slot} while {doing}")
                del replies[w]
        results = {}
        for w, reply in replies.items():
            before = self._broken
            try:
                results.update(self._decode({w: reply}, doing))
            except WorkerError as exc:
                failures[w] = (exc, self._broken is not before)  # _decode marks garbage fatal
                self._broken = before
        return results, failures

    def _decode(self, replies: dict, doing: str) -> dict:
        """Unpickle payloads; raise the first env error once all replies are read.
        Garbled replies mark the engine broken (``self._broken``)."""
        results, error = {}, None
        for w, (cmd, _slot, arg, blob) in replies.items():
            if cmd not in (E.REPLY_DONE, E.REPLY_RESULT, E.REPLY_ERROR, E.REPLY_READY):
                raise self._fail(w, f"{self._worker_desc(w)} sent a malformed control message "
                                    f"(reply code {cmd}) while {doing}")
            try:
                obj = pickle.loads(blob) if blob is not None else None
            except Exception as exc:
                raise self._fail(w, f"{self._worker_desc(w)} sent an unreadable payload while {doing}: {exc}") from None
            if cmd == E.REPLY_ERROR:
                if error is None:
                    error = (w, obj)
                continue
            if arg & E.IN_TABLE:
                if cmd != E.REPLY_DONE or (obj is not None and not self._learn_schema(w, obj)):
                    raise self._fail(w, f"{self._worker_desc(w)} sent a malformed info table report while {doing}")
                obj = _TABLE_REPORT
            results[w] = obj
        if error is not None:
            w, info = error
            if not isinstance(info, dict) or not {"exc_type", "message", "traceback", "during"} <= info.keys():
                raise self._fail(w, f"{self._worker_desc(w)} sent a malformed error report while {doing}")
            idx = info.get("env_index")
            where = f"env {idx}" if idx is not None else self._worker_desc(w)
            raise WorkerError(
                f"{where} raised {info['exc_type']}: {info['message']} (during {info['during']}, "
                f"in {self._worker_desc(w)})",
                worker=w, env_indices=range(*self.groups[w]), env_index=idx,
                exc_type=info["exc_type"], exc_message=info["message"],
                worker_traceback=info["traceback"],
            )
        return results

    def _learn_schema(self, w: int, report) -> bool:
        """A worker's info table columns grew: ``("schema", [(key, type), ...])``, the
        old columns first. False if the report is malformed."""
        if not (isinstance(report, tuple) and len(report) == 2 and report[0] == "schema"
                and isinstance(report[1], list) and len(self._schemas[w]) <= len(report[1]) <= E.INFO_COLS):
            return False
        schema = []
        for k, entry in enumerate(report[1]):
            if not (isinstance(entry, tuple) and len(entry) == 2):
                return False
            is_int = E._table_kind(entry[1])
            if is_int is None or (k < len(self._schemas[w]) and self._schemas[w][k][:2] != entry):
                return False
            schema.append((entry[0], entry[1], is_int))
        self._set_schema(w, schema)
        return True

    def _set_schema(self, w: int, schema: list) -> None:
        self._schemas[w] = schema
        first = self._schemas[0]
        self._uniform_schema = first if all(s == first for s in self._schemas) else None

    def _table_columns(self, w: int, slot: int) -> dict:
        """Worker w's infos of ``slot`` from the info table, as columns with global
        env indices: ``{key: (type, indices, values)}``."""
        a, b = self.groups[w]
        masks = self._info_mask[slot, a:b]
        cols = {}
        for c, (key, kind, is_int) in enumerate(self._schemas[w]):
            present = (masks & (1 << c)) != 0
            table = self._info_i if is_int else self._info_f
            if present.all():
                cols[key] = (kind, list(range(a, b)), table[slot, a:b, c].tolist())
            elif present.any():
                sel = np.flatnonzero(present)
                cols[key] = (kind, (sel + a).tolist(), table[slot, a + sel, c].tolist())
        return cols

    # ------------------------------------------------------------------ stepping

    def _start_step(self, slot: int) -> None:
        try:
            self._ctl.issue_all(E.CMD_STEP, slot)
        except OSError as exc:
            raise self._fail(0, f"could not reach the workers: {exc}") from None
        self._pending_slot = slot

    def step_report(self, actions, slot: int, timeout: float | None = ...):
        return self._step_table(actions, slot, timeout, per_env=None)[1:]

    def step_vector(self, actions, slot: int, timeout: float | None = ...):
        return self._step_table(actions, slot, timeout, per_env=False)

    def step_env_infos(self, actions, slot: int, timeout: float | None = ...):
        return self._step_table(actions, slot, timeout, per_env=True)

    def _step_table(self, actions, slot: int, timeout, per_env: bool | None):
        # One step, rung and waited for in one compiled call, so a worker sharing the
        # parent's CPU gets it at once. ``per_env``: which infos to build on the common
        # step (True: SB3's per-env dicts, False: gymnasium's arrays, None: none).
        # The common step with as little Python as possible on either side of the wait.
        # The parent runs it with caches cold from the envs that just ran on its core: on
        # Pong the layered path took ~55 us of a ~1.8 ms step, this one ~36 us.
        fast = self._fast_action
        if (fast is not None and type(actions) is np.ndarray and actions.shape == fast.shape
                and fast._fast_in_bounds(actions)):
            self._check_step_slot(slot)
            self.act_bufs[0][slot] = actions
        else:  # anything else: the full checks, which word every error
            self._write_actions(actions, slot)
        if timeout is ...:
            timeout = self.step_timeout
        try:
            waited = self._ctl.issue_all_wait(E.CMD_STEP, slot, self._all_workers,
                                              -1.0 if timeout is None else timeout)
        except E.DoorbellError as exc:
            raise self._fail(0, f"could not reach the workers: {exc}") from None
        except KeyboardInterrupt:
            self._broken = "interrupted while waiting for the workers"
            raise
        if waited[0] == 0 and per_env is not None:
            n_table = self._ctl.plain_step_replies(slot)
            if n_table == 0:  # no env had an info to report
                self._last_slot = slot
                return ([{} for _ in range(self.num_envs)] if per_env else {}), None, None
            if n_table == self.num_workers and (cols := self._table_cols()) is not None:
                build = E.table_env_infos if per_env else E.table_vector_infos
                infos = build(self._info_i, self._info_f, self._info_mask, slot, cols)
                if infos is not None:
                    self._last_slot = slot
                    return infos, None, None
        # Anything else (payloads, errors, a dead or silent worker): the general path,
        # starting from what this wait found.
        self._pending_slot = slot
        return (None, *self._step_wait_report(timeout, waited=waited))

    def _table_cols(self) -> list | None:
        """The compiled info builders' column spec for the uniform schema, or None."""
        schema = self._uniform_schema
        if schema is None:
            return None
        if self._table_cols_for is not schema:
            self._table_cols_spec = [(key, f"_{key}", is_int, _vector_dtype(kind, is_int), kind)
                                     for key, kind, is_int in schema]
            self._table_cols_for = schema
        return self._table_cols_spec

    def step_wait_report(self, timeout: float | None = ...):
        """Like ``step_wait``, but returns ``(columns, records)``: exactly one is not None.
        ``columns`` (see ``fastvec.infos``) when every info of the step is a flat dict of
        numbers, which spares a front door the per-env dicts.

        With ``restart_on_error``, a failed worker (dead, stuck past ``step_timeout``, or
        an env that raised) is replaced and its envs reset; they report a truncated
        episode with ``info["fastvec_restarted"] = True`` and the step returns normally.
        """
        return self._step_wait_report(timeout)

    def _step_wait_report(self, timeout, waited: tuple | None = None):
        """``waited``: what a first wait already returned (by ``_step_table``)."""
        if self._pending_slot is None:
            raise RuntimeError("step_wait() called without step_async()")
        slot, self._pending_slot = self._pending_slot, None
        if timeout is ...:
            timeout = self.step_timeout
        results, failures = self._collect(range(self.num_workers), timeout, "stepping", slot=slot,
                                          waited=waited)
        if failures and not self.restart_on_error:
            w, (exc, fatal) = next(iter(failures.items()))
            if fatal:
                self._broken = str(exc)
            raise exc
        columns, records = self._join_reports(results, slot)
        if failures:
            records = (records if columns is None else columns_to_records(columns))
            columns = None
        for w, (exc, _fatal) in failures.items():
            records += self._replace_failed(w, slot, exc)
        if failures:
            records.sort(key=lambda rec: rec[0])
        self._last_slot = slot
        return columns, records

    def _whole_table(self, results: dict, slot: int):
        """The common case in one go: every worker put its infos in the table, with the
        same columns, and every env reported every key. Columns ``{key: (type, None,
        values)}`` (None: all envs, in order) or None if the case does not apply."""
        schema = self._uniform_schema
        if schema is None or len(results) != self.num_workers:
            return None
        for w in range(self.num_workers):
            if results.get(w) is not _TABLE_REPORT:
                return None
        if not E.mask_full(self._info_mask, slot, len(schema)):
            return None
        # One copy of the slot's columns, then a row per key (exact int64/float64 bits).
        block_i = self._info_i[slot, :, :len(schema)].T.copy()
        block_f = block_i.view(np.float64)
        return {key: (kind, None, block_i[c] if is_int else block_f[c])
                for c, (key, kind, is_int) in enumerate(schema)}

    def _join_reports(self, results: dict, slot: int):
        """Workers' step reports -> ``(columns, None)`` when every worker that reported
        sent flat numeric columns, else ``(None, records)`` in env order."""
        columns = self._whole_table(results, slot)
        if columns is not None:
            return columns, None
        parts, records = [], []
        for w, report in results.items():
            if report is None:
                continue
            kind, body = report
            start = self.groups[w][0]
            if kind == "table":
                parts.append((0, self._table_columns(w, slot)))
            elif kind == "cols":
                parts.append((start, body))
            else:
                records += [(start + j, step_info, reset_info) for j, step_info, reset_info in body]
        return join_parts(parts, records)

    def _replace_failed(self, w: int, slot: int, exc: WorkerError) -> list:
        a, b = self.groups[w]
        try:
            reset_infos = self._restart(w, slot)
        except BaseException as again:
            self._broken = f"restarting {self._worker_desc(w)} failed: {again}"
            if isinstance(again, WorkerError):
                raise again from exc
            raise
        warnings.warn(f"fastvec: {exc}; restarted worker {w} and reset envs {a}..{b - 1}", RuntimeWarning,
                      stacklevel=3)
        self.restarts.append({"worker": w, "envs": list(range(a, b)), "error": str(exc)})
        # The restarted envs end their episode here: truncated, with the last observation
        # their previous slot held as the final one.
        self.rewards[slot, a:b] = 0.0
        self.terminated[slot, a:b] = False
        self.truncated[slot, a:b] = True
        for final, obs in zip(self.final_bufs, self.obs_bufs):
            final[slot, a:b] = obs[self._last_slot, a:b]
        info = {"fastvec_restarted": True, "fastvec_error": str(exc)}
        return [(i, dict(info), reset_infos.get(i, {})) for i in range(a, b)]

    # ------------------------------------------------------------------ commands
    def _targets(self, indices) -> dict[int, list[int]]:
        """Group global env indices by worker: {worker: [local indices]}."""
        out: dict[int, list[int]] = {}
        for i in indices:
            w = int(self._env_worker[i])
            out.setdefault(w, []).append(i - self.groups[w][0])
        return out

    def reset(self, slot: int, kwargs_per_env: dict[int, dict]) -> dict[int, dict]:
        """Reset the envs named in ``kwargs_per_env`` ({env: reset kwargs}), writing
        their observations into ``slot``. Returns {env: reset info}."""
        self._check_usable()
        targets: dict[int, list] = {}
        for i, kwargs in kwargs_per_env.items():
            w = int(self._env_worker[i])
            targets.setdefault(w, []).append((i - self.groups[w][0], kwargs))
        self._send_commands(E.CMD_RESET, slot, targets)
        replies = self._gather(targets, self.step_timeout, "resetting")
        infos = {}
        for w, recs in replies.items():
            start = self.groups[w][0]
            for j, info in recs:
                infos[start + j] = info
        self._last_slot = slot
        return infos

    def call(self, kind: str, name, args=(), kwargs=None, indices=None, values=None) -> list:
        """Run ``kind`` (see worker._do_call) on the envs at ``indices``, in order."""
        self._check_usable()
        indices = self.normalize_indices(indices)
        targets: dict[int, list] = {}
        for n, i in enumerate(indices):
            w = int(self._env_worker[i])
            targets.setdefault(w, []).append((i - self.groups[w][0], None if values is None else values[n]))
        per_worker = {
            w: (kind, name, tuple(args), dict(kwargs or {}), t) for w, t in targets.items()
        }
        self._send_commands(E.CMD_CALL, 0, per_worker)
        replies = self._gather(targets, self.step_timeout, f"{kind}({name!r})")
        cursor = {w: iter(r) for w, r in replies.items()}
        return [next(cursor[int(self._env_worker[i])]) for i in indices]

    def _send_commands(self, cmd: int, slot: int, targets: dict) -> None:
        for w, blob in pickle_payloads(targets, "arguments for the workers").items():
            try:
                self._ctl.issue(w, cmd, slot, blob)
            except (OSError, E.PeerClosed):
                raise self._fail(w, self._death_message(w, "receiving a command")) from None

    # ------------------------------------------------------------------ views

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Stop the workers and unlink the segment. Idempotent."""
        if not hasattr(self, "_finalizer"):  # __init__ failed before anything started
            return
        self._closed = True
        if self._pending_slot is not None and self._broken is None:
            # Let a step in flight finish so workers are idle when told to close.
            try:
                self._gather(range(self.num_workers), _CLOSE_GRACE_S, "closing")
            except Exception:
                pass
            self._pending_slot = None
        # Drop our views before the mapping is closed.
        for name in ("obs_bufs", "final_bufs", "act_bufs"):
            if hasattr(self, name):
                setattr(self, name, [])
        self._ctl = None
        for name in ("rewards", "terminated", "truncated"):
            if hasattr(self, name):
                setattr(self, name, None)
        self._finalizer()
