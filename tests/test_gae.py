"""Tests for fastvec.gae (Cython GAE kernel + validating wrapper)."""

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastvec import _gae
from fastvec.returns.gae_estimates import gae, gae_from_dones

FLOAT_DTYPES = [np.float32, np.float64]


# --------------------------------------------------------------------------- #
# references, written plainly (float64, Python loop over t)
# --------------------------------------------------------------------------- #
def ref_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    r = np.asarray(rewards, np.float64)
    v = np.asarray(values, np.float64)
    nv = np.asarray(next_values, np.float64)
    term = (np.asarray(terminated) != 0).astype(np.float64)
    trunc = (np.asarray(truncated) != 0).astype(np.float64)
    T, N = v.shape
    adv = np.zeros((T, N))
    next_adv = np.zeros(N)  # A_T = 0
    for t in reversed(range(T)):
        delta = r[t] + gamma * (1.0 - term[t]) * nv[t] - v[t]
        next_adv = delta + gamma * lam * (1.0 - term[t]) * (1.0 - trunc[t]) * next_adv
        adv[t] = next_adv
    return adv, adv + v


def cleanrl_loop(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """A float64 reference in CleanRL's ``dones`` convention (``dones[t]``: ``obs[t]``
    began a new episode; ``next_value``/``next_done`` follow the last step), written
    step by step from the GAE definition."""
    r = np.asarray(rewards, np.float64)
    v = np.asarray(values, np.float64)
    d = np.asarray(dones, np.float64)
    T = r.shape[0]
    after_v = np.concatenate([v[1:], np.asarray(next_value, np.float64).reshape(1, -1)])
    alive = 1.0 - np.concatenate([d[1:], np.asarray(next_done, np.float64).reshape(1, -1)])
    adv = np.empty_like(r)
    acc = np.zeros(r.shape[1:])
    for t in range(T - 1, -1, -1):
        acc = r[t] + gamma * after_v[t] * alive[t] - v[t] + gamma * gae_lambda * alive[t] * acc
        adv[t] = acc
    return adv, adv + v


def make(T, N, dtype=np.float64, p_term=0.1, p_trunc=0.1, seed=0):
    rng = np.random.default_rng(seed)
    r = rng.standard_normal((T, N)).astype(dtype)
    v = rng.standard_normal((T, N)).astype(dtype)
    nv = rng.standard_normal((T, N)).astype(dtype)
    term = rng.random((T, N)) < p_term
    trunc = rng.random((T, N)) < p_trunc
    return r, v, nv, term, trunc


def assert_matches(got, want, dtype):
    got = np.asarray(got)
    assert got.dtype == np.dtype(dtype)
    if np.dtype(dtype) == np.float64:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    else:
        scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-4, atol=1e-4 * scale)


def cast_flags(flags, kind):
    if kind == "bool":
        return flags
    if kind == "uint8":
        return flags.astype(np.uint8)
    if kind == "int8_neg":  # -1 is nonzero -> set
        return -flags.astype(np.int8)
    if kind == "int64_big":
        return flags.astype(np.int64) * 7
    if kind == "float32":
        return flags.astype(np.float32)
    if kind == "float64_half":  # 0.5 is nonzero -> set
        return flags.astype(np.float64) * 0.5
    raise AssertionError(kind)


FLAG_KINDS = ["bool", "uint8", "int8_neg", "int64_big", "float32", "float64_half"]
coef = st.one_of(st.sampled_from([0.0, 1.0, 0.99, 0.95]), st.floats(0.0, 1.0))


# --------------------------------------------------------------------------- #
# properties
# --------------------------------------------------------------------------- #
@settings(max_examples=120, deadline=None)
@given(
    T=st.integers(1, 40),
    N=st.integers(1, 19),
    dtype=st.sampled_from(FLOAT_DTYPES),
    p_term=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
    p_trunc=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
    gamma=coef,
    lam=coef,
    flag_kind=st.sampled_from(FLAG_KINDS),
    seed=st.integers(0, 2**32 - 1),
)
def test_gae_matches_reference(T, N, dtype, p_term, p_trunc, gamma, lam, flag_kind, seed):
    r, v, nv, term, trunc = make(T, N, dtype, p_term, p_trunc, seed)
    want_adv, want_ret = ref_gae(r, v, nv, term, trunc, gamma, lam)
    adv, ret = gae(r, v, nv, cast_flags(term, flag_kind), cast_flags(trunc, flag_kind), gamma, lam)
    assert adv.shape == ret.shape == (T, N)
    assert_matches(adv, want_adv, dtype)
    assert_matches(ret, want_ret, dtype)


@settings(max_examples=80, deadline=None)
@given(
    T=st.integers(1, 40),
    N=st.integers(1, 19),
    dtype=st.sampled_from(FLOAT_DTYPES),
    p_done=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
    gamma=coef,
    lam=coef,
    flag_kind=st.sampled_from(FLAG_KINDS),
    seed=st.integers(0, 2**32 - 1),
)
def test_gae_from_dones_matches_cleanrl(T, N, dtype, p_done, gamma, lam, flag_kind, seed):
    rng = np.random.default_rng(seed)
    r = rng.standard_normal((T, N)).astype(dtype)
    v = rng.standard_normal((T, N)).astype(dtype)
    dones = rng.random((T, N)) < p_done
    last_value = rng.standard_normal(N).astype(dtype)
    last_done = rng.random(N) < p_done
    want_adv, want_ret = cleanrl_loop(r, v, dones, last_value, last_done, gamma, lam)
    adv, ret = gae_from_dones(
        r, v, cast_flags(dones, flag_kind), last_value, cast_flags(last_done, flag_kind), gamma, lam
    )
    assert_matches(adv, want_adv, dtype)
    assert_matches(ret, want_ret, dtype)
    # ... and it is gae() with the documented mapping
    nv = np.concatenate([v[1:], last_value[None]], axis=0)
    term = np.concatenate([dones[1:], last_done[None]], axis=0)
    adv2, ret2 = gae(r, v, nv, term, np.zeros_like(term), gamma, lam)
    np.testing.assert_array_equal(adv, adv2)
    np.testing.assert_array_equal(ret, ret2)


# --------------------------------------------------------------------------- #
# edge cases
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_single_step_single_env(dtype):
    r, v, nv = (np.array([[x]], dtype) for x in (1.0, 0.5, 2.0))
    f, t = np.array([[False]]), np.array([[True]])
    g, lam = 0.9, 0.8
    assert gae(r, v, nv, f, f, g, lam)[0][0, 0] == pytest.approx(1.0 + 0.9 * 2.0 - 0.5)
    assert gae(r, v, nv, t, f, g, lam)[0][0, 0] == pytest.approx(0.5)  # no bootstrap
    assert gae(r, v, nv, f, t, g, lam)[0][0, 0] == pytest.approx(1.0 + 0.9 * 2.0 - 0.5)
    adv, ret = gae(r, v, nv, t, t, g, lam)
    assert adv[0, 0] == pytest.approx(0.5) and ret[0, 0] == pytest.approx(1.0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_all_terminated_all_truncated_both(dtype):
    r, v, nv, _, _ = make(13, 5, dtype)
    ones = np.ones((13, 5), bool)
    zeros = np.zeros((13, 5), bool)
    g, lam = 0.97, 0.9
    # all terminated: A = r - v, returns = r
    adv, ret = gae(r, v, nv, ones, zeros, g, lam)
    assert_matches(adv, r.astype(np.float64) - v, dtype)
    assert_matches(ret, r.astype(np.float64), dtype)
    # all truncated: one-step bootstrapped TD errors
    adv, _ = gae(r, v, nv, zeros, ones, g, lam)
    assert_matches(adv, r.astype(np.float64) + g * nv.astype(np.float64) - v, dtype)
    # both: terminated wins (no bootstrap)
    adv, _ = gae(r, v, nv, ones, ones, g, lam)
    assert_matches(adv, r.astype(np.float64) - v, dtype)


def test_terminated_wins_over_truncated_mixed():
    r, v, nv, term, trunc = make(30, 7, p_term=0.3, p_trunc=0.3, seed=3)
    both = term | trunc
    adv, _ = gae(r, v, nv, term, both, 0.99, 0.95)  # truncated set wherever terminated is
    want, _ = ref_gae(r, v, nv, term, trunc, 0.99, 0.95)
    np.testing.assert_allclose(adv, want, rtol=1e-12, atol=1e-12)


def test_gamma_lam_extremes():
    r, v, nv, term, trunc = make(20, 3, seed=4)
    for g, lam in [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)]:
        want, _ = ref_gae(r, v, nv, term, trunc, g, lam)
        np.testing.assert_allclose(gae(r, v, nv, term, trunc, g, lam)[0], want, rtol=1e-12, atol=1e-12)
    # gamma = lam = 1 and no flags: A[t] = sum_{k>=t} delta[k]
    z = np.zeros_like(term)
    adv, _ = gae(r, v, nv, z, z, 1.0, 1.0)
    want = np.cumsum((r + nv - v)[::-1], axis=0)[::-1]
    np.testing.assert_allclose(adv, want, rtol=1e-12, atol=1e-12)
    # ... which telescopes when next_values[t] = values[t + 1]
    nv_chain = np.concatenate([v[1:], nv[-1:]])
    adv, _ = gae(r, v, nv_chain, z, z, 1.0, 1.0)
    want = np.cumsum(r[::-1], axis=0)[::-1] + nv[-1] - v
    np.testing.assert_allclose(adv, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", FLAG_KINDS + ["nan", "float_neg"])
def test_flag_dtypes_nonzero_is_set(kind):
    r, v, nv, term, trunc = make(17, 6, p_term=0.3, p_trunc=0.3, seed=5)
    want = gae(r, v, nv, term, trunc, 0.9, 0.8)
    if kind == "nan":  # NaN != 0 -> set
        tf = np.where(term, np.nan, 0.0)
        uf = np.where(trunc, np.nan, 0.0)
    elif kind == "float_neg":
        tf = np.where(term, -3.5, 0.0).astype(np.float32)
        uf = np.where(trunc, 1e-30, 0.0)
    else:
        tf, uf = cast_flags(term, kind), cast_flags(trunc, kind)
    got = gae(r, v, nv, tf, uf, 0.9, 0.8)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def layouts(x):
    """Same values, different memory layouts."""
    T, N = x.shape
    yield "fortran", np.asfortranarray(x)
    yield "transposed", np.ascontiguousarray(x.T).T
    big = np.zeros((2 * T, N + 3), x.dtype)
    big[::2, 1 : N + 1] = x
    yield "every_other_row", big[::2, 1 : N + 1]
    cols = np.zeros((T, 2 * N), x.dtype)
    cols[:, ::2] = x
    yield "every_other_col", cols[:, ::2]
    yield "reversed_rows", np.ascontiguousarray(x[::-1])[::-1]
    yield "reversed_cols", np.ascontiguousarray(x[:, ::-1])[:, ::-1]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_non_contiguous_inputs(dtype):
    r, v, nv, term, trunc = make(23, 9, dtype, p_term=0.2, p_trunc=0.2, seed=6)
    want = gae(r, v, nv, term, trunc, 0.99, 0.9)
    args = [r, v, nv, term, trunc]
    for i in range(5):
        for name, alt in layouts(args[i]):
            np.testing.assert_array_equal(alt, args[i])
            a = list(args)
            a[i] = alt
            got = gae(*a, 0.99, 0.9)
            np.testing.assert_array_equal(got[0], want[0], err_msg=f"arg {i} {name}")
            np.testing.assert_array_equal(got[1], want[1], err_msg=f"arg {i} {name}")
    # everything transposed at once
    got = gae(*[np.ascontiguousarray(x.T).T for x in args], 0.99, 0.9)
    np.testing.assert_array_equal(got[0], want[0])


def test_non_contiguous_from_dones():
    r, v, _, dones, _ = make(19, 8, np.float32, p_term=0.2, seed=7)
    lv = np.arange(8, dtype=np.float32)
    ld = np.arange(8) % 3 == 0
    want = gae_from_dones(r, v, dones, lv, ld, 0.99, 0.95)
    got = gae_from_dones(
        np.asfortranarray(r),
        np.ascontiguousarray(v.T).T,
        np.asfortranarray(dones),
        np.repeat(lv, 2)[::2],
        np.repeat(ld, 3)[::3],
        0.99,
        0.95,
    )
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_zero_stride_broadcast_inputs():
    T, N = 11, 4
    r = np.broadcast_to(np.arange(N, dtype=np.float64), (T, N))
    v = np.broadcast_to(np.float64(0.5), (T, N))
    nv = np.broadcast_to(np.float64(1.5), (T, N))
    f = np.broadcast_to(False, (T, N))
    want = ref_gae(r, v, nv, f, f, 0.9, 0.7)
    got = gae(r, v, nv, f, f, 0.9, 0.7)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


def test_array_likes_and_byte_order():
    r, v, nv, term, trunc = make(5, 3, seed=8)
    want = gae(r, v, nv, term, trunc, 0.9, 0.9)
    got = gae(r.tolist(), v.astype(">f8"), nv.astype(">f8"), term.tolist(), trunc, 0.9, 0.9)
    assert got[0].dtype == np.float64
    np.testing.assert_array_equal(got[0], want[0])


# --------------------------------------------------------------------------- #
# dtype rules
# --------------------------------------------------------------------------- #
def test_output_dtype_follows_values():
    r, v, nv, term, trunc = make(12, 4, seed=9)
    v32 = v.astype(np.float32)
    adv, ret = gae(r, v32, nv, term, trunc, 0.99, 0.95)  # float64 rewards / next_values
    assert adv.dtype == ret.dtype == np.float32
    want = gae(r.astype(np.float32), v32, nv.astype(np.float32), term, trunc, 0.99, 0.95)
    np.testing.assert_array_equal(adv, want[0])
    adv, ret = gae(r.astype(np.float32), v, nv.astype(np.float32), term, trunc, 0.99, 0.95)
    assert adv.dtype == ret.dtype == np.float64
    want = gae(
        r.astype(np.float32).astype(np.float64), v, nv.astype(np.float32).astype(np.float64), term, trunc, 0.99, 0.95
    )
    np.testing.assert_array_equal(adv, want[0])
    # integer / bool / float16 rewards are converted
    for rr in (np.arange(48).reshape(12, 4), np.ones((12, 4), bool), r.astype(np.float16)):
        got = gae(rr, v32, nv, term, trunc, 0.9, 0.9)
        want = gae(rr.astype(np.float32), v32, nv, term, trunc, 0.9, 0.9)
        assert got[0].dtype == np.float32
        np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("bad", [np.int64, np.int32, np.float16, np.bool_, np.complex64])
def test_values_must_be_float32_or_float64(bad):
    r, v, nv, term, trunc = make(4, 2)
    with pytest.raises(ValueError, match="values"):
        gae(r, v.astype(bad), nv, term, trunc, 0.9, 0.9)


# --------------------------------------------------------------------------- #
# out=
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_out_reuse(dtype):
    r, v, nv, term, trunc = make(16, 5, dtype, seed=10)
    want = gae(r, v, nv, term, trunc, 0.99, 0.95)
    a = np.full((16, 5), 7.0, dtype)
    b = np.full((16, 5), 7.0, dtype)
    got = gae(r, v, nv, term, trunc, 0.99, 0.95, out=(a, b))
    assert got[0] is a and got[1] is b
    np.testing.assert_array_equal(a, want[0])
    np.testing.assert_array_equal(b, want[1])
    # second use of the same buffers with other data
    r2 = r + 1
    got = gae(r2, v, nv, term, trunc, 0.99, 0.95, out=[a, b])
    assert got[0] is a and got[1] is b
    np.testing.assert_array_equal(a, gae(r2, v, nv, term, trunc, 0.99, 0.95)[0])
    # non-contiguous out buffers (go through a temporary)
    ft = np.zeros((5, 16), dtype).T
    bigb = np.zeros((32, 10), dtype)
    got = gae(r, v, nv, term, trunc, 0.99, 0.95, out=(ft, bigb[::2, ::2]))
    assert got[0] is ft
    np.testing.assert_array_equal(ft, want[0])
    np.testing.assert_array_equal(bigb[::2, ::2], want[1])
    assert not bigb[1::2].any() and not bigb[:, 1::2].any()
    # from_dones too
    a2, b2 = np.empty_like(a), np.empty_like(b)
    got = gae_from_dones(r, v, term, v[0], term[0], 0.9, 0.9, out=(a2, b2))
    assert got[0] is a2 and got[1] is b2
    np.testing.assert_array_equal(a2, gae_from_dones(r, v, term, v[0], term[0], 0.9, 0.9)[0])


def test_out_errors():
    r, v, nv, term, trunc = make(6, 3)
    ok = np.empty((6, 3))
    args = (r, v, nv, term, trunc, 0.9, 0.9)
    bad_outs = [
        (ok, np.empty((6, 3), np.float32)),  # dtype
        (np.empty((3, 6)), ok),  # shape
        (ok, [[0.0] * 3] * 6),  # not an ndarray
        ok,  # not a pair
        (ok,),
        (ok, ok),  # same buffer twice
        (ok, np.empty((6, 3))[::-1].copy().view()),  # fine...
    ]
    for out in bad_outs[:-1]:
        with pytest.raises(ValueError, match="out"):
            gae(*args, out=out)
    gae(*args, out=bad_outs[-1])
    ro = np.empty((6, 3))
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        gae(*args, out=(ro, np.empty((6, 3))))
    # overlapping an input
    with pytest.raises(ValueError, match="overlaps the input values"):
        gae(r, v, nv, term, trunc, 0.9, 0.9, out=(v, np.empty((6, 3))))
    with pytest.raises(ValueError, match="overlaps the input rewards"):
        gae(r, v, nv, term, trunc, 0.9, 0.9, out=(np.empty((6, 3)), r))
    self_overlapping = np.lib.stride_tricks.as_strided(np.empty(3), (6, 3), (0, 8))
    with pytest.raises(ValueError, match=r"out\[1\].*overlapping rows"):
        gae(*args, out=(np.empty((6, 3)), self_overlapping))
    buf = np.empty((12, 3))
    with pytest.raises(ValueError, match="overlap"):
        gae(*args, out=(buf[:6], buf[3:9]))
    gae(*args, out=(buf[:6], buf[6:]))  # adjacent but disjoint is fine


# --------------------------------------------------------------------------- #
# NaN
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_nan_propagates_within_segment_only(dtype):
    T, N = 10, 3
    r = np.ones((T, N), dtype)
    v = np.zeros((T, N), dtype)
    nv = np.zeros((T, N), dtype)
    term = np.zeros((T, N), bool)
    trunc = np.zeros((T, N), bool)
    r[6, 1] = np.nan
    term[3, 1] = True  # episode boundary after step 3 in env 1
    adv, ret = gae(r, v, nv, term, trunc, 0.9, 0.9)
    assert np.isnan(adv[4:7, 1]).all() and np.isnan(ret[4:7, 1]).all()
    assert np.isfinite(adv[7:, 1]).all() and np.isfinite(adv[:4, 1]).all()
    assert np.isfinite(adv[:, [0, 2]]).all()
    # NaN in values poisons its own step and the earlier steps of the segment
    v2 = v.copy()
    v2[5, 0] = np.nan
    adv, _ = gae(r, v2, nv, term, trunc, 0.9, 0.9)
    assert np.isnan(adv[:6, 0]).all() and np.isfinite(adv[6:, 0]).all()
    # with no boundary it reaches t = 0 (and the reference agrees)
    adv, _ = gae(r, v, nv, np.zeros_like(term), trunc, 0.9, 0.9)
    assert np.isnan(adv[:7, 1]).all() and np.isfinite(adv[7:, 1]).all()


def test_unused_next_value_may_be_nan():
    """Where terminated, next_values is never read (not 0 * nan)."""
    r, v, nv, term, trunc = make(12, 4, p_term=0.3, seed=11)
    want = gae(r, v, nv, term, trunc, 0.99, 0.95)
    nv2 = np.where(term, np.nan, nv)
    got = gae(r, v, nv2, term, trunc, 0.99, 0.95)
    np.testing.assert_array_equal(got[0], want[0])
    nv3 = np.where(term, np.inf, nv)
    np.testing.assert_array_equal(gae(r, v, nv3, term, trunc, 0.99, 0.95)[0], want[0])


# --------------------------------------------------------------------------- #
# empty, rank, shapes, garbage
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("shape", [(0, 4), (5, 0), (0, 0)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_empty(shape, dtype):
    z = np.zeros(shape, dtype)
    f = np.zeros(shape, bool)
    adv, ret = gae(z, z, z, f, f, 0.9, 0.9)
    assert adv.shape == ret.shape == shape and adv.dtype == ret.dtype == dtype
    adv, ret = gae_from_dones(z, z, f, np.zeros(shape[1], dtype), np.zeros(shape[1], bool), 0.9, 0.9)
    assert adv.shape == ret.shape == shape


NAMES = ["rewards", "values", "next_values", "terminated", "truncated"]


def good_args(T=6, N=3):
    r, v, nv, term, trunc = make(T, N)
    return [r, v, nv, term, trunc, 0.99, 0.95]


@pytest.mark.parametrize("i", range(5))
@pytest.mark.parametrize(
    "bad",
    [
        "one_d",
        "three_d",
        "zero_d",
        "wrong_T",
        "wrong_N",
        "none",
        "string",
        "object",
        "complex",
        "ragged",
        "dict",
    ],
)
def test_bad_array_argument_names_it(i, bad):
    args = good_args()
    x = args[i]
    replacement = {
        "one_d": lambda: x[:, 0],
        "three_d": lambda: x[None],
        "zero_d": lambda: x[0, 0],
        "wrong_T": lambda: x[:-1],
        "wrong_N": lambda: x[:, :-1],
        "none": lambda: None,
        "string": lambda: "abc",
        "object": lambda: x.astype(object),
        "complex": lambda: x.astype(np.complex128),
        "ragged": lambda: [[1.0, 2.0], [3.0]],
        "dict": lambda: {"a": 1},
    }[bad]()
    args[i] = replacement
    if bad in ("wrong_T", "wrong_N") and i == 1:
        name_re = "values|rewards"  # values sets the expected shape; rewards is then off
    else:
        name_re = NAMES[i]
    with pytest.raises(ValueError, match=name_re):
        gae(*args)


@pytest.mark.parametrize("name,pos", [("gamma", 5), ("lam", 6)])
@pytest.mark.parametrize(
    "bad",
    [-0.1, 1.0000001, float("nan"), float("inf"), -float("inf"), "0.9", None, True, np.array([0.9]), 1j, [0.9]],
)
def test_bad_coefficients(name, pos, bad):
    args = good_args()
    args[pos] = bad
    with pytest.raises(ValueError, match=name):
        gae(*args)


def test_good_coefficient_types():
    args = good_args()
    want = gae(*args)[0]
    for g in (np.float32(0.99), np.float64(0.99), np.array(0.99)):
        args[5] = g
        np.testing.assert_allclose(gae(*args)[0], want, rtol=1e-6)
    args[5], args[6] = 1, 0  # Python ints
    gae(*args)


def test_from_dones_bad_inputs():
    r, v, _, dones, _ = make(6, 3)
    lv, ld = np.zeros(3), np.zeros(3, bool)
    gae_from_dones(r, v, dones, lv[None], ld[None], 0.9, 0.9)  # [1, N] is accepted
    cases = [
        ("last_value", (r, v, dones, np.zeros(4), ld)),
        ("last_value", (r, v, dones, np.zeros((2, 3)), ld)),
        ("last_value", (r, v, dones, None, ld)),
        ("last_done", (r, v, dones, lv, np.zeros(2, bool))),
        ("last_done", (r, v, dones, lv, "x")),
        ("dones", (r, v, dones[:, 0], lv, ld)),
        ("rewards", (r[:-1], v, dones, lv, ld)),
        ("values", (r, v[:, 0], dones, lv, ld)),
        ("values", (r, v.astype(int), dones, lv, ld)),
    ]
    for name, a in cases:
        with pytest.raises(ValueError, match=name):
            gae_from_dones(*a, 0.9, 0.9)
    with pytest.raises(ValueError, match="lam"):
        gae_from_dones(r, v, dones, lv, ld, 0.9, 2.0)


def test_kernel_checks_shapes_itself():
    """The raw kernel is memory safe on its own (shape / stride checks)."""
    r, v, nv, term, trunc = make(6, 3)
    t8, u8 = term.view(np.uint8), trunc.view(np.uint8)
    a, b = np.empty((6, 3)), np.empty((6, 3))
    with pytest.raises(ValueError, match="rewards"):
        _gae.gae_kernel(r[:5], v, nv, t8, u8, 0.9, 0.9, a, b)
    with pytest.raises(ValueError, match="ret"):
        _gae.gae_kernel(r, v, nv, t8, u8, 0.9, 0.9, a, b[:, :2])
    with pytest.raises(ValueError, match="unit-stride"):
        _gae.gae_kernel(np.asfortranarray(r), v, nv, t8, u8, 0.9, 0.9, a, b)
    with pytest.raises(ValueError, match="overlap"):
        _gae.gae_kernel(r, v, nv, t8, u8, 0.9, 0.9, np.lib.stride_tricks.as_strided(a, (6, 3), (0, 8)), b)
    with pytest.raises(ValueError, match="last_value"):
        _gae.gae_dones_kernel(r, v, t8, np.zeros(4), np.zeros(3, np.uint8), 0.9, 0.9, a, b)
    with pytest.raises((ValueError, TypeError)):
        _gae.gae_kernel(r.astype(np.float32), v, nv, t8, u8, 0.9, 0.9, a, b)


# --------------------------------------------------------------------------- #
# GIL
# --------------------------------------------------------------------------- #
def test_kernel_releases_gil():
    """While gae runs in a worker thread, another Python thread keeps running.

    With the GIL held for the whole kernel the counting thread could not run
    at all in the middle of the call; we require a handful of increments in
    the middle half of the call's time window (typically there are 10^5+).
    """
    T, N = 8_000_000, 1  # one env: per-row overhead makes this ~30-100 ms
    one = np.broadcast_to(np.float32(1.0), (T, N))  # zero-stride, no memory
    flags = np.broadcast_to(False, (T, N))
    adv, ret = np.empty((T, N), np.float32), np.empty((T, N), np.float32)
    gae(one, one, one, flags, flags, 0.99, 0.95, out=(adv, ret))  # warm up / touch pages

    for _attempt in range(3):
        window = {}
        started = threading.Event()
        done = threading.Event()

        def worker():
            started.set()
            window["t0"] = time.perf_counter()
            gae(one, one, one, flags, flags, 0.99, 0.95, out=(adv, ret))
            window["t1"] = time.perf_counter()
            done.set()

        stamps = []
        th = threading.Thread(target=worker)
        th.start()
        started.wait()
        while not done.is_set():
            stamps.append(time.perf_counter())
        th.join()
        t0, t1 = window["t0"], window["t1"]
        q = (t1 - t0) / 4
        stamps = np.asarray(stamps)
        middle = int(np.count_nonzero((stamps > t0 + q) & (stamps < t1 - q)))
        if middle >= 10:
            break
    assert middle >= 10, f"counter thread made {middle} steps during a {1e3 * (t1 - t0):.1f} ms gae call"
    assert adv[0, 0] == pytest.approx(1.0 / (1 - 0.99 * 0.95) * 0.99, rel=1e-3)


def test_torch_tensors_as_inputs():
    """CleanRL keeps its buffers as torch tensors; CPU tensors are accepted."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(12)
    T, N = 9, 4
    r = torch.from_numpy(rng.standard_normal((T, N)).astype(np.float32))
    v = torch.from_numpy(rng.standard_normal((T, N)).astype(np.float32))
    d = torch.from_numpy((rng.random((T, N)) < 0.3).astype(np.float32))
    nv = v[-1].clone().reshape(1, -1)  # CleanRL's next_value shape
    nd = torch.zeros(N)
    adv, ret = gae_from_dones(r, v, d, nv, nd, 0.99, 0.95)
    want = cleanrl_loop(r.numpy(), v.numpy(), d.numpy(), nv.numpy(), nd.numpy(), 0.99, 0.95)
    assert adv.dtype == np.float32
    assert_matches(adv, want[0], np.float32)
    assert_matches(ret, want[1], np.float32)
