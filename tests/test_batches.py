"""EnvPool's asynchronous API on ``fastvec.AsyncVectorEnv`` (``batch_size``,
``async_reset``/``send``/``recv``, groups mode): each batch is checked, step by step,
against a ``SyncVectorEnv`` of that batch's envs replaying the same actions from the
same seeds (observations, rewards, flags, infos and final observations, so a reward
can never be one step off its action, nor a terminal observation lost); and every
misuse is a clear error that loses nothing."""
from __future__ import annotations

import functools
import multiprocessing
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import fastvec
from envs import DictTupleEnv, RandomEndEnv
from helpers import assert_same

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


def _without_env_id(result):
    obs, rew, term, trunc, infos = result
    infos = dict(infos)
    infos.pop("env_id")
    return obs, rew, term, trunc, infos


class Replay:
    """One SyncVectorEnv per batch group: the reference for that group's results."""

    def __init__(self, fns, batch_size, mode, seed):
        self.refs = [SyncVectorEnv(fns[a:a + batch_size], autoreset_mode=mode)
                     for a in range(0, len(fns), batch_size)]
        self.size = batch_size
        self.pending = []  # per group: results the next recv must equal
        for g, ref in enumerate(self.refs):
            a = g * batch_size
            obs, infos = ref.reset(seed=[seed + i for i in range(a, a + batch_size)])
            zeros = np.zeros(batch_size)
            no = np.zeros(batch_size, dtype=np.bool_)
            self.pending.append((obs, zeros, no, no.copy(), infos))

    def check(self, got, where):
        ids = got[4]["env_id"]
        assert ids.dtype == np.int32
        g = int(ids[0]) // self.size
        np.testing.assert_array_equal(ids, np.arange(g * self.size, (g + 1) * self.size))
        assert_same(_without_env_id(got), self.pending[g], where)
        return g

    def step(self, g, actions):
        self.pending[g] = self.refs[g].step(actions)

    def close(self):
        for ref in self.refs:
            ref.close()


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("env_name, n, batch, workers", [
    ("random_end", 8, 4, 2), ("random_end", 8, 2, 4), ("dict_tuple", 6, 3, 2), ("random_end", 4, 4, 2),
])
def test_groups_match_a_replay_per_batch(env_name, n, batch, workers, mode):
    fn = {"random_end": functools.partial(RandomEndEnv, p_end=0.15), "dict_tuple": DictTupleEnv}[env_name]
    fns = [fn] * n
    env = fastvec.AsyncVectorEnv(fns, num_workers=workers, batch_size=batch, autoreset_mode=mode)
    replay = Replay(fns, batch, mode, seed=7)
    rng = np.random.default_rng(0)
    space = gym.vector.utils.batch_space(env.single_action_space, batch)
    space.seed(3)
    try:
        env.async_reset(seed=7)
        ends = 0
        for t in range(30 * (n // batch)):
            got = env.recv()
            g = replay.check(got, f"recv {t}")
            ends += int((got[2] | got[3]).sum())
            actions = space.sample() if env_name == "dict_tuple" else rng.integers(0, 3, batch)
            env.send(actions)
            replay.step(g, actions)
        assert ends > 0
    finally:
        env.close()
        replay.close()


def test_batches_out_of_turn_and_by_env_ids():
    """Two batches received before either is sent; ``send`` picks one by its env_ids."""
    fns = [functools.partial(RandomEndEnv, p_end=0.2)] * 4
    env = fastvec.AsyncVectorEnv(fns, num_workers=2, batch_size=2, autoreset_mode=AutoresetMode.SAME_STEP)
    replay = Replay(fns, 2, AutoresetMode.SAME_STEP, seed=1)
    try:
        env.async_reset(seed=1)
        for t in range(20):
            first, second = env.recv(), env.recv()
            g0, g1 = replay.check(first, f"round {t} first"), replay.check(second, f"round {t} second")
            a0, a1 = np.array([t % 3, 2]), np.array([1, t % 2])
            env.send(a0, env_ids=first[4]["env_id"])  # not the last one received
            env.send(a1)  # None: the batch recv returned last and not sent
            replay.step(g0, a0)
            replay.step(g1, a1)
    finally:
        env.close()
        replay.close()


def test_misuse_is_a_clear_error_and_loses_nothing():
    fns = [functools.partial(RandomEndEnv, p_end=0.2)] * 4
    mode = AutoresetMode.NEXT_STEP
    env = fastvec.AsyncVectorEnv(fns, num_workers=2, batch_size=2, autoreset_mode=mode, action_check="bounds")
    replay = Replay(fns, 2, mode, seed=4)
    try:
        with pytest.raises(NoAsyncCallError):
            env.recv()  # before async_reset
        with pytest.raises(NoAsyncCallError):
            env.send(np.zeros(2, np.int64))
        env.async_reset(seed=4)
        with pytest.raises(NoAsyncCallError, match="every batch"):
            env.send(np.zeros(2, np.int64))  # nothing received yet
        replay.check(env.recv(), "batch 0, reset")
        with pytest.raises(ValueError, match="env_ids"):
            env.send(np.zeros(2, np.int64), env_ids=[2, 3])  # not a batch received
        with pytest.raises(ValueError):
            env.send(np.zeros(3, np.int64))  # wrong batch shape
        with pytest.raises(ValueError, match="out of range"):
            env.send(np.array([0, 5]))
        env.send(np.array([1, 2]))  # the refused sends sent nothing: this is batch 0's step
        replay.step(0, np.array([1, 2]))
        with pytest.raises(AlreadyPendingCallError):
            env.step(np.zeros(4, np.int64))  # lock-step with a batch in flight
        with pytest.raises(AlreadyPendingCallError):
            env.get_attr("t")
        replay.check(env.recv(), "batch 1, reset")
        replay.check(env.recv(), "batch 0, step 1")
        with pytest.raises(NoAsyncCallError, match="waits for `send`"):
            env.recv()  # batch 1's turn, but it was never sent
        env.send(np.array([0, 0]))  # batch 0: received last
        env.send(np.array([2, 1]), env_ids=np.array([2, 3]))
        replay.step(0, np.array([0, 0]))
        replay.step(1, np.array([2, 1]))
        replay.check(env.recv(), "batch 1, step 1")
        replay.check(env.recv(), "batch 0, step 2")
        with pytest.raises(RuntimeError, match="batch mode"):
            env.step(np.zeros(4, np.int64))  # nothing in flight, but observations are per batch
        with pytest.raises(ValueError, match="masked reset"):
            env.reset(options={"reset_mask": np.array([True, False, False, False])})
        env.reset(seed=9)  # back to lock-step
        env.step(np.zeros(4, np.int64))
    finally:
        env.close()
        replay.close()


def test_bad_batch_configurations():
    fns = [RandomEndEnv] * 6
    with pytest.raises(ValueError, match="divide"):
        fastvec.AsyncVectorEnv(fns, batch_size=4)
    with pytest.raises(ValueError, match="multiple"):
        fastvec.AsyncVectorEnv(fns, batch_size=2, num_workers=2)
    with pytest.raises(ValueError, match="ready"):
        fastvec.AsyncVectorEnv(fns, batch_size=3, batch_mode="ready")
    with pytest.raises(ValueError, match="batch_size"):
        fastvec.AsyncVectorEnv(fns, batch_size=0)
    with fastvec.AsyncVectorEnv(fns, batch_size=3, autoreset_mode=AutoresetMode.DISABLED) as env:
        with pytest.raises(ValueError, match="autoreset"):
            env.async_reset(seed=0)


class Sleepy(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float64)
    action_space = gym.spaces.Box(0.0, 1.0, (), np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1), {}

    def step(self, action):
        time.sleep(float(action))
        return np.full(1, float(action)), 1.0, False, False, {}


def test_recv_timeout_keeps_the_batch_in_flight_and_close_drains():
    env = fastvec.AsyncVectorEnv([Sleepy] * 4, num_workers=2, batch_size=2)
    pids = env.worker_pids
    env.async_reset(seed=0)
    env.recv()
    env.send(np.full(2, 0.5))
    env.recv()
    env.send(np.full(2, 0.0))
    with pytest.raises(multiprocessing.TimeoutError):
        env.recv(timeout=0.05)
    obs = env.recv()[0]  # the same batch, now done
    np.testing.assert_array_equal(obs, np.full((2, 1), 0.5))
    env.send(np.full(2, 0.3))
    with pytest.warns(UserWarning, match="pending call"):
        env.close()  # with a batch in flight: it finishes, then the workers go
    import os

    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_workers_are_chosen_and_checked_so_each_group_has_whole_workers():
    fns = [RandomEndEnv] * 6
    with pytest.raises(ValueError, match="divides batch_size"):
        fastvec.AsyncVectorEnv(fns, batch_size=3, num_workers=4)  # 2 per group would split 3 envs 2+1
    with fastvec.AsyncVectorEnv(fns, batch_size=3, num_workers=6) as env:
        env.async_reset(seed=0)
        assert [int(i) for i in env.recv()[4]["env_id"]] == [0, 1, 2]
    from fastvec.doors.batches import batch_workers

    assert batch_workers(None, 16, 8, 2) == 2
    assert batch_workers(None, 6, 3, 4) == 2  # 2 per group would not divide 3: 1 per group
    assert batch_workers(None, 12, 6, 8) == 6  # 4 per group would not divide 6: 3 per group
