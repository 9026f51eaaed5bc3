"""Stable-Baselines3 accepts ``fastvec.SubprocVecEnv``: algorithms, VecEnv wrappers, and
the checks of SB3's own vec-env test suite (tests/test_vec_envs.py), re-implemented here
and run against both ``DummyVecEnv`` and ``fastvec.SubprocVecEnv``."""

from __future__ import annotations

import functools
import multiprocessing
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import ImageEnv, RandomEndEnv, SB3CustomEnv, StepCounterEnv
from gymnasium import spaces
from helpers import assert_same
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    VecEnv,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
)

import fastvec

N_ENVS = 3


VEC_ENV_CLASSES = [DummyVecEnv, fastvec.SubprocVecEnv]
CLASS_IDS = ["dummy", "fastvec"]
VEC_ENV_WRAPPERS = [None, VecNormalize, VecFrameStack]


def wrap(vec_env, wrapper):
    if wrapper is None:
        return vec_env
    if wrapper is VecFrameStack:
        return VecFrameStack(vec_env, n_stack=2)
    return wrapper(vec_env)


def make_cartpole():
    return gym.make("CartPole-v1")


# --------------------------------------------------------------------------- algorithms
def _params(model):
    return [p.detach().clone() for p in model.policy.parameters()]


@pytest.mark.parametrize(
    "algo,kwargs",
    [
        (PPO, dict(n_steps=32, batch_size=32, n_epochs=2)),
        (A2C, dict(n_steps=8)),
    ],
    ids=["PPO", "A2C"],
)
def test_algorithm_learns_identically_to_dummy(algo, kwargs):
    """Same seed, same envs: training on fastvec gives bit-identical weights to
    training on DummyVecEnv (the rollouts must have been identical)."""
    torch.set_num_threads(1)
    fns = [make_cartpole, make_cartpole]
    results = []
    for cls in (DummyVecEnv, fastvec.SubprocVecEnv):
        venv = cls(fns)
        try:
            model = algo("MlpPolicy", venv, seed=0, device="cpu", **kwargs)
            model.learn(256)
            assert model.num_timesteps >= 256
            results.append(_params(model))
        finally:
            venv.close()
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_ppo_with_vecnormalize_and_vecmonitor():
    venv = VecNormalize(VecMonitor(fastvec.SubprocVecEnv([make_cartpole] * 2)))
    try:
        model = PPO("MlpPolicy", venv, n_steps=32, batch_size=32, n_epochs=1, seed=1, device="cpu")
        model.learn(128)
        assert model.num_timesteps >= 128
        obs = venv.reset()
        action, _ = model.predict(obs, deterministic=True)
        assert action.shape == (2,)
    finally:
        venv.close()


# --------------------------------------------------------------------------- wrappers, lockstep
def _strip_episode_time(infos):
    out = []
    for info in infos:
        info = dict(info)
        if "episode" in info:
            info["episode"] = {k: v for k, v in info["episode"].items() if k != "t"}
        out.append(info)
    return out


WRAPPER_CASES = {
    "VecNormalize": (RandomEndEnv, lambda v: VecNormalize(v, gamma=0.9)),
    "VecMonitor": (RandomEndEnv, VecMonitor),
    "VecFrameStack": (RandomEndEnv, lambda v: VecFrameStack(v, n_stack=3)),
    "VecFrameStack-image": (ImageEnv, lambda v: VecFrameStack(v, n_stack=2)),
    "VecTransposeImage": (ImageEnv, VecTransposeImage),
    "Transpose+FrameStack+Monitor": (ImageEnv, lambda v: VecFrameStack(VecTransposeImage(VecMonitor(v)), 2)),
}


@pytest.mark.parametrize("case", list(WRAPPER_CASES))
def test_wrapper_lockstep(case):
    maker, wrapper = WRAPPER_CASES[case]
    fns = [maker] * N_ENVS
    env = wrapper(fastvec.SubprocVecEnv(fns, num_workers=2))
    ref = wrapper(DummyVecEnv(fns))
    try:
        assert env.observation_space == ref.observation_space
        env.seed(6)
        ref.seed(6)
        assert_same(env.reset(), ref.reset(), "reset")
        space = env.action_space
        space.seed(6)
        dones = 0
        for t in range(40):
            a = np.array([space.sample() for _ in range(N_ENVS)])
            obs, rew, done, infos = env.step(a)
            robs, rrew, rdone, rinfos = ref.step(a)
            assert_same(obs, robs, f"step {t} obs")
            assert_same(rew, rrew, f"step {t} rewards")
            assert_same(done, rdone, f"step {t} dones")
            assert_same(_strip_episode_time(infos), _strip_episode_time(rinfos), f"step {t} infos")
            dones += int(done.sum())
        assert dones > 0
    finally:
        env.close()
        ref.close()


# --------------------------------------------------------------------------- SB3's vec-env checks
def _make_custom_monitored():
    return Monitor(SB3CustomEnv(spaces.Box(low=np.zeros(2, np.float32), high=np.ones(2, np.float32))))


@pytest.mark.parametrize("vec_env_wrapper", VEC_ENV_WRAPPERS, ids=["plain", "VecNormalize", "VecFrameStack"])
@pytest.mark.parametrize("vec_env_class", VEC_ENV_CLASSES, ids=CLASS_IDS)
def test_vecenv_custom_calls(vec_env_class, vec_env_wrapper):
    vec_env = wrap(vec_env_class([_make_custom_monitored for _ in range(N_ENVS)]), vec_env_wrapper)
    try:
        vec_env.seed(0)
        explicit = vec_env.render(mode="rgb_array")
        implicit = vec_env.render()
        assert explicit is not None and np.array_equal(explicit, implicit)
        with pytest.warns(UserWarning):
            vec_env.render(mode="something_else")

        # set_attr sets on the outermost gymnasium wrapper (Monitor here)
        assert not vec_env.has_attr("dummy")
        vec_env.set_attr("dummy", 12)
        assert vec_env.get_attr("dummy") == [12] * N_ENVS
        assert not vec_env.has_attr("dummy2")
        vec_env.env_method("set_wrapper_attr", "dummy2", 2)
        assert vec_env.get_attr("dummy2") == [2] * N_ENVS

        method_results = vec_env.env_method("custom_method", 1, indices=None, dim_1=2)
        set_results = [vec_env.set_attr("dummy1", i, indices=i) for i in range(N_ENVS)]
        assert vec_env.has_attr("dummy1")
        get_results = vec_env.get_attr("dummy1")
        assert len(method_results) == len(set_results) == len(get_results) == N_ENVS
        for i in range(N_ENVS):
            assert (method_results[i] == np.ones((1, 2))).all()
            assert set_results[i] is None
            assert get_results[i] == i

        subset = vec_env.env_method("custom_method", 1, indices=[0, 2], dim_1=3)
        assert len(subset) == 2
        assert all((r == np.ones((1, 3))).all() for r in subset)

        assert vec_env.set_attr("dummy1", 42, indices=None) is None
        assert vec_env.get_attr("dummy1") == [42] * N_ENVS

        vec_env.reset()
        assert vec_env.env_method("set_wrapper_attr", "current_step", 12, indices=[0, 1]) == [True, True]
        assert vec_env.get_attr("current_step") == [12, 12] + [0] * (N_ENVS - 2)
        assert vec_env.get_attr("current_step", indices=[0, 1]) == [12, 12]
        assert vec_env.get_attr("current_step", indices=[0, 2]) == [12, 0]

        vec_env.reset()
        assert vec_env.env_method("set_wrapper_attr", "current_step", 12, indices=[0, -1]) == [True, True]
        assert vec_env.get_attr("current_step") == [12] + [0] * (N_ENVS - 2) + [12]
        assert vec_env.get_attr("current_step", indices=[-1]) == [12]

        # options reach the envs at the next reset only
        assert vec_env.get_attr("current_options")[0] is None
        options = {"hello": 1}
        vec_env.set_options(options)
        assert vec_env.get_attr("current_options")[0] is None
        vec_env.reset()
        assert vec_env.get_attr("current_options") == [options] * N_ENVS
        vec_env.reset()
        assert vec_env.get_attr("current_options")[0] is None
        options = [{"hello": 1}] * N_ENVS
        options[0] = {"other_option": 2}
        vec_env.set_options(options)
        vec_env.reset()
        assert vec_env.get_attr("current_options") == options
    finally:
        vec_env.close()


@pytest.mark.parametrize("vec_env_wrapper", VEC_ENV_WRAPPERS, ids=["plain", "VecNormalize", "VecFrameStack"])
@pytest.mark.parametrize("vec_env_class", VEC_ENV_CLASSES, ids=CLASS_IDS)
def test_vecenv_terminal_obs(vec_env_class, vec_env_wrapper):
    step_nums = [i + 5 for i in range(N_ENVS)]
    vec_env = wrap(vec_env_class([functools.partial(StepCounterEnv, n) for n in step_nums]), vec_env_wrapper)
    try:
        zero_acts = np.zeros((N_ENVS,), dtype=int)
        prev_obs_b = vec_env.reset()
        for step_num in range(1, max(step_nums) + 1):
            obs_b, _, done_b, info_b = vec_env.step(zero_acts)
            assert len(obs_b) == len(done_b) == len(info_b) == N_ENVS
            for prev_obs, obs, done, info, final in zip(prev_obs_b, obs_b, done_b, info_b, step_nums):
                assert done == (step_num == final)
                if not done:
                    assert "terminal_observation" not in info
                    assert info["TimeLimit.truncated"] is False
                else:
                    assert info["TimeLimit.truncated"] is True
                    terminal_obs = info["terminal_observation"]
                    assert np.all(prev_obs < terminal_obs)
                    assert np.all(obs < prev_obs)
                    if not isinstance(vec_env, VecNormalize):
                        assert np.all(prev_obs + 1 == terminal_obs)
                        assert np.all(obs == 0)
            prev_obs_b = obs_b
    finally:
        vec_env.close()


SPACES = {
    "discrete": spaces.Discrete(2),
    "multidiscrete": spaces.MultiDiscrete([2, 3]),
    "multibinary": spaces.MultiBinary(3),
    "continuous": spaces.Box(low=np.zeros(2, dtype=np.float32), high=np.ones(2, dtype=np.float32)),
}


def check_vecenv_spaces(vec_env_class, space, obs_assert):
    vec_env = vec_env_class([functools.partial(SB3CustomEnv, space) for _ in range(N_ENVS)])
    try:
        obs = vec_env.reset()
        obs_assert(obs)
        dones = [False] * N_ENVS
        steps = 0
        while not any(dones):
            actions = [vec_env.action_space.sample() for _ in range(N_ENVS)]
            obs, _rews, dones, _infos = vec_env.step(actions)
            obs_assert(obs)
            steps += 1
        assert steps == 4  # episodes of SB3CustomEnv last 4 steps
    finally:
        vec_env.close()


def check_vecenv_obs(obs, space):
    assert obs.shape[0] == N_ENVS
    for value in obs:
        assert space.contains(value)


@pytest.mark.parametrize("space", list(SPACES.values()), ids=list(SPACES))
@pytest.mark.parametrize("vec_env_class", VEC_ENV_CLASSES, ids=CLASS_IDS)
def test_vecenv_single_space(vec_env_class, space):
    check_vecenv_spaces(vec_env_class, space, lambda obs: check_vecenv_obs(obs, space))


class _UnorderedDictSpace(spaces.Dict):
    """Like Dict, but samples a plain dict with its keys in another order."""

    def sample(self, mask=None, probability=None):
        return dict(reversed(list(super().sample().items())))


@pytest.mark.parametrize("vec_env_class", VEC_ENV_CLASSES, ids=CLASS_IDS)
def test_vecenv_dict_spaces(vec_env_class):
    space = spaces.Dict(SPACES)

    def obs_assert(obs):
        assert isinstance(obs, dict)
        assert list(obs.keys()) == list(space.spaces.keys())
        for key, values in obs.items():
            check_vecenv_obs(values, space.spaces[key])

    check_vecenv_spaces(vec_env_class, space, obs_assert)
    check_vecenv_spaces(vec_env_class, _UnorderedDictSpace(SPACES), obs_assert)


@pytest.mark.parametrize("vec_env_class", VEC_ENV_CLASSES, ids=CLASS_IDS)
def test_vecenv_tuple_spaces(vec_env_class):
    space = spaces.Tuple(tuple(SPACES.values()))

    def obs_assert(obs):
        assert isinstance(obs, tuple)
        assert len(obs) == len(space.spaces)
        for values, inner in zip(obs, space.spaces):
            check_vecenv_obs(values, inner)

    check_vecenv_spaces(vec_env_class, space, obs_assert)


def test_subproc_start_method():
    space = spaces.Discrete(2)
    methods = [None] + [m for m in ("fork", "forkserver", "spawn") if m in multiprocessing.get_all_start_methods()]
    for method in methods:
        cls = functools.partial(fastvec.SubprocVecEnv, start_method=method)
        check_vecenv_spaces(cls, space, lambda obs: check_vecenv_obs(obs, space))
    with pytest.raises(ValueError, match="illegal_method"):
        fastvec.SubprocVecEnv([functools.partial(SB3CustomEnv, space)] * 2, start_method="illegal_method")


def test_vec_env_is_wrapped():
    def plain():
        return SB3CustomEnv(spaces.Box(low=np.zeros(2, np.float32), high=np.ones(2, np.float32)))

    def monitored():
        return Monitor(plain())

    for cls in VEC_ENV_CLASSES:
        vec_env = cls([plain, monitored])
        try:
            assert vec_env.env_is_wrapped(Monitor) == [False, True]
            assert VecFrameStack(vec_env, n_stack=2).env_is_wrapped(Monitor) == [False, True]
        finally:
            vec_env.close()


@pytest.mark.parametrize("vec_env_class", VEC_ENV_CLASSES, ids=CLASS_IDS)
def test_vec_deterministic(vec_env_class):
    def make_env():
        return SB3CustomEnv(spaces.Box(low=np.zeros(2, np.float32), high=np.ones(2, np.float32)))

    vec_env = vec_env_class([make_env for _ in range(N_ENVS)])
    try:
        vec_env.seed(3)
        obs = vec_env.reset()
        vec_env.seed(3)
        assert np.allclose(vec_env.reset(), obs)
        vec_normalize = VecNormalize(vec_env)
        vec_normalize.seed(3)
        obs = vec_env.reset()
        vec_normalize.seed(3)
        assert np.allclose(vec_env.reset(), obs)
    finally:
        vec_env.close()
    env_1 = make_vec_env("Pendulum-v1", n_envs=N_ENVS, vec_env_cls=vec_env_class, seed=0)
    env_2 = make_vec_env("Pendulum-v1", n_envs=N_ENVS, vec_env_cls=vec_env_class, seed=0)
    try:
        assert np.allclose(env_1.reset(), env_2.reset())
        actions = [env_1.action_space.sample() for _ in range(N_ENVS)]
        assert np.allclose(env_1.step(actions)[0], env_2.step(actions)[0])
    finally:
        env_1.close()
        env_2.close()


def test_make_vec_env_matches_dummy():
    kwargs = dict(n_envs=N_ENVS, seed=5, vec_env_kwargs=None)
    env = make_vec_env("Pendulum-v1", vec_env_cls=fastvec.SubprocVecEnv, **kwargs)
    ref = make_vec_env("Pendulum-v1", vec_env_cls=DummyVecEnv, **kwargs)
    try:
        assert isinstance(env, VecEnv)
        assert_same(env.reset(), ref.reset(), "reset")
        assert env.env_is_wrapped(Monitor) == ref.env_is_wrapped(Monitor) == [True] * N_ENVS
        rng = np.random.default_rng(0)
        for t in range(210):  # Pendulum truncates at 200 steps
            a = rng.uniform(-2, 2, (N_ENVS, 1)).astype(np.float32)
            got, want = env.step(a), ref.step(a)
            for k, name in enumerate(("obs", "rewards", "dones")):
                assert_same(got[k], want[k], f"step {t} {name}")
            assert_same(_strip_episode_time(got[3]), _strip_episode_time(want[3]), f"step {t} infos")
        assert_same(env.reset_infos, ref.reset_infos, "reset_infos")
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("vec_env_class", VEC_ENV_CLASSES, ids=CLASS_IDS)
def test_vec_seeding(vec_env_class):
    def make_env():
        return SB3CustomEnv(spaces.Box(low=np.zeros(2, np.float32), high=np.ones(2, np.float32)))

    makers = [vec_env_class]
    if vec_env_class is not DummyVecEnv:
        makers = [
            functools.partial(fastvec.SubprocVecEnv, start_method=m)
            for m in ("fork", "forkserver", "spawn")
            if m in multiprocessing.get_all_start_methods()
        ]
    for maker in makers:
        vec_env = maker([make_env] * 3)
        try:
            vec_env.seed()
            obs = vec_env.reset()
            _, rewards, _, _ = vec_env.step(np.array([vec_env.action_space.sample() for _ in range(3)]))
            assert not np.allclose(obs[0], obs[1])
            assert not np.allclose(rewards[0], rewards[1])
            assert not np.allclose(obs[1], obs[2])
            assert not np.allclose(rewards[1], rewards[2])
        finally:
            vec_env.close()


@pytest.mark.parametrize("vec_env_class", VEC_ENV_CLASSES, ids=CLASS_IDS)
def test_render_rgb_array(vec_env_class):
    """SB3's render test, rgb_array part (the human part needs a display)."""
    fn = functools.partial(RandomEndEnv, render_mode="rgb_array")
    vec_env = vec_env_class([fn, fn])
    try:
        vec_env.reset()
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            big = vec_env.render()
            assert np.array_equal(big, vec_env.render("rgb_array"))
        assert len(record) == 0
        assert big.shape == (16, 8, 3) and big.dtype == np.uint8  # 2 frames of 8x8, tiled
        with pytest.warns(UserWarning):
            vec_env.render(mode="blah")
        for _ in range(3):
            vec_env.step([vec_env.action_space.sample() for _ in range(2)])
            vec_env.render()
        stacked = VecFrameStack(vec_env, 2)
        stacked.render()
        assert stacked.render_mode == "rgb_array"
        normalized = VecNormalize(stacked)
        assert normalized.render_mode == "rgb_array"
        assert np.array_equal(normalized.render(), vec_env.render())  # through both wrappers: the envs' frames
    finally:
        vec_env.close()


def test_is_a_vecenv():
    env = fastvec.SubprocVecEnv([make_cartpole])
    try:
        assert isinstance(env, VecEnv)
        assert env.unwrapped is env
        assert env.num_envs == 1 and env.num_workers == 1
    finally:
        env.close()
