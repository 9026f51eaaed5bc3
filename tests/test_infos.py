"""fastvec.infos: the column encoding of flat numeric infos is exact, and falls back to
records whenever it could not be."""
import numpy as np
import pytest
from gymnasium.vector import VectorEnv
from hypothesis import given, settings
from hypothesis import strategies as st

from fastvec.infos import columns_to_records, columns_to_vector_infos, encode_columns, merge_columns
from helpers import assert_same

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
@given(st.lists(st.dictionaries(st.sampled_from("abcd"), SCALARS, max_size=4), min_size=1, max_size=6),
       st.integers(0, 3))
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


@pytest.mark.parametrize("info", [
    {"a": np.zeros(3)}, {"a": "text"}, {"a": {"nested": 1}}, {"a": None}, {"a": 2**70}, {"a": np.bool_(True)},
])
def test_non_flat_infos_are_sent_as_records(info):
    assert encode_columns([(0, info, None)]) is None


def test_episode_ends_are_sent_as_records():
    assert encode_columns([(0, {"a": 1.0}, {"reset": 1.0})]) is None


def test_flat_infos_travel_in_the_shared_info_table():
    """Flat numeric infos are written into the segment's info table (no pickling): the
    engine learns each worker's columns, and the merged infos equal SyncVectorEnv's."""
    import gymnasium as gym

    import fastvec
    from envs import FlatInfoEnv

    env = fastvec.AsyncVectorEnv([FlatInfoEnv] * 4, num_workers=2)
    ref = gym.vector.SyncVectorEnv([FlatInfoEnv] * 4)
    try:
        env.reset(seed=3)
        ref.reset(seed=3)
        for t in range(30):
            actions = np.array([t % 3] * 4)
            got, want = env.step(actions), ref.step(actions)
            assert_same(got[4], want[4])
        keys = [[key for key, _kind, _is_int in schema] for schema in env.engine._schemas]
        for worker_keys in keys:
            assert {"x_position", "lives", "reward_ctrl", "frame", "f16", "u32", "i8"} <= set(worker_keys)
    finally:
        env.close()
        ref.close()
