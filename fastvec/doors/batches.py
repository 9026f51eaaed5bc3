"""Batches of envs that step while the caller acts on others (EnvPool's ``send``/``recv``).

``AsyncVectorEnv(..., batch_size=M, batch_mode=...)`` answers ``recv()`` with the
results of M of its N envs and ``send(actions)`` with those envs' next step, returning
at once, so the caller's policy runs on one batch while other envs step. The envs are
held in *units* that step together: a unit is a batch group (``"groups"``) or one
worker's envs (``"ready"``).

- ``batch_mode="groups"``: ``N / M`` fixed, contiguous *batch groups*, each run by whole
  workers of its own; ``recv()`` returns the next group's results in turn. Every env
  steps as often as the others and a group's results are a zero-copy slice of the ring
  (``copy=False``): a group's step writes the next slot of its own turn, so what
  ``recv`` handed out stays valid through the group's next step, and a trainer's
  ``[T, N]`` storage fills group by group.
- ``batch_mode="ready"``: the first workers to finish whose envs make M, whichever they
  are (EnvPool's semantics at the grain of a worker: every worker holds ``N / W`` envs,
  which divides M). Each worker writes its own turn of slots, so a batch gathers rows
  from several slots: a copy, always. For envs whose step times vary: a slow worker no
  longer holds up the others.

Autoreset is per env, as in lock-step: a ``recv`` after an episode ended brings the
reset observation (``NEXT_STEP``: one step later, reward 0; ``SAME_STEP``: at once,
``final_obs`` in the infos). ``infos["env_id"]`` (int32) names the envs of the batch.
"""

from __future__ import annotations

import multiprocessing
import time

import numpy as np
from gymnasium.vector import AutoresetMode

from .._core.actions import ActionWriter
from .._core.infos import with_quiet_ends
from .._core.segment import OBJECT, build_nested
from ..errors import NoPendingCallError, PendingCallError
from . import _gym_infos
from .base import check_open, check_timeout
from .vector_infos import VectorInfos

# nothing to recv (returned and not sent, or failed) / reset results / a step in flight /
# a step's results taken from the workers, kept for the next recv (ready mode)
_IDLE, _READY, _SENT, _KEPT = 0, 1, 2, 3


def check_batch_size(batch_size, num_envs: int, batch_mode) -> int:
    if batch_mode not in ("groups", "ready"):
        raise ValueError(f"batch_mode must be 'groups' or 'ready', got {batch_mode!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
    if num_envs % batch_size:
        raise ValueError(f"batch_size={batch_size} must divide num_envs={num_envs}")
    return int(batch_size)


class Batches:
    """The ``send``/``recv`` state of one ``AsyncVectorEnv`` (see the module's docstring)."""

    def __init__(self, door, batch_size: int, mode: str = "groups"):
        eng = door.engine
        if batch_size < eng.num_envs and not hasattr(eng, "group_send"):
            raise ValueError(f"batch_size is not available on {type(eng).__name__} yet")
        self.door = door
        self.size = batch_size
        self.mode = mode
        self.infos = VectorInfos(eng, batch_size)  # a batch's infos: batch_size rows
        if (batch_size < eng.num_envs or mode == "ready") and eng.groups is None:
            raise ValueError(
                "batch_size needs each worker's envs to be one contiguous run (placement='contiguous', "
                "or a balanced placement that kept runs): a batch returns whole workers' envs as one block"
            )
        if mode == "groups":
            self.units = [(a, a + batch_size) for a in range(0, eng.num_envs, batch_size)]
        else:  # one unit per worker (engine.batch_workers made them equal, dividing batch_size)
            self.units = [tuple(ab) for ab in eng.groups]
        self.unit_size = self.units[0][1] - self.units[0][0]
        self.per_batch = batch_size // self.unit_size
        self.workers = [eng.workers_of(a, b) for a, b in self.units]
        self.env_ids = [np.arange(a, b, dtype=np.int32) for a, b in self.units]
        self.writer = ActionWriter(eng.single_action_space, batch_size, eng.options.action_check)
        self.state = [_IDLE] * len(self.units)
        self.slot = [0] * len(self.units)
        self.prev_slot = [0] * len(self.units)
        self.reset_infos: list = [None] * len(self.units)
        self.kept: list = [None] * len(self.units)  # _KEPT units' results (ready: a batch cut by an error)
        self.failed: set[int] = set()  # units whose last step raised: idle until async_reset
        self.next = 0  # groups: the unit the next recv returns
        self.sent_at = [0] * len(self.units)  # ready: when each unit was last sent (a counter)
        self.sends = 0
        self.recvd: list[tuple] = []  # batches (tuples of units) returned by recv and not sent since
        self.active = False  # async_reset was called (and no lock-step reset since)

    # ------------------------------------------------------------ state
    def in_flight(self) -> bool:
        return any(s == _SENT for s in self.state)

    def check_lockstep(self, what: str) -> None:
        """``step``/``reset`` (lock-step over every env) with batches in flight would drop
        their results: refuse."""
        if self.in_flight():
            raise PendingCallError(
                f"Calling `{what}` while batches sent with `send` are in flight: `recv` them first", "send"
            )

    def drain(self) -> None:
        """Closing: let every step in flight finish (results dropped)."""
        eng = self.door.engine
        for u, st in enumerate(self.state):
            if st == _SENT:
                self.state[u] = _IDLE
                eng.group_recv(self.workers[u], self.slot[u], self.prev_slot[u])

    # ------------------------------------------------------------ the API
    def async_reset(self, seed, options) -> None:
        door = self.door
        if self.failed:  # after an env's error the batches still out cannot all come back: drop them
            self.drain()
        self.check_lockstep("async_reset")
        if door.autoreset_mode == AutoresetMode.DISABLED:
            raise ValueError(
                "batches need an autoreset mode (NEXT_STEP or SAME_STEP): with DISABLED an ended "
                "episode has no way back but a masked reset() of every env"
            )
        if options is not None and isinstance(options, dict) and "reset_mask" in options:
            raise ValueError("async_reset resets every env: `options['reset_mask']` is for reset()")
        door.reset_async(seed=seed, options=options)
        _, slot, _targets = door._take("reset", None)
        env_infos = door.engine.reset_wait()
        door._slot = slot
        for u, (a, b) in enumerate(self.units):
            self.state[u] = _READY
            self.slot[u] = self.prev_slot[u] = slot
            self.reset_infos[u] = [(i - a, env_infos.get(i, {})) for i in range(a, b)]
        self.next, self.recvd, self.active = 0, [], True
        self.failed.clear()
        self.kept = [None] * len(self.units)

    def send(self, actions, env_ids=None) -> None:
        door = self.door
        check_open(door)
        if not self.active:
            raise NoPendingCallError("Calling `send` before `async_reset`: batches start with async_reset()", "send")
        batch = self._batch_of(env_ids)
        if not hasattr(door.engine, "group_send"):
            raise ValueError(f"send/recv are not available on {type(door.engine).__name__} yet")
        arrays = self.writer.validate(actions)  # ValueError before anything is sent
        eng, k = door.engine, self.unit_size
        for p, u in enumerate(batch):
            slot = (self.slot[u] + 1) % eng.num_slots
            rows = arrays if len(batch) == 1 else [arr[p * k : (p + 1) * k] for arr in arrays]
            eng.group_send(self.workers[u], self.units[u], rows, self.writer, slot)
            self.prev_slot[u], self.slot[u] = self.slot[u], slot
            self.state[u] = _SENT
            self.sends += 1
            self.sent_at[u] = self.sends
        sent = set(batch)
        left = [tuple(u for u in b if u not in sent) for b in self.recvd]
        self.recvd = [b for b in left if b]

    def _batch_of(self, env_ids) -> tuple:
        """The units ``send`` answers: those of the batch ``recv`` returned last and not
        sent (``env_ids=None``), else those ``env_ids`` name: a batch returned and not
        sent (groups), or ``batch_size`` envs of whole workers so returned (ready)."""
        if env_ids is None:
            if not self.recvd:
                raise NoPendingCallError(
                    "Calling `send` without a batch to answer: every batch `recv` returned has been sent", "send"
                )
            if len(self.recvd[-1]) != self.per_batch:
                raise ValueError(
                    "the batch `recv` returned last was partly answered by a `send` with env_ids: "
                    "name the envs of this one with env_ids too"
                )
            return self.recvd[-1]
        ids = np.asarray(env_ids)
        if self.mode == "groups":
            for batch in self.recvd:
                if ids.shape == self.env_ids[batch[0]].shape and np.array_equal(ids, self.env_ids[batch[0]]):
                    return batch
            raise ValueError(
                f"env_ids {ids.tolist()!r} are not those of a batch `recv` returned and `send` has "
                f"not answered (batch_mode='groups': "
                f"{[self.env_ids[b[0]].tolist() for b in self.recvd]})"
            )
        returned = {u for batch in self.recvd for u in batch}
        k, units = self.unit_size, []
        if ids.shape == (self.size,) and ids.dtype.kind in "iu":
            for p in range(0, self.size, k):
                u = int(ids[p]) // k if 0 <= int(ids[p]) < len(self.units) * k else -1
                if u not in returned or u in units or not np.array_equal(ids[p : p + k], self.env_ids[u]):
                    break
                units.append(u)
        if len(units) != self.per_batch:
            raise ValueError(
                f"env_ids {ids.tolist()!r} must be {self.size} ids of envs `recv` returned and `send` "
                f"has not answered, whole workers' envs of {k} each in order (batch_mode='ready': "
                f"{sorted(int(i) for u in returned for i in self.env_ids[u])})"
            )
        return tuple(units)

    def recv(self, timeout=None):
        door = self.door
        check_open(door)
        if not self.active:
            raise NoPendingCallError("Calling `recv` before `async_reset`", "recv")
        if timeout is not None:
            check_timeout(timeout)
        if self.mode == "ready":
            return self._recv_ready(timeout)
        g = self.next
        if g in self.failed:
            a, b = self.units[g]
            raise NoPendingCallError(
                f"Calling `recv` for envs {a}..{b - 1}, whose last step failed (the error "
                "raised then): recv the other batches in flight, then async_reset()",
                "recv",
            )
        if self.state[g] == _IDLE:
            a, b = self.units[g]
            raise NoPendingCallError(
                f"Calling `recv` with nothing sent: the batch of envs {a}..{b - 1} was returned and waits for `send`",
                "recv",
            )
        if (
            self.state[g] == _SENT
            and timeout is not None
            and not door.engine.group_poll(self.workers[g], float(timeout))
        ):
            raise _timed_out(timeout)
        self.next = (g + 1) % len(self.units)
        return self._recv_unit(g)

    def _recv_unit(self, u: int):
        """A batch of one unit's envs."""
        door = self.door
        obs_rows, rewards, terminated, truncated, records, slot, table = self._take(u)
        if records is None:  # the common step: its infos straight from the table (see _take)
            infos = self._table_infos(u, slot, table)
        else:
            infos = self.infos.merge(records, slot, self._same_step(terminated, truncated), self.units[u][0])
        infos["env_id"] = self.env_ids[u].copy()
        self.recvd.append((u,))
        obs = build_nested(door.engine.single_observation_space, obs_rows)[0]
        return obs, rewards, terminated, truncated, infos

    def _recv_ready(self, timeout):
        """The first units done whose envs make a batch (reset results first; of
        those found done together, the longest in flight first), in env order; their
        rows copied together."""
        eng = self.door.engine
        want = self.per_batch
        if sum(st != _IDLE for st in self.state) < want:
            failed = f" ({len(self.failed)} workers' envs failed: async_reset() them)" if self.failed else ""
            raise NoPendingCallError(
                f"Calling `recv` with fewer than batch_size={self.size} envs stepping or reset"
                f"{failed}: `send` the batches returned first",
                "recv",
            )
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        done = [u for u, st in enumerate(self.state) if st in (_KEPT, _READY)]
        while len(done) < want:
            sent = [u for u, st in enumerate(self.state) if st == _SENT and u not in done]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ws = np.concatenate([self.workers[u] for u in sent])
            finished = set(eng.group_ready(ws, left))
            # among those found done at once, the longest in flight first: none starves
            done += sorted(
                (u for u in sent if finished.issuperset(int(w) for w in self.workers[u])), key=self.sent_at.__getitem__
            )
            if len(done) < want and deadline is not None and time.monotonic() >= deadline:
                raise _timed_out(timeout)
        batch = tuple(sorted(done[:want]))
        if len(batch) == 1:  # one worker a batch (the default on few cores): the groups path, copied
            return self._recv_unit(batch[0])
        k = self.unit_size
        infos: dict = {}
        taken = []
        try:
            for u in batch:
                taken.append((u, self._take(u, columns=True)))
        except BaseException:  # an env failed: the results already taken wait for the next recv
            for u, got in taken:
                self.state[u], self.kept[u] = _KEPT, got
            raise
        for p, (u, (_, _, terminated, truncated, records, slot, _)) in enumerate(taken):
            infos = self.infos.merge(
                records, slot, self._same_step(terminated, truncated), self.units[u][0], infos, offset=p * k
            )
        infos["env_id"] = np.concatenate([self.env_ids[u] for u in batch])
        self.recvd.append(batch)
        return (*_joined([got[:4] for _, got in taken], eng.single_observation_space), infos)

    def _same_step(self, terminated, truncated) -> bool:
        return self.door.autoreset_mode == AutoresetMode.SAME_STEP and bool((terminated | truncated).any())

    def _take(self, u: int, columns: bool = False):
        """Unit ``u``'s results (reset ones, or its step's, which it waits for):
        ``(obs leaves, rewards, terminated, truncated, records, slot, table)``,
        ``records`` its envs' infos numbered from 0, or None for a step whose infos are
        all in the info table under one schema, ``table`` (read as columns by
        ``_table_infos``; ``columns``: records always)."""
        door, eng = self.door, self.door.engine
        a, b = self.units[u]
        slot = self.slot[u]
        copy = door.copy or self.mode == "ready"
        if self.state[u] == _KEPT:
            got, self.kept[u] = self.kept[u], None
            self.state[u] = _IDLE
            return got
        if self.state[u] == _READY:
            obs_rows = [_rows(buf, slot, a, b, copy) for buf in eng.obs_bufs]
            self.state[u] = _IDLE
            records = [(j, None, info) for j, info in self.reset_infos[u]]
            self.reset_infos[u] = None
            no = np.zeros(b - a, dtype=np.bool_)
            return obs_rows, np.zeros(b - a), no, no.copy(), records, slot, None
        self.state[u] = _IDLE
        try:
            result = eng.group_recv(self.workers[u], slot, self.prev_slot[u])
        except BaseException:  # an env raised (or worse): these envs wait for async_reset
            self.failed.add(u)
            raise
        obs_rows = [_rows(buf, slot, a, b, copy) for buf in eng.obs_bufs]  # written now
        rewards = eng.rewards[slot, a:b].copy()
        terminated = eng.terminated[slot, a:b].copy()
        truncated = eng.truncated[slot, a:b].copy()
        same_step = self._same_step(terminated, truncated)
        if result.table is not None:
            if not same_step and not columns:
                return obs_rows, rewards, terminated, truncated, None, slot, result.table
            result = eng.group_columns(self.workers[u], slot)
        elif not same_step and result.columns is None and not result.records:
            return obs_rows, rewards, terminated, truncated, [], slot, None
        records = [(i - a, si, ri) for i, si, ri in result.as_records()]
        if same_step:
            records = with_quiet_ends(records, terminated | truncated)
        return obs_rows, rewards, terminated, truncated, records, slot, None

    def _table_infos(self, g: int, slot: int, table) -> dict:
        """gymnasium's infos of group ``g``'s step, every one in the info ``table``:
        this batch's rows of the table through the compiled builder."""
        eng = self.door.engine
        a, b = self.units[g]
        info_i, info_f, mask, schema = table
        rows = slice(slot, slot + 1), slice(a, b)  # one slot's rows: contiguous, as the builder needs
        infos = _gym_infos.table_vector_infos(info_i[rows], info_f[rows], mask[rows], 0, self.infos.table_cols(schema))
        if infos is not None:
            return infos
        records = [(i - a, si, ri) for i, si, ri in eng.group_columns(self.workers[g], slot).as_records()]
        return self.infos.merge(records, slot, False, a)


def _timed_out(timeout) -> multiprocessing.TimeoutError:
    return multiprocessing.TimeoutError(
        f"The call to `recv` has timed out after {timeout} second(s) (still in "
        "flight: call `recv` again to get its results)."
    )


def _joined(parts, space) -> tuple:
    """Several units' ``(obs leaves, rewards, terminated, truncated)`` as one batch's
    ``(obs, rewards, terminated, truncated)``, their rows in the order given."""
    leaves = [
        tuple(v for part in parts for v in part[0][n])
        if isinstance(parts[0][0][n], tuple)
        else np.concatenate([part[0][n] for part in parts])
        for n in range(len(parts[0][0]))
    ]
    obs = build_nested(space, leaves)[0]
    return (obs, *(np.concatenate([part[i] for part in parts]) for i in (1, 2, 3)))


def _rows(buf, slot: int, a: int, b: int, copy: bool):
    """Envs ``[a, b)`` of one leaf in ``slot``: a copy or a (writable, as the door's)
    view of the shared rows, or a pickled leaf's values as a tuple."""
    if buf.dtype == OBJECT:
        return tuple(buf[slot, a:b])
    rows = buf[slot, a:b]
    return rows.copy() if copy else rows
