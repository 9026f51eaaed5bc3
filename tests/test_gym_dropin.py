"""``fastvec.AsyncVectorEnv`` as a drop-in for ``gymnasium.vector.AsyncVectorEnv``:
gymnasium's constructor keywords, its error classes, ``observation_mode``, and an env's
own exception type reaching the caller. References: gymnasium's ``SyncVectorEnv`` and
``AsyncVectorEnv`` built with the same arguments."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.vector import SyncVectorEnv
from gymnasium.vector.utils import batch_differing_spaces

import fastvec
from fastvec import WorkerError


class EnvSpecificError(Exception):
    """An env's own exception type (with a constructor of its own)."""

    def __init__(self, code: int, detail: str):
        super().__init__(f"code {code}: {detail}")
        self.code = code


class Raising(gym.Wrapper):
    def __init__(self, exc_factory, where="reset"):
        super().__init__(gym.make("CartPole-v1"))
        self.exc_factory, self.where = exc_factory, where

    def reset(self, **kw):
        if self.where == "reset":
            raise self.exc_factory()
        return self.env.reset(**kw)

    def step(self, action):
        if self.where == "step":
            raise self.exc_factory()
        return self.env.step(action)


class Bounded(gym.Env):
    """A Box observation whose bounds depend on ``scale``: same layout, other bounds."""

    def __init__(self, scale: float):
        self.observation_space = spaces.Box(-scale, scale, (3,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.scale = scale

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.uniform(-self.scale, self.scale, 3).astype(np.float32), {}

    def step(self, action):
        obs = self.np_random.uniform(-self.scale, self.scale, 3).astype(np.float32)
        return obs, float(action), False, False, {}


class SpawnsAProcess(gym.Wrapper):
    """Starts a multiprocessing child in its constructor (daemonic workers may not)."""

    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))
        self.child = multiprocessing.get_context("fork").Process(target=pow, args=(2, 3))
        self.child.start()
        self.child.join()


def cartpoles(n=4):
    return [lambda: gym.make("CartPole-v1")] * n


def test_gymnasium_constructor_keywords_are_accepted_and_change_nothing():
    ref = SyncVectorEnv(cartpoles())
    kw = dict(
        shared_memory=True,
        copy=True,
        context="fork",
        daemon=True,
        worker=None,
        observation_mode="same",
        max_concurrency=None,
    )
    candidates = [
        fastvec.AsyncVectorEnv(cartpoles(), **kw),
        fastvec.AsyncVectorEnv(cartpoles(), False, True, "fork"),  # gymnasium's positional order
        fastvec.AsyncVectorEnv(cartpoles(), shared_memory=False),
    ]
    try:
        want_obs, _ = ref.reset(seed=5)
        for v in candidates:
            obs, _ = v.reset(seed=5)
            np.testing.assert_array_equal(obs, want_obs)
        rng = np.random.default_rng(0)
        for _ in range(60):
            a = rng.integers(0, 2, 4)
            want = ref.step(a)
            for v in candidates:
                got = v.step(a)
                for x, y in zip(got[:4], want[:4]):
                    np.testing.assert_array_equal(x, y)
    finally:
        ref.close()
        for v in candidates:
            v.close()
    assert candidates[1].shared_memory is False and candidates[1].copy is True


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"worker": lambda *a: None}, "custom `worker`"),
        ({"shared_memory": "yes"}, "shared_memory"),
        ({"observation_mode": "mixed"}, "observation_mode"),
        ({"observation_mode": (spaces.Discrete(2),)}, "observation_mode"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"max_concurrency": 1, "num_workers": 2}, "exceeds max_concurrency"),
        ({"daemon": "no"}, "daemon"),
    ],
)
def test_bad_gymnasium_keywords_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fastvec.AsyncVectorEnv(cartpoles(), **kwargs)


def test_max_concurrency_caps_the_workers():
    with fastvec.AsyncVectorEnv(cartpoles(), max_concurrency=1) as v:
        assert v.num_workers == 1
        v.reset(seed=0)


def test_gymnasium_error_classes():
    v = fastvec.AsyncVectorEnv(cartpoles(2))
    v.reset(seed=0)
    with pytest.raises(NoAsyncCallError):
        v.step_wait()
    v.step_async(np.zeros(2, dtype=np.int64))
    with pytest.raises(AlreadyPendingCallError):
        v.step_async(np.zeros(2, dtype=np.int64))
    with pytest.raises(AlreadyPendingCallError):
        v.step(np.zeros(2, dtype=np.int64))
    v.step_wait()
    v.close()
    with pytest.raises(ClosedEnvironmentError):
        v.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(fastvec.ClosedError):
        v.reset()


@pytest.mark.parametrize("where", ["reset", "step"])
def test_an_envs_exception_is_an_instance_of_its_type(where):
    """``except ValueError`` catches an env's ValueError, and ``except WorkerError`` too;
    the message, the env index and the worker's traceback are kept; it pickles."""
    v = fastvec.AsyncVectorEnv(
        [lambda: gym.make("CartPole-v1"), lambda: Raising(lambda: ValueError("bad value in env"), where)]
    )
    try:
        if where == "step":
            v.reset(seed=0)
        with pytest.raises(ValueError, match="bad value in env") as info:
            v.reset(seed=0) if where == "reset" else v.step(np.zeros(2, dtype=np.int64))
        exc = info.value
        assert isinstance(exc, WorkerError) and exc.cause_class is ValueError
        assert exc.env_index == 1 and exc.exc_type == "ValueError" and exc.exc_message == "bad value in env"
        assert "Traceback in the worker" in str(exc) and "bad value in env" in exc.worker_traceback
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is type(exc) and again.env_index == 1 and str(again) == str(exc)
    finally:
        v.close()


def test_custom_and_unmixable_exception_types():
    v = fastvec.AsyncVectorEnv([lambda: Raising(lambda: EnvSpecificError(7, "boom"))])
    try:
        with pytest.raises(EnvSpecificError, match="code 7: boom") as info:
            v.reset(seed=0)
        assert isinstance(info.value, WorkerError)
    finally:
        v.close()
    # OSError's C layout cannot be mixed with RuntimeError's: a plain WorkerError still says all
    v = fastvec.AsyncVectorEnv([lambda: Raising(lambda: FileNotFoundError("no such rom"))])
    try:
        with pytest.raises(WorkerError, match="FileNotFoundError: no such rom") as info:
            v.reset(seed=0)
        assert info.value.exc_type == "FileNotFoundError"
    finally:
        v.close()


def test_sb3_door_raises_the_envs_type_too():
    v = fastvec.SubprocVecEnv([lambda: Raising(lambda: KeyError("missing key"), "step")] * 2)
    try:
        v.reset()
        with pytest.raises(KeyError) as info:
            v.step(np.zeros(2, dtype=np.int64))
        assert isinstance(info.value, WorkerError) and "missing key" in str(info.value)
    finally:
        v.close()


def _bounded_fns():
    return [lambda s=s: Bounded(s) for s in (1.0, 2.0, 3.0)]


def test_observation_mode_same_refuses_other_bounds_as_gymnasium_does():
    with pytest.raises(RuntimeError, match="observation_mode='same'"):
        SyncVectorEnv(_bounded_fns(), observation_mode="same")
    with pytest.raises(RuntimeError, match="share their observation spaces") as info:
        fastvec.AsyncVectorEnv(_bounded_fns(), observation_mode="same")
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("mode", ["different", "tuple"])
def test_observation_mode_against_gymnasium(mode):
    """Envs whose spaces differ only in bounds: the spaces are gymnasium's, and the
    steps are SyncVectorEnv's."""
    ref = SyncVectorEnv(_bounded_fns(), observation_mode="different")
    if mode == "tuple":
        mode = (ref.observation_space, ref.single_observation_space)
    v = fastvec.AsyncVectorEnv(_bounded_fns(), observation_mode=mode)
    try:
        assert v.single_observation_space == ref.single_observation_space
        assert v.observation_space == ref.observation_space
        if mode == "different":
            assert v.observation_space == batch_differing_spaces([Bounded(s).observation_space for s in (1, 2, 3)])
        np.testing.assert_array_equal(v.reset(seed=3)[0], ref.reset(seed=3)[0])
        for t in range(20):
            a = np.array([t % 2] * 3)
            for x, y in zip(v.step(a)[:4], ref.step(a)[:4]):
                np.testing.assert_array_equal(x, y)
    finally:
        v.close()
        ref.close()


def test_observation_mode_tuple_and_layout_checks():
    single = spaces.Box(-5, 5, (3,), np.float32)
    batched = spaces.Box(-5, 5, (3, 3), np.float32)
    with fastvec.AsyncVectorEnv(_bounded_fns(), observation_mode=(batched, single)) as v:
        assert v.observation_space is batched and v.single_observation_space is single
        assert v.reset(seed=0)[0].shape == (3, 3)
    wrong = spaces.Box(-5, 5, (4,), np.float32)
    with pytest.raises(ValueError, match="layout"):
        fastvec.AsyncVectorEnv(_bounded_fns(), observation_mode=(spaces.Box(-5, 5, (3, 4), np.float32), wrong))
    # another layout is still refused, in any mode; the SB3 door keeps SB3's equal spaces
    fns = [lambda: Bounded(1.0), lambda: gym.make("CartPole-v1")]
    with pytest.raises(ValueError, match="leaves, shapes and dtypes"):
        fastvec.AsyncVectorEnv(fns, observation_mode="different")
    with pytest.raises(ValueError, match="share their observation spaces"):
        fastvec.SubprocVecEnv(_bounded_fns())


def test_daemon_false_lets_envs_start_processes():
    with pytest.raises(WorkerError, match="daemonic processes are not allowed to have children"):
        fastvec.AsyncVectorEnv([SpawnsAProcess] * 2, daemon=True)
    with fastvec.AsyncVectorEnv([SpawnsAProcess] * 2, daemon=False) as v:
        assert v.reset(seed=0)[0].shape == (2, 4)


class Slow(gym.Wrapper):
    """CartPole whose reset, step and ``nap`` sleep ``delay`` seconds or, given a
    ``gate`` (a file path), wait while that file is absent (at most 30 s)."""

    def __init__(self, delay=0.3, gate=None):
        super().__init__(gym.make("CartPole-v1"))
        self.delay = delay
        self.gate = gate

    def _pause(self):
        if self.gate is None:
            time.sleep(self.delay)
            return
        deadline = time.monotonic() + 30.0
        while not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.001)

    def reset(self, **kw):
        self._pause()
        return self.env.reset(**kw)

    def step(self, action):
        self._pause()
        return self.env.step(action)

    def nap(self, x):
        self._pause()
        return x * 2


def test_async_pairs_match_the_synchronous_calls():
    ref = SyncVectorEnv(cartpoles(3))
    v = fastvec.AsyncVectorEnv(cartpoles(3))
    try:
        v.reset_async(seed=[1, 2, 3])
        obs, infos = v.reset_wait()
        want, want_infos = ref.reset(seed=[1, 2, 3])
        np.testing.assert_array_equal(obs, want)
        assert infos == want_infos
        v.call_async("get_wrapper_attr", "spec")
        assert [s.id for s in v.call_wait()] == ["CartPole-v1"] * 3
        v.step_async(np.array([0, 1, 0]))
        for x, y in zip(v.step_wait(timeout=10.0)[:4], ref.step(np.array([0, 1, 0]))[:4]):
            np.testing.assert_array_equal(x, y)
        with pytest.raises(NoAsyncCallError):
            v.reset_wait()
        with pytest.raises(NoAsyncCallError):
            v.call_wait()
        v.reset_async(seed=0)
        for call in (
            lambda: v.step(np.zeros(3, dtype=np.int64)),
            lambda: v.reset(),
            lambda: v.call_async("nap"),
            lambda: v.get_attr("spec"),
            lambda: v.set_attr("x", 1),
        ):
            with pytest.raises(AlreadyPendingCallError):
                call()
        with pytest.raises(NoAsyncCallError):
            v.call_wait()  # a reset is in flight, not a call
        np.testing.assert_array_equal(v.reset_wait()[0], ref.reset(seed=0)[0])
    finally:
        v.close()
        ref.close()


@pytest.mark.parametrize("what", ["step", "reset", "call"])
def test_timeout_raises_multiprocessing_timeout_and_loses_nothing(what, tmp_path):
    """gymnasium's ``timeout=`` raises ``multiprocessing.TimeoutError``; here the call
    stays in flight and a second wait returns its results, equal to SyncVectorEnv's.
    The envs are held in the call until the test lets them go, so the first wait cannot
    have had their results, however slow the host."""
    gate = tmp_path / "open"
    gate.touch()
    ref = SyncVectorEnv([lambda: Slow(0.0)] * 2)
    v = fastvec.AsyncVectorEnv([lambda: Slow(gate=str(gate))] * 2)
    try:
        if what != "reset":
            v.reset(seed=7)
            ref.reset(seed=7)
        send, wait = {
            "step": (lambda: v.step_async(np.array([1, 0])), v.step_wait),
            "reset": (lambda: v.reset_async(seed=7), v.reset_wait),
            "call": (lambda: v.call_async("nap", 21), v.call_wait),
        }[what]
        gate.unlink()  # from here the envs wait in the call
        send()
        t0 = time.monotonic()
        with pytest.raises(multiprocessing.TimeoutError, match="timed out after 0.05"):
            wait(timeout=0.05)
        # generous (100 times the timeout): a wait that ignored it would sit out the 30 s hold
        assert time.monotonic() - t0 < 5.0
        gate.touch()
        got = wait(timeout=5.0)
        if what == "step":
            for x, y in zip(got[:4], ref.step(np.array([1, 0]))[:4]):
                np.testing.assert_array_equal(x, y)
        elif what == "reset":
            np.testing.assert_array_equal(got[0], ref.reset(seed=7)[0])
        else:
            assert got == (42, 42)
        with pytest.raises(ValueError, match="timeout"):
            v.reset_async(seed=0)
            v.reset_wait(timeout=-1)
    finally:
        v.close()  # also with the reset above in flight
        ref.close()


class CountTo(gym.Env):
    """A Discrete observation counting up to ``n``, given as a Python int or (``numpy``)
    a numpy integer: SyncVectorEnv's ``final_obs`` keeps whichever the env gave."""

    observation_space = spaces.Discrete(6)
    action_space = spaces.Discrete(2)

    def __init__(self, n: int, numpy: bool):
        self.n, self.numpy, self.count = n, numpy, 0

    def _obs(self):
        return np.int64(self.count) if self.numpy else self.count

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return self._obs(), {}

    def step(self, action):
        self.count += 1
        return self._obs(), 1.0, self.count >= self.n, False, {}


@pytest.mark.parametrize("door", ["gym", "sb3"])
def test_final_discrete_observation_keeps_the_envs_type(door):
    from helpers import assert_same
    from stable_baselines3.common.vec_env import DummyVecEnv

    fns = [lambda: CountTo(2, False), lambda: CountTo(3, True), lambda: CountTo(2, True), lambda: CountTo(3, False)]
    if door == "gym":
        env = fastvec.AsyncVectorEnv(fns, num_workers=2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        ref = SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        assert_same(env.reset(seed=0), ref.reset(seed=0), "reset")
    else:
        env, ref = fastvec.SubprocVecEnv(fns, num_workers=2), DummyVecEnv(fns)
        assert_same(env.reset(), ref.reset(), "reset")
    try:
        for t in range(7):
            actions = np.zeros(4, np.int64)
            got, want = env.step(actions), ref.step(actions)
            assert_same(got, want, f"step {t}")
    finally:
        env.close()
        ref.close()
