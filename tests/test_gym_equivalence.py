"""``fastvec.AsyncVectorEnv`` against ``gymnasium.vector.SyncVectorEnv``, step by step.

Both vector envs get the same env factories, seeds and actions; every observation (values
and dtypes, nested), reward, flag and info (with ``_key`` masks, ``final_obs`` and
``final_info``) must match.
"""

from __future__ import annotations

import functools
import multiprocessing as mp

import gymnasium as gym
import numpy as np
import psutil
import pytest
from envs import DictTupleEnv, EchoEnv, FlatInfoEnv, RandomEndEnv
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import assert_same, copy_nested, leaves

import fastvec

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]
# (num_envs, num_workers): 1, 2 and 3 workers, twice with uneven groups
LAYOUTS = [(3, 1), (5, 2), (4, 3)]


def make_cartpole():
    return gym.make("CartPole-v1")


def make_dict():
    return DictTupleEnv(nested=True)


def make_random_end():
    return RandomEndEnv()


ENV_MAKERS = {
    "cartpole": make_cartpole,
    "dict_tuple": make_dict,
    "random_end": make_random_end,
    "flat_info": FlatInfoEnv,
}


def make_pair(maker, num_envs, num_workers, mode=AutoresetMode.NEXT_STEP, copy=True, fns=None, **kwargs):
    if fns is None:
        fns = [maker for _ in range(num_envs)]
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    env = fastvec.AsyncVectorEnv(fns, num_workers=num_workers, autoreset_mode=mode, copy=copy, **kwargs)
    return env, ref


def compare_step(got, want, where):
    obs, rew, term, trunc, info = got
    robs, rrew, rterm, rtrunc, rinfo = want
    assert_same(obs, robs, f"{where} obs")
    assert rew.dtype == np.float64 and rrew.dtype == np.float64
    assert_same(rew, rrew, f"{where} rewards")
    assert term.dtype == np.bool_ and trunc.dtype == np.bool_
    assert_same(term, rterm, f"{where} terminated")
    assert_same(trunc, rtrunc, f"{where} truncated")
    assert_same(info, rinfo, f"{where} infos")


def run_lockstep(env, ref, steps, seed, mode):
    """Step both envs on the same actions; return counters of what was exercised."""
    seen = {"ends": 0, "term_and_trunc": 0, "infos": 0, "final": 0, "masked_resets": 0}
    got = env.reset(seed=seed)
    want = ref.reset(seed=seed)
    assert_same(got[0], want[0], "reset obs")
    assert_same(got[1], want[1], "reset infos")
    space = ref.action_space
    space.seed(seed + 1000)
    for t in range(steps):
        actions = space.sample()
        got = env.step(actions)
        want = ref.step(actions)
        compare_step(got, want, f"step {t}")
        term, trunc, info = want[2], want[3], want[4]
        done = term | trunc
        seen["ends"] += int(done.sum())
        seen["term_and_trunc"] += int((term & trunc).sum())
        seen["infos"] += bool(info)
        seen["final"] += "final_obs" in info
        if mode == AutoresetMode.DISABLED and done.any():
            # reset exactly the envs that ended, as gymnasium's DISABLED mode requires
            g = env.reset(options={"reset_mask": done.copy()})
            w = ref.reset(options={"reset_mask": done.copy()})
            assert_same(g[0], w[0], f"step {t} masked reset obs")
            assert_same(g[1], w[1], f"step {t} masked reset infos")
            seen["masked_resets"] += 1
    return seen


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: f"{lay[0]}envs-{lay[1]}w")
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("env_name", list(ENV_MAKERS))
def test_lockstep_matches_sync(env_name, mode, layout):
    num_envs, num_workers = layout
    env, ref = make_pair(ENV_MAKERS[env_name], num_envs, num_workers, mode)
    try:
        assert env.num_workers == num_workers
        steps = 150 if env_name == "cartpole" else 80
        seen = run_lockstep(env, ref, steps, seed=7, mode=mode)
    finally:
        env.close()
        ref.close()
    # the run must actually have exercised episode ends (and infos where the env has them)
    assert seen["ends"] > 0
    if mode == AutoresetMode.SAME_STEP:
        assert seen["final"] > 0
    if mode == AutoresetMode.DISABLED:
        assert seen["masked_resets"] > 0
    if env_name != "cartpole":
        assert seen["infos"] > 0
    if env_name == "random_end":
        assert seen["term_and_trunc"] > 0


@pytest.mark.parametrize("num_slots", [1, 3])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_lockstep_other_ring_depths(mode, num_slots):
    env, ref = make_pair(make_dict, 3, 2, mode, num_slots=num_slots)
    try:
        seen = run_lockstep(env, ref, 40, seed=5, mode=mode)
        assert seen["ends"] > 0
    finally:
        env.close()
        ref.close()


def test_lockstep_single_env():
    env, ref = make_pair(make_random_end, 1, 1, AutoresetMode.SAME_STEP)
    try:
        seen = run_lockstep(env, ref, 60, seed=8, mode=AutoresetMode.SAME_STEP)
        assert seen["final"] > 0
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("env_name", ["dict_tuple", "random_end"])
def test_lockstep_copy_false(env_name, mode):
    """copy=False gives views with the same values, writable as gymnasium's, and each
    stays intact through the next step."""
    env, ref = make_pair(ENV_MAKERS[env_name], 3, 2, mode, copy=False)
    try:
        obs, _ = env.reset(seed=3)
        robs, _ = ref.reset(seed=3)
        assert_same(obs, robs, "reset obs")
        space = ref.action_space
        space.seed(11)
        prev, prev_copy = obs, copy_nested(obs)
        for t in range(60):
            actions = space.sample()
            got = env.step(actions)
            want = ref.step(actions)
            compare_step(got, want, f"step {t}")
            for leaf in leaves(got[0]):
                assert leaf.flags.writeable
                leaf[...] = leaf  # as gymnasium's buffer; no worker reads it back
            # the previous step's view is still valid after this step returned
            assert_same(prev, prev_copy, f"step {t - 1} view after step {t}")
            prev, prev_copy = got[0], copy_nested(got[0])
            if mode == AutoresetMode.DISABLED:
                done = want[2] | want[3]
                if done.any():
                    g = env.reset(options={"reset_mask": done.copy()})
                    w = ref.reset(options={"reset_mask": done.copy()})
                    assert_same(g, w, f"step {t} masked reset")
                    assert_same(prev, prev_copy, f"step {t} view after masked reset")
                    prev, prev_copy = g[0], copy_nested(g[0])
    finally:
        env.close()
        ref.close()


ACTION_SPACES = {
    "box_scalar": gym.spaces.Box(-1, 1, (), np.float32),
    "box_2d_f16": gym.spaces.Box(-1, 1, (2, 2), np.float16),
    "box_int": gym.spaces.Box(-3, 3, (2,), np.int32),
    "discrete_start": gym.spaces.Discrete(3, start=-1),
    "multi_discrete_2d": gym.spaces.MultiDiscrete([[2, 3], [4, 5]]),
    "multi_binary_2d": gym.spaces.MultiBinary((2, 3)),
    "tuple": gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.MultiDiscrete([2, 2]))),
    "dict_nested": gym.spaces.Dict(
        {
            "a": gym.spaces.Discrete(4),
            "b": gym.spaces.Tuple((gym.spaces.Box(-1, 1, (3,), np.float64), gym.spaces.MultiBinary(2))),
        }
    ),
}


@pytest.mark.parametrize("name", list(ACTION_SPACES))
def test_actions_reach_the_envs_exactly(name):
    """EchoEnv observes the action it got: every kind of (batched) action space arrives
    intact and inside the space."""
    fns = [functools.partial(EchoEnv, ACTION_SPACES[name])] * 3
    env, ref = make_pair(None, 3, 2, fns=fns)
    try:
        seen = run_lockstep(env, ref, 12, seed=1, mode=AutoresetMode.NEXT_STEP)
        assert seen["ends"] > 0
        assert env.get_attr("invalid") == (0, 0, 0)
    finally:
        env.close()
        ref.close()


def test_copy_true_returns_fresh_writable_arrays():
    env, ref = make_pair(make_dict, 2, 2)
    try:
        obs, _ = env.reset(seed=0)
        ref.reset(seed=0)
        a = ref.action_space.sample()
        obs2 = env.step(a)[0]
        snapshot = copy_nested(obs)
        for _ in range(3):
            env.step(a)
        assert_same(obs, snapshot, "copied obs after more steps")
        for leaf in leaves(obs2):
            assert leaf.flags.writeable
            leaf[...] = 0  # ours to modify; must not disturb the env
        obs3 = env.step(a)[0]
        for _ in range(4):
            ref.step(a)
        assert_same(obs3, ref.step(a)[0], "obs after modifying a returned copy")
    finally:
        env.close()
        ref.close()


def test_reset_seed_int_and_list():
    env, ref = make_pair(make_dict, 3, 2)
    try:
        for seed in (5, [10, 3, 99], [0, 0, 0]):
            got = env.reset(seed=seed)
            want = ref.reset(seed=seed)
            assert_same(got, want, f"reset(seed={seed})")
            assert env.np_random_seed == ref.np_random_seed
            for g, r in zip(env.np_random, ref.np_random):
                assert g.bit_generator.state == r.bit_generator.state
            a = ref.action_space.sample()
            compare_step(env.step(a), ref.step(a), f"after reset(seed={seed})")
        # list seeds: env i gets seed[i] (equal seeds give equal obs)
        obs, _ = env.reset(seed=[4, 4, 4])
        for leaf in leaves(obs):
            assert (leaf == leaf[:1]).all()
        # int seed: envs get seed + i, i.e. env 1 of seed 4 == env 0 of seed 5
        o4, _ = env.reset(seed=4)
        o5, _ = env.reset(seed=5)
        for l4, l5 in zip(leaves(o4), leaves(o5)):
            np.testing.assert_array_equal(l4[1], l5[0])
        # options reach the envs
        got = env.reset(seed=1, options={"start": 0.5})
        want = ref.reset(seed=1, options={"start": 0.5})
        assert_same(got, want, "reset with options")
        assert (got[0]["box"] == np.float32(0.5)).all()
        with pytest.raises(ValueError):
            env.reset(seed=[1, 2])  # wrong length, like gymnasium
        with pytest.raises(ValueError):
            ref.reset(seed=[1, 2])
    finally:
        env.close()
        ref.close()


def test_reset_mask_next_step_mode():
    """A masked reset in NEXT_STEP mode clears the pending autoreset of the reset envs."""
    env, ref = make_pair(make_random_end, 4, 2, AutoresetMode.NEXT_STEP)
    try:
        assert_same(env.reset(seed=2), ref.reset(seed=2), "reset")
        space = ref.action_space
        space.seed(2)
        masked = 0
        for t in range(80):
            a = space.sample()
            want = ref.step(a)
            compare_step(env.step(a), want, f"step {t}")
            done = want[2] | want[3]
            if done.any() and t % 2 == 0:
                mask = done.copy()
                mask[0] = True
                assert_same(
                    env.reset(options={"reset_mask": mask}),
                    ref.reset(options={"reset_mask": mask.copy()}),
                    f"masked reset {t}",
                )
                masked += 1
        assert masked > 0
    finally:
        env.close()
        ref.close()


def test_reset_mask_validation_matches_gymnasium():
    env, ref = make_pair(make_random_end, 3, 1, AutoresetMode.DISABLED)
    try:
        env.reset(seed=0)
        ref.reset(seed=0)
        bad = [
            [True, False, True],  # not an array
            np.array([True, False]),  # wrong shape
            np.array([1, 0, 1]),  # wrong dtype
            np.zeros(3, dtype=bool),  # nothing to reset
        ]
        for mask in bad:
            with pytest.raises((TypeError, ValueError)) as want:
                ref.reset(options={"reset_mask": mask})
            with pytest.raises(want.type):
                env.reset(options={"reset_mask": mask})
        # still usable and in lockstep
        a = np.array([0, 1, 2])
        compare_step(env.step(a), ref.step(a), "after bad masks")
    finally:
        env.close()
        ref.close()


def test_call_get_attr_set_attr():
    env, ref = make_pair(make_dict, 3, 2)
    try:
        env.reset(seed=0)
        ref.reset(seed=0)
        a = ref.action_space.sample()
        for _ in range(4):
            env.step(a)
            ref.step(a)
        assert env.call("get_counter", add=2) == ref.call("get_counter", add=2) == (6, 6, 6)
        assert env.call("get_counter", 1) == ref.call("get_counter", 1)
        # a non-callable attribute is returned as is
        assert env.call("max_len") == ref.call("max_len")
        assert_same(env.get_attr("pos"), ref.get_attr("pos"), "get_attr(pos)")
        assert env.get_attr("counter") == ref.get_attr("counter")
        # scalar: every env gets it
        env.set_attr("counter", 40)
        ref.set_attr("counter", 40)
        assert env.get_attr("counter") == ref.get_attr("counter") == (40, 40, 40)
        # list and tuple: one value per env
        env.set_attr("counter", [1, 2, 3])
        ref.set_attr("counter", [1, 2, 3])
        assert env.get_attr("counter") == ref.get_attr("counter") == (1, 2, 3)
        env.set_attr("counter", (7, 8, 9))
        ref.set_attr("counter", (7, 8, 9))
        assert env.get_attr("counter") == ref.get_attr("counter") == (7, 8, 9)
        # a set attribute affects later steps the same way (env length via max_len)
        env.set_attr("max_len", [3, 4, 5])
        ref.set_attr("max_len", [3, 4, 5])
        assert_same(env.reset(seed=1), ref.reset(seed=1), "reset after set_attr")
        for t in range(10):
            compare_step(env.step(a), ref.step(a), f"step {t} after set_attr")
        with pytest.raises(ValueError):
            env.set_attr("counter", [1, 2])
        # gymnasium's property helpers work through get_attr
        assert len(env.np_random_seed) == 3
    finally:
        env.close()
        ref.close()


def test_render_rgb_array_cartpole():
    pytest.importorskip("pygame")
    fn = functools.partial(gym.make, "CartPole-v1", render_mode="rgb_array")
    ref = SyncVectorEnv([fn, fn])
    env = fastvec.AsyncVectorEnv([fn, fn], num_workers=2)
    try:
        assert env.render_mode == ref.render_mode == "rgb_array"
        env.reset(seed=0)
        ref.reset(seed=0)
        for t in range(3):
            frames, rframes = env.render(), ref.render()
            assert isinstance(frames, tuple) and len(frames) == 2
            assert_same(frames, rframes, f"frames {t}")
            a = np.array([t % 2, 1])
            env.step(a)
            ref.step(a)
    finally:
        env.close()
        ref.close()


def test_render_rgb_array_custom_env():
    fn = functools.partial(DictTupleEnv, render_mode="rgb_array")
    ref = SyncVectorEnv([fn] * 3)
    env = fastvec.AsyncVectorEnv([fn] * 3, num_workers=2)
    try:
        assert env.render_mode == "rgb_array"
        env.reset(seed=4)
        ref.reset(seed=4)
        a = ref.action_space.sample()
        for t in range(3):
            env.step(a)
            ref.step(a)
            assert_same(env.render(), ref.render(), f"frames {t}")
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("mode", MODES + ["SameStep", "NextStep", "Disabled"], ids=str)
def test_metadata_and_spaces(mode):
    env, ref = make_pair(make_dict, 3, 2, mode)
    try:
        expected = AutoresetMode(mode)
        assert env.metadata["autoreset_mode"] == ref.metadata["autoreset_mode"] == expected
        assert env.metadata["render_modes"] == ref.metadata["render_modes"]
        assert env.autoreset_mode == expected
        assert env.num_envs == ref.num_envs == 3
        assert env.single_observation_space == ref.single_observation_space
        assert env.single_action_space == ref.single_action_space
        assert env.observation_space == ref.observation_space
        assert env.action_space == ref.action_space
        assert isinstance(env, gym.vector.VectorEnv)
        assert env.unwrapped is env
        obs, _ = env.reset(seed=0)
        assert env.observation_space.contains(obs)
    finally:
        env.close()
        ref.close()


def test_spaces_of_cartpole():
    env, ref = make_pair(make_cartpole, 2, 1)
    try:
        assert env.observation_space == ref.observation_space
        assert env.action_space == ref.action_space
        assert env.single_observation_space == ref.single_observation_space
        assert env.metadata["render_fps"] == ref.metadata["render_fps"]
    finally:
        env.close()
        ref.close()


def test_close_idempotent_and_context_manager():
    with fastvec.AsyncVectorEnv([make_cartpole] * 3, num_workers=2) as env:
        pids = env.worker_pids
        assert isinstance(pids, list) and len(pids) == 2
        assert all(type(p) is int for p in pids)
        assert len(set(pids)) == 2
        procs = [psutil.Process(pid) for pid in pids]
        assert all(p.is_running() for p in procs)
        env.reset(seed=0)
        env.step(np.array([0, 1, 0]))
    assert env.closed
    for p in procs:  # is_running() also notices a reused pid
        assert not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    env.close()  # again: no error
    env.close()
    with pytest.raises(fastvec.ClosedError):
        env.reset()
    with pytest.raises(fastvec.ClosedError):
        env.step(np.array([0, 1, 0]))
    with pytest.raises(fastvec.ClosedError):
        env.get_attr("spec")


def test_close_with_step_in_flight():
    env = fastvec.AsyncVectorEnv([make_cartpole] * 2, num_workers=2)
    env.reset(seed=0)
    env.step_async(np.array([0, 1]))
    env.close()
    env.close()
    assert env.closed


def test_step_async_step_wait_and_reset_while_waiting():
    env, ref = make_pair(make_random_end, 3, 2)
    try:
        assert_same(env.reset(seed=9), ref.reset(seed=9), "reset")
        a = np.array([2, 0, 1])
        env.step_async(a)
        with pytest.raises(RuntimeError):
            env.step_async(a)
        compare_step(env.step_wait(), ref.step(a), "step_async/step_wait")
        with pytest.raises(RuntimeError):
            env.step_wait()
        # a reset while a step is in flight is refused, as gymnasium does; the step is kept
        env.step_async(a)
        with pytest.raises(gym.error.AlreadyPendingCallError):
            env.reset(seed=4)
        compare_step(env.step_wait(), ref.step(a), "the step kept in flight")
        assert_same(env.reset(seed=4), ref.reset(seed=4), "reset after")
        compare_step(env.step(a), ref.step(a), "step after")
    finally:
        env.close()
        ref.close()


class _AsyncPair:
    """Steps through ``step_async`` + ``step_wait`` (``step`` itself takes a fused path)."""

    def __init__(self, env):
        self.env = env

    def reset(self, **kwargs):
        return self.env.reset(**kwargs)

    def step(self, actions):
        self.env.step_async(actions)
        return self.env.step_wait()


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("env_name", ["dict_tuple", "random_end", "flat_info"])
def test_lockstep_through_step_async_step_wait(env_name, mode):
    env, ref = make_pair(ENV_MAKERS[env_name], 5, 2, mode)
    try:
        seen = run_lockstep(_AsyncPair(env), ref, 150, seed=3, mode=mode)
        assert seen["ends"] > 0 or env_name == "dict_tuple"
        # and step() after step_async() without step_wait() is refused, nothing lost
        env.step_async(ref.action_space.sample())
        with pytest.raises(RuntimeError, match="step_async"):
            env.step(ref.action_space.sample())
        env.step_wait()
    finally:
        env.close()
        ref.close()


def _closure_factory(p_end):
    def make():
        return RandomEndEnv(p_end=p_end)

    return make


@pytest.mark.parametrize(
    "context",
    ["fork", pytest.param("forkserver", marks=pytest.mark.slow), pytest.param("spawn", marks=pytest.mark.slow)],
)
def test_start_methods_with_lambdas_and_closures(context):
    if context not in mp.get_all_start_methods():
        pytest.skip(f"{context} is not available here")
    p_end = 0.2
    fns = [lambda: RandomEndEnv(p_end=p_end), _closure_factory(p_end), lambda: RandomEndEnv(0.2)]
    ref = SyncVectorEnv(fns)
    env = fastvec.AsyncVectorEnv(fns, num_workers=2, context=context)
    try:
        seen = run_lockstep(env, ref, 40, seed=21, mode=AutoresetMode.NEXT_STEP)
        assert seen["ends"] > 0
    finally:
        env.close()
        ref.close()


def test_default_context_and_workers():
    env = fastvec.AsyncVectorEnv([make_random_end] * 2)
    try:
        assert 1 <= env.num_workers <= 2
        assert len(env.worker_pids) == env.num_workers
        obs, _ = env.reset(seed=0)
        assert obs.shape == (2, 2) and obs.dtype == np.float64
    finally:
        env.close()
