"""EnvPool's asynchronous API on ``fastvec.AsyncVectorEnv`` (``batch_size``,
``async_reset``/``send``/``recv``, groups mode): each batch is checked, step by step,
against a ``SyncVectorEnv`` of that batch's envs replaying the same actions from the
same seeds (observations, rewards, flags, infos and final observations, so a reward
can never be one step off its action, nor a terminal observation lost); and every
misuse is a clear error that loses nothing."""

from __future__ import annotations

import functools
import multiprocessing
import os
import time

import gymnasium as gym
import numpy as np
import pytest
from envs import DictTupleEnv, RandomEndEnv
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import assert_same

import fastvec

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


def _without_env_id(result):
    obs, rew, term, trunc, infos = result
    infos = dict(infos)
    infos.pop("env_id")
    return obs, rew, term, trunc, infos


class Replay:
    """One SyncVectorEnv per batch group: the reference for that group's results."""

    def __init__(self, fns, batch_size, mode, seed):
        self.refs = [
            SyncVectorEnv(fns[a : a + batch_size], autoreset_mode=mode) for a in range(0, len(fns), batch_size)
        ]
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
@pytest.mark.parametrize(
    "env_name, n, batch, workers",
    [
        ("random_end", 8, 4, 2),
        ("random_end", 8, 2, 4),
        ("dict_tuple", 6, 3, 2),
        ("random_end", 4, 4, 2),
    ],
)
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
    with pytest.raises(ValueError, match="'groups' or 'ready'"):
        fastvec.AsyncVectorEnv(fns, batch_size=3, batch_mode="first")
    with pytest.raises(ValueError, match="whole workers' envs"):
        fastvec.AsyncVectorEnv(fns, batch_size=3, batch_mode="ready", num_workers=3)  # 2 envs each: not in 3
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
    from fastvec.engine import batch_workers

    assert batch_workers(None, 16, 8, 2) == 2
    assert batch_workers(None, 6, 3, 4) == 2  # 2 per group would not divide 3: 1 per group
    assert batch_workers(None, 12, 6, 8) == 6  # 4 per group would not divide 6: 3 per group


# ============================================================================ ready mode
def _env_info(infos, j):
    """Env ``j``'s info out of gymnasium's vector infos (``{key, _key}``, nested)."""
    out = {}
    for key, value in infos.items():
        if key.startswith("_") or key == "env_id" or not infos.get("_" + key, np.zeros(j + 1, bool))[j]:
            continue
        out[key] = _env_info(value, j) if isinstance(value, dict) else value[j]
    return out


class ReplayPerEnv:
    """One single-env SyncVectorEnv per env: the reference for each env's results,
    whichever batch they come in."""

    def __init__(self, fns, mode, seed):
        self.refs = [SyncVectorEnv([fn], autoreset_mode=mode) for fn in fns]
        self.pending = []
        for i, ref in enumerate(self.refs):
            obs, infos = ref.reset(seed=seed + i)
            self.pending.append((obs, np.zeros(1), np.zeros(1, np.bool_), np.zeros(1, np.bool_), infos))

    def check(self, got, where):
        obs, rew, term, trunc, infos = got
        ids = infos["env_id"]
        assert ids.dtype == np.int32 and len(set(ids.tolist())) == len(ids)
        for p, i in enumerate(ids):
            e_obs, e_rew, e_term, e_trunc, e_infos = self.pending[i]
            assert_same(
                (obs[p], rew[p], term[p], trunc[p], _env_info(infos, p)),
                (e_obs[0], e_rew[0], e_term[0], e_trunc[0], _env_info(e_infos, 0)),
                f"{where}, env {i}",
            )
        return ids

    def step(self, ids, actions):
        for p, i in enumerate(ids):
            self.pending[i] = self.refs[i].step(np.asarray(actions)[p : p + 1])

    def close(self):
        for ref in self.refs:
            ref.close()


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("n, batch, workers", [(8, 4, 4), (8, 2, 8), (6, 3, 2)])
def test_ready_batches_match_a_replay_per_env(n, batch, workers, mode):
    """Whatever envs a batch holds, each env's results are those of that env alone
    replaying the actions it was sent (rewards with their actions, final observations
    with their episodes)."""
    fns = [functools.partial(RandomEndEnv, p_end=0.15)] * n
    env = fastvec.AsyncVectorEnv(fns, num_workers=workers, batch_size=batch, batch_mode="ready", autoreset_mode=mode)
    replay = ReplayPerEnv(fns, mode, seed=7)
    rng = np.random.default_rng(0)
    try:
        assert env.batch_mode == "ready" and env.num_workers == workers
        env.async_reset(seed=7)
        ends, seen = 0, np.zeros(n, int)
        for t in range(40 * n // batch):
            got = env.recv()
            ids = replay.check(got, f"recv {t}")
            ends += int((got[2] | got[3]).sum())
            seen[ids] += 1
            actions = rng.integers(0, 3, batch)
            env.send(actions)
            replay.step(ids, actions)
        assert ends > 0 and seen.min() > 0
    finally:
        env.close()
        replay.close()


class SlowFirst(gym.Env):
    """Env 0 (``slow=True``) takes 20 ms a step, the others none; obs = steps taken.
    Given a ``gate`` (a file path), the slow env's steps wait while that file is absent
    instead (at most 30 s)."""

    observation_space = gym.spaces.Box(0.0, np.inf, (1,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, slow=False, gate=None):
        self.slow, self.t, self.gate = slow, 0, gate

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1), {}

    def step(self, action):
        if self.slow and self.gate is not None:
            deadline = time.monotonic() + 30.0
            while not os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.001)
        elif self.slow:
            time.sleep(0.02)
        self.t += 1
        return np.full(1, float(self.t)), float(action), False, False, {}


def test_ready_returns_the_envs_that_are_done_and_a_slow_one_holds_no_one_up(tmp_path):
    # Env 0's steps are held until the test opens its gate: the others must go on without
    # it (counted, not timed; lock-step would time out on the first recv after its reset).
    gate = tmp_path / "open"
    fns = [functools.partial(SlowFirst, slow=True, gate=str(gate))] + [SlowFirst] * 3
    env = fastvec.AsyncVectorEnv(fns, num_workers=4, batch_size=2, batch_mode="ready", copy=False)
    replay = ReplayPerEnv([SlowFirst] * 4, AutoresetMode.NEXT_STEP, seed=0)  # same results, no waiting
    try:
        env.async_reset(seed=0)
        seen = np.zeros(4, int)

        def one_batch():
            got = env.recv(timeout=10.0)
            ids = replay.check(got, f"batch {seen.sum()}")
            assert not np.shares_memory(got[0], env.engine.obs_bufs[0])  # ready mode copies, always
            seen[ids] += 1
            env.send(ids % 2)
            replay.step(ids, ids % 2)

        while seen[1:].min() < 30:
            one_batch()
        assert seen[0] == 1, seen  # its reset; its first step is still held
        gate.touch()
        while seen[0] < 3:  # let go, it comes back with the right results
            one_batch()
    finally:
        env.close()
        replay.close()


def test_ready_misuse_is_a_clear_error_and_loses_nothing():
    fns = [functools.partial(SlowFirst, slow=True)] + [SlowFirst] * 3
    env = fastvec.AsyncVectorEnv(fns, num_workers=4, batch_size=2, batch_mode="ready")
    replay = ReplayPerEnv([SlowFirst] * 4, AutoresetMode.NEXT_STEP, seed=3)
    try:
        with pytest.raises(NoAsyncCallError):
            env.recv()
        env.async_reset(seed=3)
        a = replay.check(env.recv(), "reset batch 1")  # resets come first, in env order
        b = replay.check(env.recv(), "reset batch 2")
        assert a.tolist() == [0, 1] and b.tolist() == [2, 3]
        with pytest.raises(NoAsyncCallError, match="fewer than batch_size"):
            env.recv()  # every env returned, none sent
        for bad in ([0, 0], [0, 1, 2], [0, 7], ["a", "b"]):
            with pytest.raises(ValueError, match="env_ids"):
                env.send(np.zeros(2, np.int64), env_ids=bad)
        env.send(np.array([1, 0]), env_ids=[0, 2])  # envs of two batches: allowed in ready mode
        replay.step([0, 2], [1, 0])
        with pytest.raises(ValueError, match="partly answered"):
            env.send(np.zeros(2, np.int64))  # the last batch lost env 2 to that send
        with pytest.raises(ValueError, match="env_ids"):
            env.send(np.zeros(2, np.int64), env_ids=[0, 1])  # env 0 is in flight
        env.send(np.array([1, 1]), env_ids=[1, 3])
        replay.step([1, 3], [1, 1])
        got = env.recv(timeout=5)  # 1, 2 and 3 are done long before the slow env 0
        assert 0 not in got[4]["env_id"]
        replay.check(got, "fast batch")
        env.send(np.zeros(2, np.int64))
        replay.step(got[4]["env_id"], [0, 0])
        with pytest.raises(multiprocessing.TimeoutError):
            while True:  # the fast envs come and go; a batch without env 0 is not enough soon
                got = env.recv(timeout=0.0)
                replay.check(got, "fast batch")
                env.send(np.zeros(2, np.int64))
                replay.step(got[4]["env_id"], [0, 0])
        got = env.recv()
        replay.check(got, "after the timeout")
    finally:
        env.close()
        replay.close()


def test_ready_workers_are_chosen_and_checked():
    from fastvec.engine import batch_workers

    assert batch_workers(None, 16, 8, 2, "ready") == 2  # 8 envs each: one worker a batch
    assert batch_workers(None, 16, 4, 2, "ready") == 4  # a batch must be fewer than every env
    assert batch_workers(None, 6, 3, 4, "ready") == 6  # 4 does not divide 6; 6 workers of 1
    assert batch_workers(3, 6, 6, 2, "ready") == 3
    with pytest.raises(ValueError, match="whole workers' envs"):
        batch_workers(4, 16, 2, 2, "ready")  # 4 envs a worker do not fit a batch of 2


@pytest.mark.parametrize("batch_mode", ["groups", "ready"])
def test_an_env_error_in_a_batch_loses_no_other_results(batch_mode):
    """An env raising in its step: recv raises the env's error; every other env's
    results still come (ready: those of the same batch too), the failed envs are
    named, and async_reset() makes every env usable again."""
    from fault_envs import make_faulty

    fns = [functools.partial(make_faulty, i) for i in range(4)]
    env = fastvec.AsyncVectorEnv(
        fns, num_workers=4, batch_size=2 if batch_mode == "groups" else 4, batch_mode=batch_mode
    )
    try:
        env.async_reset(seed=0)
        first = env.recv()
        if batch_mode == "groups":
            env.recv()
        env.set_attr("arm_step", [None, "raise", None, None])  # nothing in flight: lock-step calls work
        ids = first[4]["env_id"]
        env.send(np.zeros(len(ids), np.int64), env_ids=ids)
        if batch_mode == "groups":
            env.send(np.zeros(2, np.int64))
        with pytest.raises(ValueError, match="injected step fault in env 1"):
            env.recv()  # groups: envs 0, 1; ready: 0..3 in one batch, env 1 failing
        if batch_mode == "groups":
            good = env.recv()  # the other group is unharmed
            assert good[4]["env_id"].tolist() == [2, 3] and good[0].shape == (2, 4)
            with pytest.raises(NoAsyncCallError, match="failed"):
                env.recv()  # envs 0, 1: their step failed
        else:
            with pytest.raises(NoAsyncCallError, match="failed"):
                env.recv()  # a whole batch needs every worker: one failed
        env.async_reset(seed=1)  # collects what is still in flight (results dropped: every env resets)
        for _ in range(2 if batch_mode == "groups" else 1):
            got = env.recv()
            env.send(np.zeros(len(got[4]["env_id"]), np.int64))
        assert env.recv()[0].shape[1] == 4
    finally:
        env.close()
