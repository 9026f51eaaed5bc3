"""Spaces without a fixed size (Text, Graph, Sequence, OneOf, a custom ``Space``), alone
or inside Dict/Tuple beside fixed-size leaves, carried pickled by the gymnasium door:
step by step the same as ``SyncVectorEnv`` with the same seeds, in every autoreset
mode; actions of such spaces reach the envs exactly. And the "dtype" action rule: what
gymnasium passes to its envs, fastvec passes too; what shared memory would change is
refused, with nothing lost."""

from __future__ import annotations

import copy
import functools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import assert_same

import fastvec
from fastvec.errors import ActionTypeError


class Bag(spaces.Space):
    """A custom space: a frozenset of small ints (no fixed size, no shared memory)."""

    def __init__(self, seed=None):
        super().__init__(None, None, seed)

    def sample(self, mask=None, probability=None):
        k = int(self.np_random.integers(0, 4))
        return frozenset(int(v) for v in self.np_random.integers(0, 9, k))

    def contains(self, x):
        return isinstance(x, frozenset) and all(isinstance(v, int) for v in x)

    def __eq__(self, other):
        return isinstance(other, Bag)


class PickledEnv(gym.Env):
    """Observations sampled from its own (seeded) observation space; the action it got
    reported in the infos as text, so the reference comparison checks it arrived
    exactly; random episode ends."""

    def __init__(self, obs_space, act_space, p_end=0.2, fail_at=None):
        self.observation_space = copy.deepcopy(obs_space)  # its own sampler, as in a worker
        self.action_space = copy.deepcopy(act_space)
        self.p_end = p_end
        self.fail_at = fail_at
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.t = 0
        return self.observation_space.sample(), {"start": 1}

    def step(self, action):
        self.t += 1
        if self.fail_at is not None and self.t == self.fail_at:
            raise RuntimeError("flaky")
        info = {"action": repr(action), "valid": bool(self.action_space.contains(action))}
        terminated = bool(self.np_random.random() < self.p_end)
        truncated = self.t >= 6
        return self.observation_space.sample(), float(self.t), terminated, truncated, info


BOX2 = spaces.Box(-1.0, 1.0, (2,), np.float32)
CONFIGS = {
    "text_only": (spaces.Text(6), spaces.Text(4)),
    "dict_mixed": (
        spaces.Dict(
            {
                "pos": spaces.Box(-1.0, 1.0, (3,), np.float32),
                "text": spaces.Text(5),
                "graph": spaces.Graph(BOX2, spaces.Discrete(3)),
                "seq": spaces.Sequence(spaces.Discrete(4)),
                "n": spaces.Discrete(5),
            }
        ),
        spaces.Tuple((spaces.Discrete(3), spaces.Text(3))),
    ),
    "graph_obs_box_action": (spaces.Graph(BOX2, None), BOX2),
    "oneof_action": (BOX2, spaces.OneOf((spaces.Discrete(3), spaces.Box(0.0, 1.0, (1,), np.float32)))),
    "stacked_sequence_custom": (
        spaces.Tuple((spaces.Sequence(BOX2, stack=True), Bag(), spaces.MultiBinary(3))),
        spaces.Dict({"bag": Bag(), "d": spaces.Discrete(2)}),
    ),
}
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


def _fns(name, n=3, **kwargs):
    obs_space, act_space = CONFIGS[name]
    return [functools.partial(PickledEnv, obs_space, act_space, **kwargs) for _ in range(n)]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_pickled_leaves_match_sync(name, mode):
    fns = _fns(name)
    env = fastvec.AsyncVectorEnv(fns, num_workers=2, autoreset_mode=mode)
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    try:
        assert env.observation_space == ref.observation_space
        assert env.action_space == ref.action_space
        assert_same(env.reset(seed=5), ref.reset(seed=5), "reset")
        ref.action_space.seed(1)
        ends = 0
        for t in range(40):
            actions = ref.action_space.sample()
            got, want = env.step(actions), ref.step(actions)
            assert_same(got, want, f"step {t}")
            assert got[0] in env.observation_space
            done = want[2] | want[3]
            ends += int(done.sum())
            if mode == AutoresetMode.DISABLED and done.any():
                options = {"reset_mask": done.copy()}
                assert_same(env.reset(options=options), ref.reset(options=options), f"step {t} masked reset")
        assert ends > 0
        assert env.get_attr("t") == ref.get_attr("t")
    finally:
        env.close()
        ref.close()


def test_pickled_leaves_with_copy_false_and_restarts():
    """copy=False: the fixed leaves are views, the pickled ones tuples; a worker whose
    env raises is replaced and its envs come back with fresh pickled observations."""
    fns = _fns("dict_mixed", n=4)
    fns[3] = functools.partial(PickledEnv, *CONFIGS["dict_mixed"], p_end=0.0, fail_at=3)
    with pytest.warns(RuntimeWarning, match="restarted"):
        with fastvec.AsyncVectorEnv(fns, num_workers=2, copy=False, restart_on_error=True) as env:
            obs, _ = env.reset(seed=0)
            assert isinstance(obs["text"], tuple) and len(obs["text"]) == 4
            assert obs["pos"].base is not None  # a view into the ring
            env.action_space.seed(0)
            restarted = []
            for t in range(5):
                obs, _, term, trunc, infos = env.step(env.action_space.sample())
                assert obs in env.observation_space
                if "fastvec_restarted" in infos:
                    restarted.append(t)
                    assert trunc[2] and trunc[3]  # the replaced worker's envs end truncated
                    assert infos["_fastvec_restarted"].tolist() == [False, False, True, True]
            assert restarted == [2] and len(env.engine.restarts) == 1


def test_pickled_action_that_cannot_be_batched_is_refused_before_dispatch():
    fns = _fns("text_only")
    env, ref = fastvec.AsyncVectorEnv(fns, num_workers=2), SyncVectorEnv(fns)
    try:
        assert_same(env.reset(seed=2), ref.reset(seed=2), "reset")
        for bad, error in [
            (("ab", "cd"), ValueError),
            ("abc", ActionTypeError),
            (None, ValueError),
            (("ab", "cd", "ef", "gh"), ValueError),
        ]:
            with pytest.raises(error):
                env.step(bad)
        good = ("ab", "c", "")
        assert_same(env.step(good), ref.step(good), "the step after the refused ones")
    finally:
        env.close()
        ref.close()


def test_sb3_door_and_trainer_storage_refuse_pickled_leaves():
    with pytest.raises(ValueError, match="Text"):
        fastvec.SubprocVecEnv(_fns("text_only"), num_workers=1)


# ------------------------------------------------------------------ the action rule
class EchoAction(gym.Env):
    """Observes nothing of note; its info is the action exactly as it arrived."""

    def __init__(self, act_space):
        self.action_space = act_space
        self.observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        value = np.asarray(action)
        return np.zeros(1, np.float32), 0.0, False, False, {"got": value.tolist()}


@pytest.mark.parametrize(
    "space, passed, refused",
    [
        (
            spaces.Discrete(4),
            [np.array([4, -1, 2]), np.array([1.0, 3.0, 7.0]), np.array([True, False, True])],
            [np.array([1.5, 0, 0]), np.array([np.nan, 0, 0]), np.array([2**63, 0, 0], np.uint64)],
        ),
        (
            spaces.Box(-1.0, 1.0, (2,), np.float32),
            [np.full((3, 2), 5.0), np.full((3, 2), np.nan, np.float32), np.ones((3, 2), np.int64)],
            [np.zeros((3, 3))],
        ),
        (
            spaces.Box(0, 255, (2,), np.uint8),
            [np.array([[0, 255], [3, 4], [5, 6]])],
            [np.array([[256, 0], [0, 0], [0, 0]]), np.array([[-1, 0], [0, 0], [0, 0]])],
        ),
        (
            spaces.Box(0, 1, (3,), np.bool_),
            [np.array([[True, False, True]] * 3), np.eye(3, dtype=int)],
            [np.full((3, 3), 2)],
        ),
    ],
)
def test_dtype_rule_passes_what_gymnasium_passes(space, passed, refused):
    """Out-of-range values reach the env as SyncVectorEnv hands them over (in the
    space's dtype); values that dtype would change are refused, the vector env intact."""
    fns = [functools.partial(EchoAction, space)] * 3
    env, ref = fastvec.AsyncVectorEnv(fns, num_workers=2), SyncVectorEnv(fns)
    try:
        env.reset(seed=0)
        ref.reset(seed=0)

        def got(venv, actions):
            return np.array([np.asarray(g, np.float64) for g in venv.step(actions)[4]["got"]])

        for k, actions in enumerate(passed):
            np.testing.assert_array_equal(got(env, actions), got(ref, actions), err_msg=f"passed #{k}")
        for actions in refused:
            with pytest.raises(ValueError):
                env.step(actions)
        np.testing.assert_array_equal(got(env, passed[0]), got(ref, passed[0]))
    finally:
        env.close()
        ref.close()


def test_a_scalar_for_a_vector_env_is_a_type_error_as_in_gymnasium():
    fns = [lambda: gym.make("CartPole-v1")] * 2
    with fastvec.AsyncVectorEnv(fns, num_workers=1) as env:
        env.reset(seed=0)
        with pytest.raises(TypeError):
            env.step(0)
        with pytest.raises(ValueError):  # also fastvec's usual class for bad actions
            env.step(np.int64(0))
        with pytest.raises(ValueError):
            env.step(np.array([0, 1, 0]))
        env.step(np.array([0, 1]))


def test_bounds_rule_is_still_available():
    fns = [functools.partial(EchoAction, spaces.Discrete(4))] * 2
    with fastvec.AsyncVectorEnv(fns, num_workers=1, action_check="bounds") as env:
        env.reset(seed=0)
        with pytest.raises(ValueError, match="out of range"):
            env.step(np.array([4, 0]))
        assert env.step(np.array([3, 0]))[4]["got"].tolist() == [3, 0]
    with pytest.raises(ValueError, match="action_check"):
        fastvec.AsyncVectorEnv(fns, action_check="loose")
