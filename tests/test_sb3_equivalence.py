"""``fastvec.SubprocVecEnv`` against Stable-Baselines3's ``DummyVecEnv``, step by step.

Same env factories, seeds, options and actions; observations (values and dtypes),
rewards (float32), dones, infos (``terminal_observation``, ``TimeLimit.truncated``) and
``reset_infos`` must match after every step.
"""

from __future__ import annotations

import functools
import warnings

import gymnasium as gym
import numpy as np
import pytest
from envs import DictTupleEnv, FlatInfoEnv, RandomEndEnv, SteadyInfoEnv
from helpers import assert_same, copy_nested, count_builds, leaves
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv

import fastvec

LAYOUTS = [(3, 1), (5, 2), (4, 3)]


def make_cartpole():
    return gym.make("CartPole-v1")


def make_dict():
    # DummyVecEnv rejects nested Dict/Tuple observation spaces
    return DictTupleEnv(nested=False)


def make_random_end():
    return RandomEndEnv()


ENV_MAKERS = {
    "cartpole": make_cartpole,
    "dict": make_dict,
    "random_end": make_random_end,
    "flat_info": FlatInfoEnv,
    "steady_info": SteadyInfoEnv,
}


def make_pair(maker, num_envs, num_workers=2, **kwargs):
    fns = [maker for _ in range(num_envs)]
    return fastvec.SubprocVecEnv(fns, num_workers=num_workers, **kwargs), DummyVecEnv(fns)


def sample_actions(space, n):
    """A batch of ``n`` actions drawn from the (seeded) single action ``space``."""
    return np.array([space.sample() for _ in range(n)])


def compare_step(got, want, where):
    obs, rew, done, infos = got
    robs, rrew, rdone, rinfos = want
    assert_same(obs, robs, f"{where} obs")
    assert rew.dtype == np.float32 == rrew.dtype
    assert_same(rew, rrew, f"{where} rewards")
    assert done.dtype == rdone.dtype == np.bool_
    assert_same(done, rdone, f"{where} dones")
    assert isinstance(infos, list) and len(infos) == len(rinfos)
    assert_same(infos, rinfos, f"{where} infos")


def run_lockstep(env, ref, steps, seed):
    seen = {"dones": 0, "truncated": 0, "infos": 0}
    env.seed(seed)
    ref.seed(seed)
    assert_same(env.reset(), ref.reset(), "reset obs")
    assert_same(env.reset_infos, ref.reset_infos, "reset_infos after reset")
    space = env.action_space
    space.seed(seed + 77)
    for t in range(steps):
        actions = sample_actions(space, env.num_envs)
        want = ref.step(actions)
        got = env.step(actions)
        compare_step(got, want, f"step {t}")
        assert_same(env.reset_infos, ref.reset_infos, f"step {t} reset_infos")
        seen["dones"] += int(want[2].sum())
        seen["truncated"] += sum(i["TimeLimit.truncated"] for i in want[3])
        seen["infos"] += sum(len(i) > 1 for i in want[3])
    return seen


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: f"{lay[0]}envs-{lay[1]}w")
@pytest.mark.parametrize("env_name", list(ENV_MAKERS))
def test_lockstep_matches_dummy(env_name, layout):
    num_envs, num_workers = layout
    env, ref = make_pair(ENV_MAKERS[env_name], num_envs, num_workers)
    try:
        assert env.num_workers == num_workers
        seen = run_lockstep(env, ref, 150 if env_name == "cartpole" else 80, seed=3)
    finally:
        env.close()
        ref.close()
    assert seen["dones"] > 0
    if env_name != "cartpole":
        assert seen["infos"] > 0
    if env_name == "random_end":
        assert seen["truncated"] > 0


def test_lockstep_copy_false_views():
    env, ref = make_pair(make_dict, 3, 2, copy=False)
    try:
        env.seed(0)
        ref.seed(0)
        prev = env.reset()
        assert_same(prev, ref.reset(), "reset")
        prev_copy = copy_nested(prev)
        space = env.action_space
        space.seed(1)
        for t in range(40):
            a = sample_actions(space, 3)
            got = env.step(a)
            compare_step(got, ref.step(a), f"step {t}")
            for leaf in leaves(got[0]):
                assert not leaf.flags.writeable
            assert_same(prev, prev_copy, f"obs of step {t - 1} after step {t}")
            prev, prev_copy = got[0], copy_nested(got[0])
    finally:
        env.close()
        ref.close()


def test_seed_and_set_options():
    env, ref = make_pair(make_dict, 3, 2)
    try:
        assert env.seed(12) == ref.seed(12) == [12, 13, 14]
        assert_same(env.reset(), ref.reset(), "reset after seed")
        assert_same(env.reset_infos, ref.reset_infos, "reset_infos")
        # seeds are used once: seeding again with the same seed reproduces the reset
        env.seed(12)
        first = env.reset()
        env.seed(12)
        assert_same(env.reset(), first, "same seed, same reset")
        # options: one dict for all envs, then a list of dicts
        env.seed(1)
        ref.seed(1)
        env.set_options({"start": 0.25})
        ref.set_options({"start": 0.25})
        obs, robs = env.reset(), ref.reset()
        assert_same(obs, robs, "reset with options")
        assert (obs["box"] == np.float32(0.25)).all()
        assert_same(env.reset_infos, ref.reset_infos, "reset_infos with options")
        assert all(info["start"] == 0.25 for info in env.reset_infos)
        env.seed(2)
        ref.seed(2)
        opts = [{"start": 0.1}, {}, {"start": -0.5}]
        env.set_options(opts)
        ref.set_options(opts)
        assert_same(env.reset(), ref.reset(), "reset with per-env options")
        assert_same(env.reset_infos, ref.reset_infos, "reset_infos with per-env options")
        # options are used once too
        env.seed(2)
        ref.seed(2)
        assert_same(env.reset(), ref.reset(), "reset after options were used")
        assert "start" not in env.reset_infos[0]
        # seed(None) draws a seed; the envs then differ from each other
        seeds = env.seed()
        assert len(seeds) == 3 and all(isinstance(s, int) for s in seeds)
        assert seeds == [seeds[0], seeds[0] + 1, seeds[0] + 2]
        obs = env.reset()
        assert not np.array_equal(obs["box"][0], obs["box"][1])
        with pytest.raises(ValueError):
            env.set_options([{}, {}])  # wrong length
    finally:
        env.close()
        ref.close()


def test_env_method_get_attr_set_attr_has_attr():
    env, ref = make_pair(make_dict, 3, 2)
    try:
        env.seed(0)
        ref.seed(0)
        env.reset()
        ref.reset()
        a = np.zeros((3, 2), np.float32)
        for _ in range(2):
            env.step(a)
            ref.step(a)
        assert env.env_method("get_counter") == ref.env_method("get_counter") == [2, 2, 2]
        assert env.env_method("get_counter", 5, indices=[0, 2]) == ref.env_method("get_counter", 5, indices=[0, 2])
        assert env.env_method("get_counter", add=1, indices=1) == ref.env_method("get_counter", add=1, indices=1) == [3]
        assert_same(env.get_attr("pos"), ref.get_attr("pos"), "get_attr(pos)")
        assert env.get_attr("max_len", indices=[-1]) == ref.get_attr("max_len", indices=[-1])
        for i in range(3):
            assert env.set_attr("counter", 10 * i, indices=i) is None
            ref.set_attr("counter", 10 * i, indices=i)
        assert env.get_attr("counter") == ref.get_attr("counter") == [0, 10, 20]
        env.set_attr("counter", 7, indices=[0, -1])
        ref.set_attr("counter", 7, indices=[0, -1])
        assert env.get_attr("counter") == ref.get_attr("counter") == [7, 10, 7]
        env.set_attr("counter", 1)
        ref.set_attr("counter", 1)
        assert env.get_attr("counter", indices=[1, 2]) == ref.get_attr("counter", indices=[1, 2]) == [1, 1]
        assert env.has_attr("counter") and ref.has_attr("counter")
        assert not env.has_attr("no_such_attribute") and not ref.has_attr("no_such_attribute")
    finally:
        env.close()
        ref.close()


def test_env_is_wrapped():
    fns = [make_cartpole, lambda: Monitor(gym.make("CartPole-v1")), make_cartpole]
    env, ref = fastvec.SubprocVecEnv(fns, num_workers=2), DummyVecEnv(fns)
    try:
        assert env.env_is_wrapped(Monitor) == ref.env_is_wrapped(Monitor) == [False, True, False]
        assert env.env_is_wrapped(gym.wrappers.TimeLimit) == ref.env_is_wrapped(gym.wrappers.TimeLimit) == [True] * 3
        assert env.env_is_wrapped(Monitor, indices=[1, 2]) == ref.env_is_wrapped(Monitor, indices=[1, 2])
    finally:
        env.close()
        ref.close()


def test_get_images_and_render():
    fn = functools.partial(RandomEndEnv, render_mode="rgb_array")
    env, ref = fastvec.SubprocVecEnv([fn] * 3, num_workers=2), DummyVecEnv([fn] * 3)
    try:
        assert env.render_mode == ref.render_mode == "rgb_array"
        env.seed(0)
        ref.seed(0)
        env.reset()
        ref.reset()
        for t in range(3):
            assert_same(env.get_images(), ref.get_images(), f"images {t}")
            assert_same(env.render(), ref.render(), f"render() {t}")
            assert_same(env.render(mode="rgb_array"), ref.render(mode="rgb_array"), f"render(rgb_array) {t}")
            with pytest.warns(UserWarning):
                assert env.render(mode="something_else") is None
            with pytest.warns(UserWarning):
                ref.render(mode="something_else")
            a = np.array([t % 3, 1, 2])
            env.step(a)
            ref.step(a)
    finally:
        env.close()
        ref.close()


def test_render_cartpole_rgb_array():
    pytest.importorskip("pygame")
    fn = functools.partial(gym.make, "CartPole-v1", render_mode="rgb_array")
    env, ref = fastvec.SubprocVecEnv([fn] * 2, num_workers=2), DummyVecEnv([fn] * 2)
    try:
        env.seed(1)
        ref.seed(1)
        env.reset()
        ref.reset()
        assert_same(env.get_images(), ref.get_images(), "cartpole frames")
        assert_same(env.render(), ref.render(), "cartpole tiled frame")
    finally:
        env.close()
        ref.close()


def test_no_render_mode_warns_like_dummy():
    env, ref = make_pair(make_random_end, 2, 1)
    try:
        assert env.render_mode is ref.render_mode is None
        with pytest.warns(UserWarning):
            assert env.get_images() == ref.get_images() == [None, None]
        with pytest.warns(UserWarning):
            assert env.render() is None
    finally:
        env.close()
        ref.close()


def test_step_async_step_wait_and_isinstance():
    env, ref = make_pair(make_random_end, 3, 2)
    try:
        assert isinstance(env, VecEnv)
        assert env.num_envs == 3
        assert env.observation_space == ref.observation_space
        assert env.action_space == ref.action_space
        env.seed(5)
        ref.seed(5)
        assert_same(env.reset(), ref.reset(), "reset")
        for t in range(20):
            a = np.array([t % 3, (t + 1) % 3, 2])
            env.step_async(a)
            ref.step_async(a)
            compare_step(env.step_wait(), ref.step_wait(), f"step {t}")
        with pytest.raises(RuntimeError):
            env.step_wait()
        # reset while a step is in flight: the step is finished and discarded
        env.step_async(np.array([0, 0, 0]))
        ref.step(np.array([0, 0, 0]))
        env.seed(8)
        ref.seed(8)
        assert_same(env.reset(), ref.reset(), "reset with a step in flight")
    finally:
        env.close()
        ref.close()


def test_close_idempotent_and_context_manager():
    with fastvec.SubprocVecEnv([make_cartpole] * 2, num_workers=2) as env:
        pids = env.worker_pids
        assert len(pids) == 2 and all(type(p) is int for p in pids)
        env.reset()
    assert env.closed
    env.close()
    with pytest.raises(fastvec.ClosedError):
        env.reset()


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_start_methods(start_method):
    fns = [lambda: RandomEndEnv(p_end=0.2), functools.partial(RandomEndEnv, 0.2)]
    env, ref = fastvec.SubprocVecEnv(fns, start_method=start_method), DummyVecEnv(fns)
    try:
        seen = run_lockstep(env, ref, 30, seed=4)
        assert seen["dones"] > 0
    finally:
        env.close()
        ref.close()


def test_warnings_free_lockstep():
    """A plain lockstep run emits no warnings (SB3 users treat them as errors in CI)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env, ref = make_pair(make_cartpole, 2, 2)
        try:
            run_lockstep(env, ref, 30, seed=0)
        finally:
            env.close()
            ref.close()


def test_steady_infos_take_the_compiled_path_with_exact_types(monkeypatch):
    """Steady flat infos: SB3's door builds each env's dict in one compiled pass, with
    the very keys, order, values and Python/numpy types DummyVecEnv hands out."""
    built = count_builds(monkeypatch, "table_env_infos")
    env, ref = make_pair(SteadyInfoEnv, 5, 2)
    try:
        env.seed(5)
        ref.seed(5)
        assert_same(env.reset(), ref.reset())
        for t in range(100):
            actions = np.array([(t * 7 + i) % 3 for i in range(5)])
            got, want = env.step(actions), ref.step(actions)
            compare_step(got, want, f"step {t}")
            for mine, theirs in zip(got[3], want[3]):
                assert list(mine) == list(theirs)
                for key, value in theirs.items():
                    if key != "terminal_observation":
                        assert type(mine[key]) is type(value), (t, key, type(mine[key]), type(value))
    finally:
        env.close()
        ref.close()
    assert sum(built) > 20, f"the compiled path built infos in only {sum(built)} of 100 steps"
