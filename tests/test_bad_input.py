"""Bad input: rejected with a clear error, before anything reaches a worker, and the
vector env keeps working (the next correct step still matches the reference)."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from envs import DictTupleEnv, EchoEnv, FailingEnv, MisbehavingEnv, RandomEndEnv, raising_factory
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv
from gymnasium.vector.utils import batch_space, iterate
from helpers import assert_same
from stable_baselines3.common.vec_env import DummyVecEnv

import fastvec

N = 3

DISCRETE = spaces.Discrete(4, start=-1)  # -1..2
BOX = spaces.Box(-1.0, 1.0, (2,), np.float32)
BOX_INT = spaces.Box(0, 10, (2,), np.int64)
MULTI_DISCRETE = spaces.MultiDiscrete([3, 5], start=[0, -2])  # [0..2, -2..2]
MULTI_BINARY = spaces.MultiBinary(3)
DICT = spaces.Dict({"d": spaces.Discrete(3), "b": spaces.Box(-1.0, 1.0, (2,), np.float32)})

# name: (space, good batched actions, bad batched actions)
CASES = {
    "discrete": (
        DISCRETE,
        [np.array([-1, 2, 0]), [0, 1, 2], np.array([2, 2, -1], dtype=np.int32), np.array([0, 1, 2], np.uint8)],
        [
            np.array([0, 1]),
            np.array([0, 1, 2, 0]),
            np.array([[0], [1], [2]]),
            np.int64(1),  # shapes
            np.array([0.0, 1.0, 2.0]),
            np.array([0.0, 1.0, 2.0], np.float32),  # floats
            np.array(["0", "1", "2"]),
            "012",
            b"012",
            [0, "1", 2],  # strings
            np.array([0, None, 1], dtype=object),
            np.array([0, 1, 2], dtype=object),
            None,
            [0, None, 1],
            np.array([1 + 0j, 0, 0]),  # complex
            np.array([3, 0, 0]),
            np.array([0, -2, 0]),
            np.array([0, 0, 2**40]),  # out of range
            np.array([0, 0, 2**63], dtype=np.uint64),
            [[0, 1], 2, 1],  # ragged
        ],
    ),
    "box": (
        BOX,
        [np.full((N, 2), 0.5, np.float32), np.array([[-1.0, 1.0], [0.25, -0.75], [0.0, 0.0]]), np.zeros((N, 2), int)],
        [
            np.zeros((N, 3), np.float32),
            np.zeros(N, np.float32),
            np.zeros((N - 1, 2), np.float32),
            np.zeros((N, 2, 1), np.float32),
            np.float32(0.0),  # shapes
            np.full((N, 2), "0.5"),
            None,
            np.zeros((N, 2), dtype=object),  # dtypes
            np.array([[1.5, 0], [0, 0], [0, 0]], np.float32),
            np.array([[0, 0], [0, -2.0], [0, 0]]),  # range
            np.array([[0, 0], [0, 0], [np.inf, 0]]),
            np.array([[0, 0], [np.nan, 0], [0, 0]], np.float32),
            np.full((N, 2), np.nan),  # NaN
        ],
    ),
    "box_int": (
        BOX_INT,
        [np.array([[0, 10], [5, 5], [1, 2]]), np.array([[1.0, 2.0], [3.0, 4.0], [10.0, 0.0]])],
        [
            np.array([[1.5, 2.0], [3.0, 4.0], [0.0, 0.0]]),
            np.array([[11, 0], [0, 0], [0, 0]]),
            np.array([[0, 0], [-1, 0], [0, 0]]),
            np.array([[0, 0], [0, 0], [np.nan, 0]]),
            np.zeros((N, 3), int),
        ],
    ),
    "multi_discrete": (
        MULTI_DISCRETE,
        [np.array([[0, -2], [2, 2], [1, 0]]), np.array([[2, -1], [0, 1], [1, 2]], np.int8)],
        [
            np.array([0, 1, 2]),
            np.zeros((N, 3), int),
            np.zeros((N, 2, 1), int),  # shapes
            np.zeros((N, 2), np.float64),
            np.zeros((N, 2), dtype=object),
            None,  # dtypes
            np.array([[3, 0], [0, 0], [0, 0]]),
            np.array([[0, 3], [0, 0], [0, 0]]),  # range
            np.array([[0, 0], [0, -3], [0, 0]]),
            np.array([[0, 0], [0, 0], [-1, 0]]),
        ],
    ),
    "multi_binary": (
        MULTI_BINARY,
        [
            np.array([[0, 1, 1], [1, 0, 0], [1, 1, 1]], np.int8),
            np.array([[True, False, True]] * N),
            np.zeros((N, 3), np.int64),
        ],
        [
            np.zeros((N, 4), np.int8),
            np.zeros(N, np.int8),  # shapes
            np.zeros((N, 3), np.float32),
            np.full((N, 3), "1"),
            None,  # dtypes
            np.array([[2, 0, 0], [0, 0, 0], [0, 0, 0]]),
            np.array([[0, 0, 0], [0, -1, 0], [0, 0, 0]]),  # range
        ],
    ),
    "dict": (
        DICT,
        [
            {"d": np.array([0, 1, 2]), "b": np.zeros((N, 2), np.float32)},
            {"d": np.array([2, 2, 0]), "b": np.full((N, 2), -0.5, np.float32)},
        ],
        [
            {"d": np.array([0, 1, 2])},  # missing leaf
            {"d": np.array([0, 1]), "b": np.zeros((N, 2), np.float32)},  # leaf shape
            {"d": np.array([0, 1, 3]), "b": np.zeros((N, 2), np.float32)},  # leaf range
            {"d": np.array([0, 1, 2]), "b": np.full((N, 2), np.nan, np.float32)},  # NaN
            {"d": np.array([0.0, 1.0, 2.0]), "b": np.zeros((N, 2), np.float32)},  # float for Discrete
            None,
            np.zeros(N),
        ],
    ),
}

# SB3's convention for Dict actions: a sequence with one dict per env
SB3_DICT_BAD = [
    [{"d": 0, "b": np.zeros(2, np.float32)}] * (N - 1),  # too few envs
    [{"d": 0, "b": np.zeros(2, np.float32)}, {"d": 1}, {"d": 2, "b": np.zeros(2, np.float32)}],  # missing
    [
        {"d": 0, "b": np.zeros(2, np.float32)},
        {"d": 3, "b": np.zeros(2, np.float32)},
        {"d": 2, "b": np.zeros(2, np.float32)},
    ],  # out of range
    [{"d": 0, "b": np.zeros(3, np.float32)}] * N,  # leaf shape
    [{"d": "x", "b": np.zeros(2, np.float32)}] * N,  # string
    [None] * N,
    None,
    "abc",
]


def make_pair(front, fns, num_workers=2, **kwargs):
    if front == "gym":
        return fastvec.AsyncVectorEnv(fns, num_workers=num_workers, **kwargs), SyncVectorEnv(fns)
    return fastvec.SubprocVecEnv(fns, num_workers=num_workers), DummyVecEnv(fns)


def reset_pair(front, env, ref, seed):
    if front == "gym":
        assert_same(env.reset(seed=seed), ref.reset(seed=seed), "reset")
    else:
        env.seed(seed)
        ref.seed(seed)
        assert_same(env.reset(), ref.reset(), "reset")


def step_pair(env, ref, actions, ref_actions, where):
    got, want = env.step(actions), ref.step(ref_actions)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"{where} item {k}")
    return want


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("front", ["gym", "sb3"])
def test_bad_actions_rejected_before_dispatch(front, case):
    space, goods, bads = CASES[case]
    fns = [functools.partial(EchoEnv, space)] * N
    # the gymnasium door passes what the dtype holds through by default (test_gym_dropin)
    env, ref = make_pair(front, fns, **({"action_check": "bounds"} if front == "gym" else {}))
    batched = batch_space(space, N)
    nested = isinstance(space, spaces.Dict)
    if front == "sb3" and nested:
        bads = SB3_DICT_BAD
    try:
        reset_pair(front, env, ref, seed=3)
        for k, bad in enumerate(bads):
            with pytest.raises(ValueError):
                env.step(bad)
            good = goods[k % len(goods)]
            if front == "sb3" and nested:
                good = list(iterate(batched, good))  # one action per env, as SB3 passes them
            # the rejected step never reached the envs: the next one matches the reference
            step_pair(env, ref, good, good, f"good step after bad action #{k} ({bad!r:.60})")
        # every action the envs received was inside the action space
        assert list(env.get_attr("invalid")) == [0] * N
        assert list(env.get_attr("t")) == list(ref.get_attr("t"))
    finally:
        env.close()
        ref.close()


def test_bad_action_does_not_break_step_async():
    env = fastvec.AsyncVectorEnv([functools.partial(EchoEnv, DISCRETE)] * 2, num_workers=2, action_check="bounds")
    try:
        env.reset(seed=0)
        with pytest.raises(ValueError):
            env.step_async(np.array([5, 5]))
        with pytest.raises(RuntimeError):
            env.step_wait()  # nothing is in flight
        env.step_async(np.array([1, 2]))
        obs = env.step_wait()[0]
        np.testing.assert_array_equal(obs[:, 0], [1.0, 2.0])
    finally:
        env.close()


# --------------------------------------------------------------------------- spaces
@pytest.mark.parametrize("front", ["gym", "sb3"])
def test_different_observation_spaces_name_the_env(front):
    fns = [lambda: gym.make("CartPole-v1")] * 2 + [lambda: gym.make("Pendulum-v1")]
    with pytest.raises(ValueError, match=r"\benv 2\b"):
        make_pair(front, fns)[0]


class _TextObsEnv(gym.Env):
    observation_space = spaces.Text(5)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return "abc", {}

    def step(self, action):
        return "abc", 0.0, False, False, {}


def test_unsupported_space_is_a_value_error():
    """SB3's buffers need fixed-size arrays: a Text observation is refused by name (the
    gymnasium door carries it pickled: test_gym_dropin)."""
    with pytest.raises(ValueError, match="Text"):
        make_pair("sb3", [_TextObsEnv, _TextObsEnv])


def test_different_nested_observation_spaces_name_the_env():
    fns = [DictTupleEnv, functools.partial(DictTupleEnv, nested=False), DictTupleEnv, DictTupleEnv]
    with pytest.raises(ValueError, match=r"\benv 1\b"):
        fastvec.AsyncVectorEnv(fns, num_workers=3)


def test_different_action_spaces_name_the_env():
    fns = [functools.partial(EchoEnv, spaces.Discrete(3))] * 3 + [functools.partial(EchoEnv, spaces.Discrete(4))]
    with pytest.raises(ValueError, match=r"\benv 3\b.*action space"):
        fastvec.AsyncVectorEnv(fns, num_workers=2)
    with pytest.raises(ValueError, match=r"\benv 3\b"):
        fastvec.SubprocVecEnv(fns, num_workers=3)


# --------------------------------------------------------------------------- worker errors
@pytest.mark.parametrize("index", [0, 2])
def test_factory_that_raises(index):
    fns = [RandomEndEnv] * 3
    fns[index] = raising_factory
    with pytest.raises(fastvec.WorkerError) as info:
        fastvec.AsyncVectorEnv(fns, num_workers=2)
    err = info.value
    assert err.env_index == index
    assert err.exc_type == "ValueError"
    assert "cannot build an env" in err.exc_message
    assert f"env {index}" in str(err)
    assert "cannot build an env" in str(err)
    assert "raising_factory" in err.worker_traceback
    with pytest.raises(fastvec.WorkerError, match=f"env {index}"):
        fastvec.SubprocVecEnv(fns, num_workers=3)


@pytest.mark.parametrize("front", ["gym", "sb3"])
@pytest.mark.parametrize("layout", [(3, 1), (3, 2), (4, 3)], ids=lambda lay: f"{lay[0]}envs-{lay[1]}w")
def test_env_that_raises_in_step(front, layout):
    num_envs, num_workers = layout
    bad = num_envs - 2
    fns = [functools.partial(FailingEnv, None)] * num_envs
    fns[bad] = functools.partial(FailingEnv, 3)
    env = (fastvec.AsyncVectorEnv if front == "gym" else fastvec.SubprocVecEnv)(fns, num_workers=num_workers)
    try:
        env.reset()
        actions = np.ones(num_envs, dtype=np.int64)
        for _ in range(3):
            env.step(actions)
        with pytest.raises(fastvec.WorkerError) as info:
            env.step(actions)
        err = info.value
        assert err.env_index == bad
        assert err.exc_type.endswith("EnvExploded")
        assert err.exc_message == "step 4 exploded"
        assert "EnvExploded" in err.worker_traceback and "in step" in err.worker_traceback
        assert f"env {bad}" in str(err)
        assert bad in err.env_indices
    finally:
        env.close()
    assert env.closed


def test_env_that_raises_in_reset():
    fns = [FailingEnv, functools.partial(FailingEnv, 3, fail_on_reset=True)]
    env = fastvec.AsyncVectorEnv(fns, num_workers=2)
    try:
        with pytest.raises(fastvec.WorkerError) as info:
            env.reset(seed=0)
        assert info.value.env_index == 1
        assert info.value.exc_message == "reset exploded"
    finally:
        env.close()


@pytest.mark.parametrize("front", ["gym", "sb3"])
def test_call_that_raises_keeps_env_usable(front):
    fns = [functools.partial(FailingEnv, None)] * 3
    env, ref = (
        (fastvec.AsyncVectorEnv(fns, num_workers=2), SyncVectorEnv(fns))
        if front == "gym"
        else (fastvec.SubprocVecEnv(fns, num_workers=2), DummyVecEnv(fns))
    )
    try:
        reset_pair(front, env, ref, seed=1)
        with pytest.raises(fastvec.WorkerError) as info:
            env.call("explode") if front == "gym" else env.env_method("explode")
        assert info.value.exc_type.endswith("EnvExploded")
        assert info.value.env_index == 0
        with pytest.raises(fastvec.WorkerError) as info:
            env.get_attr("no_such_attribute")
        assert info.value.exc_type == "AttributeError"
        # the envs are untouched: stepping still matches the reference
        a = np.array([1, 0, 1])
        for t in range(3):
            step_pair(env, ref, a, a, f"step {t} after failed calls")
    finally:
        env.close()
        ref.close()


# --------------------------------------------------------------------------- constructor args
def _fns(n=2):
    return [RandomEndEnv] * n


@pytest.mark.parametrize("cls", [fastvec.AsyncVectorEnv, fastvec.SubprocVecEnv], ids=["gym", "sb3"])
@pytest.mark.parametrize("num_workers", [0, -1, 3, True, False, 1.5, "2"])
def test_bad_num_workers(cls, num_workers):
    with pytest.raises(ValueError, match="num_workers"):
        cls(_fns(2), num_workers=num_workers)


@pytest.mark.parametrize("cls", [fastvec.AsyncVectorEnv, fastvec.SubprocVecEnv], ids=["gym", "sb3"])
def test_bad_env_fns(cls):
    with pytest.raises(ValueError, match="empty"):
        cls([])
    with pytest.raises(ValueError, match=r"env_fns\[1\]"):
        cls([RandomEndEnv, 3])
    with pytest.raises(ValueError, match=r"env_fns\[0\]"):
        cls([RandomEndEnv()])  # an env instead of a factory
    with pytest.raises(ValueError):
        cls(RandomEndEnv)  # not a sequence
    with pytest.raises(ValueError):
        cls("abc")


@pytest.mark.parametrize("mode", ["same_step", "bogus", 3, None])
def test_bad_autoreset_mode(mode):
    with pytest.raises(ValueError, match="autoreset_mode"):
        fastvec.AsyncVectorEnv(_fns(), autoreset_mode=mode)


def test_bad_context():
    with pytest.raises(ValueError, match="threads"):
        fastvec.AsyncVectorEnv(_fns(), context="threads")
    with pytest.raises(ValueError, match="threads"):
        fastvec.SubprocVecEnv(_fns(), start_method="threads")


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_slots=0),
        dict(num_slots=True),
        dict(step_timeout=-1.0),
        dict(step_timeout=0),
        dict(step_timeout=float("nan")),
    ],
    ids=str,
)
def test_bad_engine_options(kwargs):
    with pytest.raises(ValueError):
        fastvec.AsyncVectorEnv(_fns(), **kwargs)


def test_bad_seeds_gym():
    env, ref = fastvec.AsyncVectorEnv(_fns(3), num_workers=2), SyncVectorEnv(_fns(3))
    try:
        assert_same(env.reset(seed=0), ref.reset(seed=0), "reset")
        for seed in [
            "1",
            1.5,
            -1,
            True,
            [1, 2],
            [1, "a", 2],
            [1.0, 2.0, 3.0],
            [1, -2, 3],
            [True, 1, 2],
            (1, 2, 3, 4),
            {"a": 1},
        ]:
            with pytest.raises(ValueError):
                env.reset(seed=seed)
        with pytest.raises(ValueError):
            env.reset(seed=0, options="not a dict")
        # still usable, and nothing was reset by the rejected calls
        a = np.array([0, 1, 2])
        step_pair(env, ref, a, a, "step after bad seeds")
        assert_same(env.reset(seed=[4, None, 6])[0][[0, 2]], ref.reset(seed=[4, None, 6])[0][[0, 2]], "seed list")
    finally:
        env.close()
        ref.close()


def test_bad_seeds_sb3():
    env = fastvec.SubprocVecEnv(_fns(2))
    try:
        for seed in ["1", 1.5, -1, True, [1, 2]]:
            with pytest.raises(ValueError):
                env.seed(seed)
        assert env.seed(np.int64(3)) == [3, 4]
        for options in ["x", [{}], [{}, 3]]:
            with pytest.raises(ValueError):
                env.set_options(options)
    finally:
        env.close()


def test_set_attr_wrong_length_and_bad_indices():
    env = fastvec.AsyncVectorEnv(_fns(3), num_workers=2)
    try:
        env.reset(seed=0)
        for values in ([1, 2], [1, 2, 3, 4], (), (1,)):
            with pytest.raises(ValueError):
                env.set_attr("p_end", values)
        assert env.get_attr("p_end") == (0.12,) * 3  # unchanged
    finally:
        env.close()
    env = fastvec.SubprocVecEnv(_fns(3), num_workers=2)
    try:
        env.reset()
        for indices in ([3], [-4], 5, [0, 3], "a", [1.5], [None], True, [True], object()):
            with pytest.raises(ValueError):
                env.get_attr("p_end", indices=indices)
            with pytest.raises(ValueError):
                env.set_attr("p_end", 0.5, indices=indices)
            with pytest.raises(ValueError):
                env.env_method("render", indices=indices)
            with pytest.raises(ValueError):
                env.env_is_wrapped(gym.Wrapper, indices=indices)
        assert env.get_attr("p_end") == [0.12] * 3  # unchanged
        assert env.get_attr("p_end", indices=np.array([2, 0])) == [0.12, 0.12]
        assert env.get_attr("p_end", indices=range(1, 3)) == [0.12, 0.12]
        assert env.get_attr("p_end", indices=np.int64(-1)) == [0.12]
        env.set_attr("p_end", 0.5, indices=[-1])
        assert env.get_attr("p_end") == [0.12, 0.12, 0.5]
    finally:
        env.close()


def test_unpicklable_call_arguments():
    import threading

    env = fastvec.AsyncVectorEnv(_fns(2), num_workers=2)
    try:
        env.reset(seed=0)
        with pytest.raises(ValueError):
            env.set_attr("p_end", threading.Lock())
        assert env.get_attr("p_end") == (0.12, 0.12)
        # picklable for the first worker, not for the second: nothing may be sent at all
        with pytest.raises(ValueError):
            env.set_attr("p_end", [0.3, threading.Lock()])
        assert env.get_attr("p_end") == (0.12, 0.12)
        with pytest.raises(ValueError):
            env.call("get_wrapper_attr", threading.Lock())
        assert env.get_attr("p_end") == (0.12, 0.12)
        env.step(np.array([0, 1]))
    finally:
        env.close()


# --------------------------------------------------------------------------- misbehaving envs
def test_env_returning_wrong_observation_shape():
    fns = [MisbehavingEnv, functools.partial(MisbehavingEnv, "obs_shape"), MisbehavingEnv]
    env = fastvec.AsyncVectorEnv(fns, num_workers=2)
    try:
        env.reset(seed=0)
        with pytest.raises(fastvec.WorkerError) as info:
            env.step(np.array([0, 1, 0]))
        assert info.value.env_index == 1
        assert info.value.exc_type == "ValueError"
    finally:
        env.close()


def test_info_holding_a_local_function_is_delivered():
    """SyncVectorEnv hands over any info object; the workers pickle replies with a
    cloudpickle fallback (as they do for call results), so a lambda gets through."""
    fns = [MisbehavingEnv, functools.partial(MisbehavingEnv, "local_fn")]
    env, ref = fastvec.AsyncVectorEnv(fns, num_workers=2), SyncVectorEnv(fns)
    try:
        env.reset(seed=0)
        ref.reset(seed=0)
        for t in range(1, 3):
            info = env.step(np.array([1, 1]))[4]
            rinfo = ref.step(np.array([1, 1]))[4]
            assert_same(info["_fn"], rinfo["_fn"], "mask")
            assert info["fn"][1](10) == rinfo["fn"][1](10) == 10 + t
    finally:
        env.close()
        ref.close()


def test_info_that_cannot_be_pickled_raises_worker_error():
    fns = [MisbehavingEnv, functools.partial(MisbehavingEnv, "lock")]
    env = fastvec.AsyncVectorEnv(fns, num_workers=1)
    try:
        env.reset(seed=0)
        with pytest.raises(fastvec.WorkerError, match="pickle"):
            env.step(np.array([0, 1]))
    finally:
        env.close()


# --------------------------------------------------- compiled bounds check == numpy check
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fastvec._core.actions import ActionWriter  # noqa: E402

_BOUNDS_SPACES = [
    gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
    gym.spaces.Box(np.array([-2.0, 0.0]), np.array([2.0, np.inf]), dtype=np.float64),
    gym.spaces.Box(-5, 5, (2,), np.int64),
    gym.spaces.Discrete(4, start=-1),
    gym.spaces.MultiDiscrete([3, 5]),
]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(range(len(_BOUNDS_SPACES))),
    st.sampled_from(["float32", "float64", "int64", "int32", "int8", "uint8"]),
    st.lists(
        st.one_of(
            st.floats(-8, 8), st.sampled_from([np.nan, np.inf, -np.inf, 1.0000001, -1.0000001]), st.integers(-8, 8)
        ),
        min_size=12,
        max_size=12,
    ),
)
def test_compiled_bounds_check_agrees_with_numpy(which, dtype, values):
    """The compiled fast path accepts exactly what the numpy path accepts."""
    space = _BOUNDS_SPACES[which]
    fast = ActionWriter(space, 2)
    slow = ActionWriter(space, 2)
    for chk in slow.checks:
        chk.fast = None
    shape = (2,) + space.shape
    n = int(np.prod(shape))
    with np.errstate(invalid="ignore", over="ignore"):
        arr = np.array(values[:n], dtype=np.float64).astype(dtype).reshape(shape)

    def outcome(writer):
        try:
            out = writer.validate(arr)
            return ("ok", [a.tobytes() for a in out])
        except ValueError as exc:
            return ("error", str(exc))

    assert outcome(fast) == outcome(slow)


@pytest.mark.parametrize("front", ["gym", "sb3"])
def test_unknown_start_method_says_what_multiprocessing_says_and_what_is_allowed(front):
    """SB3's SubprocVecEnv lets multiprocessing raise "cannot find context for ...";
    fastvec's message starts the same way, then lists the start methods, before any
    process starts."""
    import multiprocessing as mp

    fns = [lambda: gym.make("CartPole-v1")] * 2
    with pytest.raises(ValueError, match="cannot find context for 'illegal_method'") as info:
        if front == "gym":
            fastvec.AsyncVectorEnv(fns, context="illegal_method")
        else:
            fastvec.SubprocVecEnv(fns, start_method="illegal_method")
    assert all(m in str(info.value) for m in mp.get_all_start_methods())
