"""fastvec._core.infos: the column encoding of flat numeric infos is exact, and falls back to
records whenever it could not be."""

import numpy as np
import pytest
from gymnasium.vector import VectorEnv
from helpers import assert_same
from hypothesis import given, settings
from hypothesis import strategies as st

from fastvec._core.infos import columns_to_records, encode_columns, merge_columns
from fastvec.doors.vector_infos import columns_to_vector_infos

SCALARS = st.one_of(
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, width=64),
    st.booleans(),
    st.floats(allow_nan=False, width=32).map(np.float32),
    st.floats(allow_nan=False).map(np.float64),
    st.integers(-1000, 1000).map(np.int32),
)


def _reference_merge(records, n):
    venv = VectorEnv()
    venv.num_envs = n
    infos = {}
    for i, info, _ in records:
        infos = venv._add_info(infos, info, i)
    return infos


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.dictionaries(st.sampled_from("abcd"), SCALARS, max_size=4), min_size=1, max_size=6), st.integers(0, 3)
)
def test_columns_roundtrip_or_refuse(infos, split):
    n = len(infos)
    records = [(j, info, None) for j, info in enumerate(infos) if info]
    cols = encode_columns(records)
    types = {}
    consistent = all(types.setdefault(k, type(v)) is type(v) for _, info, _ in records for k, v in info.items())
    if not consistent:
        assert cols is None
        return
    assert cols is not None
    assert_same(columns_to_records(cols), records)
    assert_same(columns_to_vector_infos(cols, n), _reference_merge(records, n))
    # Two workers' columns, joined, equal the whole.
    split = min(split, n)
    left = encode_columns([r for r in records if r[0] < split])
    right = encode_columns([(j - split, i, r) for j, i, r in records if j >= split])
    merged = merge_columns([(0, left), (split, right)])
    if merged is not None:
        assert_same(columns_to_vector_infos(merged, n), _reference_merge(records, n))


@pytest.mark.parametrize(
    "info",
    [
        {"a": np.zeros(3)},
        {"a": "text"},
        {"a": {"nested": 1}},
        {"a": None},
        {"a": 2**70},
        {"a": np.bool_(True)},
    ],
)
def test_non_flat_infos_are_sent_as_records(info):
    assert encode_columns([(0, info, None)]) is None


def test_episode_ends_are_sent_as_records():
    assert encode_columns([(0, {"a": 1.0}, {"reset": 1.0})]) is None


def test_flat_infos_travel_in_the_shared_info_table():
    """Flat numeric infos are written into the segment's info table (no pickling): the
    engine learns each worker's columns, and the merged infos equal SyncVectorEnv's."""
    import gymnasium as gym
    from envs import FlatInfoEnv

    import fastvec

    env = fastvec.AsyncVectorEnv([FlatInfoEnv] * 4, num_workers=2)
    ref = gym.vector.SyncVectorEnv([FlatInfoEnv] * 4)
    try:
        env.reset(seed=3)
        ref.reset(seed=3)
        for t in range(30):
            actions = np.array([t % 3] * 4)
            got, want = env.step(actions), ref.step(actions)
            assert_same(got[4], want[4])
        keys = [[key for key, _kind, _is_int in schema] for schema in env.engine._table.schemas]
        for worker_keys in keys:
            assert {"x_position", "lives", "reward_ctrl", "frame", "f16", "u32", "i8"} <= set(worker_keys)
    finally:
        env.close()
        ref.close()


# -------------------------------------------- the compiled vector-info builder
KINDS = [
    int,
    float,
    bool,
    np.float32,
    np.float16,
    np.float64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
]


def _table_of(values_by_col, kinds, n, slots=3, slot=1):
    """An info table (float64 cells viewed as int64 where the column is int) holding
    ``values_by_col[c][i]`` for env i in ``slot``, every bit of ``slot`` set."""
    from fastvec._core.protocol import INFO_COLS

    from fastvec._core.infos import table_kind

    info_f = np.full((slots, n, INFO_COLS), np.nan)
    info_i = info_f.view(np.int64)
    mask = np.zeros((slots, n), dtype=np.uint16)
    for c, (kind, values) in enumerate(zip(kinds, values_by_col)):
        for i, v in enumerate(values):
            if table_kind(kind):
                info_i[slot, i, c] = int(v)
            else:
                info_f[slot, i, c] = float(v)
        mask[slot, :] |= 1 << c
    return info_i, info_f, mask


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(KINDS), min_size=1, max_size=16), st.integers(1, 6), st.randoms())
def test_compiled_vector_infos_equal_gymnasiums_merge(kinds, n, rnd):
    """What the engine's fast step builds from the table is what gymnasium's
    ``_add_info`` builds from the same infos, env by env: values, dtypes, key order."""
    from fastvec._core.infos import table_kind
    from fastvec.doors._gym_infos import table_vector_infos
    from fastvec.doors._sb3_infos import table_env_infos
    from fastvec.doors.vector_infos import vector_dtype

    def draw(kind):
        if kind is bool:
            return rnd.random() < 0.5
        if kind in (float, np.float64, np.float32, np.float16):
            return kind(rnd.uniform(-1e3, 1e3))
        info = np.iinfo(np.int64 if kind is int else kind)
        return kind(rnd.randint(max(info.min, -(2**40)), min(info.max, 2**40)))

    keys = [f"k{c}" for c in range(len(kinds))]
    values = [[draw(kind) for _ in range(n)] for kind in kinds]
    info_i, info_f, mask = _table_of(values, kinds, n)
    cols = [
        (key, f"_{key}", table_kind(kind), vector_dtype(kind, table_kind(kind)), kind) for key, kind in zip(keys, kinds)
    ]
    got = table_vector_infos(info_i, info_f, mask, 1, cols)
    records = [(i, {key: values[c][i] for c, key in enumerate(keys)}, None) for i in range(n)]
    want = _reference_merge(records, n)
    assert list(got) == list(want)
    assert_same(got, want)
    # Each array is its own: writing into one leaves the others alone.
    assert len({id(v) for v in got.values()}) == len(got)
    assert not any(np.shares_memory(a, b) for a in got.values() for b in got.values() if a is not b)

    # Per env (SB3's door): the values and exact types each env returned, keys in order.
    per_env = table_env_infos(info_i, info_f, mask, 1, cols)
    assert len(per_env) == n
    for (_, info, _), mine in zip(records, per_env):
        assert list(mine) == list(info)
        for key in info:
            assert type(mine[key]) is type(info[key]), (key, type(mine[key]), type(info[key]))
            assert mine[key] == info[key] or (mine[key] != mine[key] and info[key] != info[key])


def test_compiled_info_builders_decline_a_partial_table_and_check_their_input():
    from fastvec.doors._gym_infos import table_vector_infos
    from fastvec.doors._sb3_infos import table_env_infos

    info_i, info_f, mask = _table_of([[1, 2, 3], [0.5, 1.5, 2.5]], [int, float], 3)
    cols = [("a", "_a", True, None, int), ("b", "_b", False, None, float)]
    for build in (table_vector_infos, table_env_infos):
        _, _, mask = _table_of([[1, 2, 3], [0.5, 1.5, 2.5]], [int, float], 3)
        assert build(info_i, info_f, mask, 1, cols) is not None
        mask[1, 2] &= ~np.uint16(2)  # env 2 did not report "b"
        assert build(info_i, info_f, mask, 1, cols) is None
        with pytest.raises(IndexError, match="slot 3 out of range"):
            build(info_i, info_f, mask, 3, cols)
        with pytest.raises(ValueError, match="columns"):
            build(info_i, info_f, mask, 1, [])
        with pytest.raises(ValueError, match="disagree"):
            build(info_i, info_f, mask[:, :2].copy(), 1, cols)


@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_steady_infos_take_the_compiled_path_and_equal_sync(mode, monkeypatch):
    """Steady flat infos (every env, every key, every step): the gymnasium door's step
    builds them in one compiled pass, and every step still equals SyncVectorEnv's."""
    import gymnasium as gym
    from envs import SteadyInfoEnv
    from gymnasium.vector import AutoresetMode
    from helpers import count_builds

    import fastvec

    built = count_builds(monkeypatch, "table_vector_infos")
    autoreset = AutoresetMode(mode)
    env = fastvec.AsyncVectorEnv([SteadyInfoEnv] * 5, num_workers=2, autoreset_mode=autoreset)
    ref = gym.vector.SyncVectorEnv([SteadyInfoEnv] * 5, autoreset_mode=autoreset)
    try:
        got, want = env.reset(seed=11), ref.reset(seed=11)
        assert_same(got, want)
        done = np.zeros(5, dtype=bool)
        for t in range(120):
            actions = np.array([(t + i) % 3 for i in range(5)])
            if mode == "Disabled" and done.any():
                got = env.reset(options={"reset_mask": done})
                want = ref.reset(options={"reset_mask": done})
                assert_same(got, want)
            got, want = env.step(actions), ref.step(actions)
            assert_same(got, want)
            done = want[2] | want[3]
    finally:
        env.close()
        ref.close()
    assert sum(built) > 20, f"the compiled path built infos in only {sum(built)} of 120 steps"


def test_quiet_episode_ends_travel_without_a_payload_and_are_still_reported():
    """same_step: an episode end whose step and reset infos are both empty (CartPole's)
    sends no record, so the step stays payload-less; ``StepResult.env_records`` still lists it
    as ``(i, {}, {})``, and both doors still equal their references (see the
    equivalence suites, which step CartPole in every autoreset mode)."""
    import gymnasium as gym

    from fastvec.engine import Engine

    eng = Engine([lambda: gym.make("CartPole-v1")] * 4, num_workers=2, autoreset_mode="same_step")
    try:
        eng.reset(0, {i: {"seed": i} for i in range(4)})
        ends = 0
        for t in range(200):
            slot = (t + 1) % eng.num_slots
            eng.step_async(np.array([t % 2, 1, 0, t % 3 % 2]), slot)
            records = eng.step_wait().env_records()
            ended = np.flatnonzero(eng.terminated[slot] | eng.truncated[slot]).tolist()
            assert records == [(i, {}, {}) for i in ended]
            assert eng._ctl.plain_step_replies(slot) == 0  # every reply payload-less, no table
            ends += len(ended)
        assert ends > 5
    finally:
        eng.close()


def test_engine_step_equals_step_async_then_step_wait():
    """``Engine.step`` (rung and waited for in one compiled call) answers what
    ``step_async`` + ``step_wait`` answer, and bad actions raise before dispatch."""
    from envs import FlatInfoEnv

    from fastvec.engine import Engine

    a = Engine([FlatInfoEnv] * 4, num_workers=2, autoreset_mode="next_step")
    b = Engine([FlatInfoEnv] * 4, num_workers=2, autoreset_mode="next_step")
    try:
        for eng in (a, b):
            eng.reset(0, {i: {"seed": 20 + i} for i in range(4)})
        for t in range(60):
            slot = (t + 1) % a.num_slots
            actions = np.array([(t + i) % 3 for i in range(4)])
            got = a.step(actions, slot)
            b.step_async(actions, slot)
            want = b.step_wait()
            assert got.slot == want.slot == slot
            assert_same(got.as_records(), want.as_records(), f"step {t}")
            for name in ("rewards", "terminated", "truncated"):
                assert_same(getattr(a, name)[slot], getattr(b, name)[slot], f"step {t} {name}")
        with pytest.raises(ValueError, match="out of range"):
            a.step(np.array([0, 1, 2, 3]), 0)
        a.step(np.array([0, 1, 2, 0]), 0)  # still usable
    finally:
        a.close()
        b.close()
