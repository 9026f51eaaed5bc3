"""Batches of envs that step while the caller acts on others (EnvPool's ``send``/``recv``).

``AsyncVectorEnv(..., batch_size=M)`` splits its ``N`` envs into ``N / M`` fixed,
contiguous *batch groups* (``batch_mode="groups"``), each run by whole workers of its
own. ``recv()`` returns the next group's results in turn; ``send(actions)`` starts that
group's next step and returns at once, so the caller's policy runs on one group while
the other groups' envs step. Every env steps as often as the others, each group's
results are a zero-copy slice of the ring (``copy=False``), and a trainer's ``[T, N]``
storage fills group by group.

A group's step writes the next slot of that group's own turn in the ring, so what
``recv`` handed out stays valid through the group's next step. Autoreset is per env, as
in lock-step: a group's ``recv`` after an episode ended brings the reset observation
(``NEXT_STEP``: one step later, reward 0; ``SAME_STEP``: at once, ``final_obs`` in the
infos). ``infos["env_id"]`` (int32) names the envs of the batch.
"""
from __future__ import annotations

import multiprocessing

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from .._core.actions import ActionWriter
from .._core.infos import with_quiet_ends
from .._core.layout import OBJECT, build_nested
from ..errors import NoPendingCallError, PendingCallError
from . import _gym_infos

_IDLE, _READY, _SENT = 0, 1, 2  # nothing to recv (returned, not sent) / reset results / a step in flight


class _Infos:
    """gymnasium's ``VectorEnv._add_info`` for a batch of ``num_envs`` envs."""

    _add_info = VectorEnv._add_info

    def __init__(self, num_envs: int):
        self.num_envs = num_envs


def _check_timeout(timeout) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ValueError(f"timeout must be a non-negative number of seconds or None, got {timeout!r}")


def check_batch_size(batch_size, num_envs: int, batch_mode) -> int:
    if batch_mode != "groups":
        raise ValueError(f"batch_mode must be 'groups', got {batch_mode!r} ('ready', EnvPool's first M "
                         "envs to finish, is not available yet)")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
    if num_envs % batch_size:
        raise ValueError(f"batch_size={batch_size} must divide num_envs={num_envs}")
    return int(batch_size)


def batch_workers(num_workers: int | None, num_envs: int, batch_size: int, cores: int) -> int:
    """Workers for ``num_envs / batch_size`` groups: each group needs whole workers of its
    own with as many envs each, so the count is a multiple of the number of groups whose
    share divides ``batch_size`` (default: about ``min(num_envs, cores)``)."""
    groups = num_envs // batch_size
    if num_workers is None:
        want = max(1, -(-min(num_envs, cores) // groups))  # workers per group
        per = max(d for d in range(1, want + 1) if batch_size % d == 0)
        return groups * per
    if num_workers % groups or batch_size % (num_workers // groups):
        raise ValueError(f"num_workers={num_workers} must be a multiple of num_envs / batch_size = {groups} "
                         f"whose share per group divides batch_size={batch_size}: each batch group runs on "
                         "workers of its own, with as many envs each")
    return num_workers


class GroupBatches:
    """The ``send``/``recv`` state of one ``AsyncVectorEnv`` (see the module's docstring)."""

    def __init__(self, door, batch_size: int):
        eng = door._engine
        if batch_size < eng.num_envs and not hasattr(eng, "group_send"):
            raise ValueError(f"batch_size is not available on {type(eng).__name__} yet")
        self.door = door
        self.size = batch_size
        self.groups = [(a, a + batch_size) for a in range(0, eng.num_envs, batch_size)]
        self.workers = []
        for a, b in self.groups:
            ws = [w for w, (wa, wb) in enumerate(eng.groups) if a <= wa and wb <= b]
            assert sum(eng.groups[w][1] - eng.groups[w][0] for w in ws) == b - a, "groups must cover whole workers"
            self.workers.append(np.asarray(ws, dtype=np.intc))
        self.env_ids = [np.arange(a, b, dtype=np.int32) for a, b in self.groups]
        self.writer = ActionWriter(eng.single_action_space, batch_size, eng.options.action_check)
        self.state = [_IDLE] * len(self.groups)
        self.slot = [0] * len(self.groups)
        self.prev_slot = [0] * len(self.groups)
        self.reset_infos: list = [None] * len(self.groups)
        self.next = 0  # the group the next recv returns
        self.recvd: list[int] = []  # groups returned by recv and not sent since
        self.active = False  # async_reset was called (and no lock-step reset since)

    # ------------------------------------------------------------ state
    def in_flight(self) -> bool:
        return any(s == _SENT for s in self.state)

    def check_lockstep(self, what: str) -> None:
        """``step``/``reset`` (lock-step over every env) with batches in flight would drop
        their results: refuse."""
        if self.in_flight():
            raise PendingCallError(f"Calling `{what}` while batches sent with `send` are in flight: `recv` "
                                   "them first", "send")

    def drain(self) -> None:
        """Closing: let every step in flight finish (results dropped)."""
        eng = self.door._engine
        for g, st in enumerate(self.state):
            if st == _SENT:
                self.state[g] = _IDLE
                eng.group_recv(self.workers[g], self.slot[g], self.prev_slot[g])

    # ------------------------------------------------------------ the API
    def async_reset(self, seed, options) -> None:
        door = self.door
        self.check_lockstep("async_reset")
        if door.autoreset_mode == AutoresetMode.DISABLED:
            raise ValueError("batches need an autoreset mode (NEXT_STEP or SAME_STEP): with DISABLED an ended "
                             "episode has no way back but a masked reset() of every env")
        if options is not None and isinstance(options, dict) and "reset_mask" in options:
            raise ValueError("async_reset resets every env: `options['reset_mask']` is for reset()")
        door.reset_async(seed=seed, options=options)
        _, slot, _targets = door._take("reset", None)
        env_infos = door._engine.reset_wait()
        door._slot = slot
        for g, (a, b) in enumerate(self.groups):
            self.state[g] = _READY
            self.slot[g] = self.prev_slot[g] = slot
            self.reset_infos[g] = [(i - a, env_infos.get(i, {})) for i in range(a, b)]
        self.next, self.recvd, self.active = 0, [], True

    def send(self, actions, env_ids=None) -> None:
        door = self.door
        door._check_open()
        if not self.active:
            raise NoPendingCallError("Calling `send` before `async_reset`: batches start with async_reset()",
                                     "send")
        g = self._group_of(env_ids)
        if not hasattr(door._engine, "group_send"):
            raise ValueError(f"send/recv are not available on {type(door._engine).__name__} yet")
        arrays = self.writer.validate(actions)  # ValueError before anything is sent
        slot = (self.slot[g] + 1) % door._engine.num_slots
        door._engine.group_send(self.workers[g], self.groups[g], arrays, self.writer, slot)
        self.prev_slot[g], self.slot[g] = self.slot[g], slot
        self.state[g] = _SENT
        self.recvd.remove(g)

    def _group_of(self, env_ids) -> int:
        if env_ids is None:
            if not self.recvd:
                raise NoPendingCallError("Calling `send` without a batch to answer: every batch `recv` "
                                         "returned has been sent", "send")
            return self.recvd[-1]
        ids = np.asarray(env_ids)
        for g in self.recvd:
            if ids.shape == self.env_ids[g].shape and np.array_equal(ids, self.env_ids[g]):
                return g
        raise ValueError(f"env_ids {ids.tolist()!r} are not those of a batch `recv` returned and `send` has not "
                         f"answered (batch_mode='groups': {[self.env_ids[g].tolist() for g in self.recvd]})")

    def recv(self, timeout=None):
        door = self.door
        door._check_open()
        if not self.active:
            raise NoPendingCallError("Calling `recv` before `async_reset`", "recv")
        g = self.next
        st = self.state[g]
        if st == _IDLE:
            raise NoPendingCallError(f"Calling `recv` with nothing sent: the batch of envs {self.groups[g][0]}.."
                                     f"{self.groups[g][1] - 1} was returned and waits for `send`", "recv")
        eng = door._engine
        a, b = self.groups[g]
        slot = self.slot[g]
        if st == _SENT:
            if timeout is not None:
                _check_timeout(timeout)
                if not eng.group_poll(self.workers[g], float(timeout)):
                    raise multiprocessing.TimeoutError(
                        f"The call to `recv` has timed out after {timeout} second(s) (still in flight: call "
                        "`recv` again to get its results).")
            result = eng.group_recv(self.workers[g], slot, self.prev_slot[g])
            self.state[g] = _IDLE
            rewards = eng.rewards[slot, a:b].copy()
            terminated = eng.terminated[slot, a:b].copy()
            truncated = eng.truncated[slot, a:b].copy()
            infos = self._infos(result, g, slot, terminated | truncated)
        else:
            self.state[g] = _IDLE
            rewards = np.zeros(b - a)
            terminated = np.zeros(b - a, dtype=np.bool_)
            truncated = np.zeros(b - a, dtype=np.bool_)
            infos = {}
            add = _Infos(b - a)
            for j, info in self.reset_infos[g]:
                infos = add._add_info(infos, info, j)
            self.reset_infos[g] = None
        infos["env_id"] = self.env_ids[g].copy()
        self.next = (g + 1) % len(self.groups)
        self.recvd.append(g)
        obs = build_nested(eng.single_observation_space,
                           [_rows(buf, slot, a, b, door.copy) for buf in eng.obs_bufs])[0]
        return obs, rewards, terminated, truncated, infos

    def _infos(self, result, g: int, slot: int, ended) -> dict:
        """gymnasium's infos of batch ``g``'s step (its envs numbered from 0)."""
        door = self.door
        eng = door._engine
        a, b = self.groups[g]
        same_step = door.autoreset_mode == AutoresetMode.SAME_STEP and ended.any()
        if result.table is not None:
            if not same_step:  # the common step: this batch's rows of the table, compiled
                info_i, info_f, mask, schema = result.table
                rows = slice(slot, slot + 1), slice(a, b)  # one slot's rows: contiguous, as the builder needs
                infos = _gym_infos.table_vector_infos(info_i[rows], info_f[rows], mask[rows], 0,
                                                      door._table_cols(schema))
                if infos is not None:
                    return infos
            result = eng.group_columns(self.workers[g], slot)
        elif not same_step and result.columns is None and not result.records:
            return {}
        records = [(i - a, si, ri) for i, si, ri in result.as_records()]
        if same_step:
            records = with_quiet_ends(records, ended)
        return door._merge_infos(records, slot, same_step, _Infos(self.size), a)


def _rows(buf, slot: int, a: int, b: int, copy: bool):
    """Envs ``[a, b)`` of one leaf in ``slot``: a copy or a (writable, as the door's)
    view of the shared rows, or a pickled leaf's values as a tuple."""
    if buf.dtype == OBJECT:
        return tuple(buf[slot, a:b])
    rows = buf[slot, a:b]
    return rows.copy() if copy else rows
