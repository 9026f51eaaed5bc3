"""Tests for fastvec.vtrace (V-trace kernel beside GAE's + validating wrapper).

Every expected value comes from a float64 reference written here from the
definition in plain Python loops (one env, one step at a time), not from the
kernel: the backward recursion, the paper's n-step sum, and the per-decision
importance-weighted return.
"""

import math
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastvec
from fastvec import _gae
from fastvec.returns.gae_estimates import gae
from fastvec.returns.vtrace_targets import vtrace

FLOAT_DTYPES = [np.float32, np.float64]
INF = math.inf


# --------------------------------------------------------------------------- #
# references (float64, scalar loops)
# --------------------------------------------------------------------------- #
def ref_vtrace(r, v, nv, term, trunc, log_rhos, gamma, lam, rho_bar, c_bar, pg_rho_bar=None):
    """The backward recursion, as written in the definition:
    ``v_t - V_t = delta_t + gamma c_t (1 - done_t) (v_{t+1} - V_{t+1})`` and
    IMPALA's ``pg_rho_t (r_t + gamma v_{t+1} - V_t)``. Returns (pg advantages,
    targets)."""
    pg_rho_bar = rho_bar if pg_rho_bar is None else pg_rho_bar
    r, v, nv, lr = (np.asarray(a, np.float64) for a in (r, v, nv, log_rhos))
    term, trunc = np.asarray(term) != 0, np.asarray(trunc) != 0
    T, N = v.shape
    targets = np.zeros((T, N))
    adv = np.zeros((T, N))
    for n in range(N):
        for t in reversed(range(T)):
            w = math.exp(lr[t, n])
            rho, c, pg_rho = min(rho_bar, w), lam * min(c_bar, w), min(pg_rho_bar, w)
            boot = 0.0 if term[t, n] else nv[t, n]  # V(x_{t+1}), 0 after a termination
            delta = rho * (r[t, n] + gamma * boot - v[t, n])
            if term[t, n] or trunc[t, n] or t == T - 1:
                targets[t, n] = v[t, n] + delta
                q_next = boot
            else:
                targets[t, n] = v[t, n] + delta + gamma * c * (targets[t + 1, n] - v[t + 1, n])
                q_next = targets[t + 1, n]
            adv[t, n] = pg_rho * (r[t, n] + gamma * q_next - v[t, n])
    return adv, targets


def ref_nstep(r, v, nv, term, trunc, log_rhos, gamma, lam, rho_bar, c_bar):
    """Espeholt et al. 2018, eq. (1): v_s = V(x_s) + sum_{t>=s} gamma^(t-s)
    (prod_{i=s}^{t-1} c_i) delta_t, the sum cut at the end of the episode
    segment (a direct double loop; c_i includes lam)."""
    r, v, nv, lr = (np.asarray(a, np.float64) for a in (r, v, nv, log_rhos))
    term, trunc = np.asarray(term) != 0, np.asarray(trunc) != 0
    T, N = v.shape
    out = np.zeros((T, N))
    for n in range(N):
        for s in range(T):
            total, trace = v[s, n], 1.0
            for t in range(s, T):
                w = math.exp(lr[t, n])
                boot = 0.0 if term[t, n] else nv[t, n]
                total += gamma ** (t - s) * trace * min(rho_bar, w) * (r[t, n] + gamma * boot - v[t, n])
                if term[t, n] or trunc[t, n]:
                    break
                trace *= lam * min(c_bar, w)
            out[s, n] = total
    return out


def ref_pdis_return(r, term, trunc, log_rhos, gamma):
    """Per-decision importance sampling return, no value function:
    sum_{t>=s} gamma^(t-s) (prod_{i=s}^{t} w_i) r_t within the segment."""
    r, lr = np.asarray(r, np.float64), np.asarray(log_rhos, np.float64)
    term, trunc = np.asarray(term) != 0, np.asarray(trunc) != 0
    T, N = r.shape
    out = np.zeros((T, N))
    for n in range(N):
        for s in range(T):
            total, weight = 0.0, 1.0
            for t in range(s, T):
                weight *= math.exp(lr[t, n])
                total += gamma ** (t - s) * weight * r[t, n]
                if term[t, n] or trunc[t, n]:
                    break
            out[s, n] = total
    return out


def make(T, N, dtype=np.float64, p_term=0.1, p_trunc=0.1, seed=0, rho_scale=0.5, chained=False):
    """A random rollout. ``chained``: next_values[t] = values[t + 1] inside an
    episode (as a collector records it), an independent draw at episode ends
    and at t = T-1."""
    rng = np.random.default_rng(seed)
    r = rng.standard_normal((T, N)).astype(dtype)
    v = rng.standard_normal((T, N)).astype(dtype)
    nv = rng.standard_normal((T, N)).astype(dtype)
    term = rng.random((T, N)) < p_term
    trunc = rng.random((T, N)) < p_trunc
    lr = (rho_scale * rng.standard_normal((T, N))).astype(dtype)
    if chained:
        inside = ~(term | trunc)
        inside[-1] = False
        nv[:-1][inside[:-1]] = v[1:][inside[:-1]]
    return r, v, nv, term, trunc, lr


def assert_matches(got, want, dtype):
    got = np.asarray(got)
    assert got.dtype == np.dtype(dtype)
    if np.dtype(dtype) == np.float64:
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)
    else:
        scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-4, atol=1e-4 * scale)


coef = st.one_of(st.sampled_from([0.0, 1.0, 0.99, 0.95]), st.floats(0.0, 1.0))
clip = st.one_of(st.sampled_from([1.0, INF, 0.5, 2.0]), st.floats(0.05, 5.0))


# --------------------------------------------------------------------------- #
# (1) the kernel against the recursion
# --------------------------------------------------------------------------- #
@settings(max_examples=120, deadline=None)
@given(
    T=st.integers(1, 30),
    N=st.integers(1, 11),
    dtype=st.sampled_from(FLOAT_DTYPES),
    p_term=st.sampled_from([0.0, 0.1, 0.3, 1.0]),
    p_trunc=st.sampled_from([0.0, 0.1, 0.3, 1.0]),
    gamma=coef,
    lam=coef,
    rho_bar=clip,
    c_bar=clip,
    pg_rho_bar=st.one_of(st.none(), clip),
    seed=st.integers(0, 2**32 - 1),
)
def test_vtrace_matches_reference(T, N, dtype, p_term, p_trunc, gamma, lam, rho_bar, c_bar, pg_rho_bar, seed):
    r, v, nv, term, trunc, lr = make(T, N, dtype, p_term, p_trunc, seed)
    want_adv, want_tgt = ref_vtrace(r, v, nv, term, trunc, lr, gamma, lam, rho_bar, c_bar, pg_rho_bar)
    adv, tgt = vtrace(r, v, nv, term, trunc, lr, gamma, lam, rho_bar, c_bar, pg_rho_bar=pg_rho_bar)
    assert adv.shape == tgt.shape == (T, N)
    assert_matches(tgt, want_tgt, dtype)
    assert_matches(adv, want_adv, dtype)
    # advantages="gae" is the carried correction, targets - values
    adv_g, tgt_g = vtrace(r, v, nv, term, trunc, lr, gamma, lam, rho_bar, c_bar, advantages="gae")
    np.testing.assert_array_equal(tgt_g, tgt)
    assert_matches(adv_g, want_tgt - v.astype(np.float64), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_episode_ends_inside_and_at_the_last_step(dtype):
    """Hand-placed flags: a termination and a truncation mid-rollout, both at
    t = T-1, and both at once (termination wins)."""
    T, N = 9, 5
    r, v, nv, _, _, lr = make(T, N, dtype, seed=1, rho_scale=1.0)
    term = np.zeros((T, N), bool)
    trunc = np.zeros((T, N), bool)
    term[3, 0] = trunc[5, 1] = True
    term[T - 1, 2] = True
    trunc[T - 1, 3] = True
    term[4, 4] = trunc[4, 4] = True
    for kw in ({}, {"rho_bar": 1.5, "c_bar": 0.8}, {"rho_bar": INF, "c_bar": INF}):
        want = ref_vtrace(r, v, nv, term, trunc, lr, 0.9, 0.8, kw.get("rho_bar", 1.0), kw.get("c_bar", 1.0))
        got = vtrace(r, v, nv, term, trunc, lr, 0.9, 0.8, **kw)
        assert_matches(got[0], want[0], dtype)
        assert_matches(got[1], want[1], dtype)
    # at a truncation the target is one TD step bootstrapped from next_values, nothing
    # carried; at a termination, no bootstrap either
    rho = np.minimum(1.0, np.exp(lr.astype(np.float64)))
    r64, v64, nv64 = (x.astype(np.float64) for x in (r, v, nv))
    _, tgt = vtrace(r, v, nv, term, trunc, lr, 0.9, 0.8)
    assert tgt[5, 1] == pytest.approx(v64[5, 1] + rho[5, 1] * (r64[5, 1] + 0.9 * nv64[5, 1] - v64[5, 1]), rel=1e-5)
    assert tgt[3, 0] == pytest.approx(v64[3, 0] + rho[3, 0] * (r64[3, 0] - v64[3, 0]), rel=1e-5)
    assert tgt[4, 4] == pytest.approx(v64[4, 4] + rho[4, 4] * (r64[4, 4] - v64[4, 4]), rel=1e-5)


# --------------------------------------------------------------------------- #
# (2) on-policy: GAE
# --------------------------------------------------------------------------- #
@settings(max_examples=60, deadline=None)
@given(
    T=st.integers(1, 30),
    N=st.integers(1, 9),
    dtype=st.sampled_from(FLOAT_DTYPES),
    p_end=st.sampled_from([0.0, 0.1, 0.5]),
    gamma=coef,
    lam=coef,
    rho_bar=st.one_of(st.sampled_from([1.0, INF]), st.floats(1.0, 10.0)),
    c_bar=st.one_of(st.sampled_from([1.0, INF]), st.floats(1.0, 10.0)),
    seed=st.integers(0, 2**32 - 1),
)
def test_on_policy_reduces_to_gae(T, N, dtype, p_end, gamma, lam, rho_bar, c_bar, seed):
    r, v, nv, term, trunc, _ = make(T, N, dtype, p_end, p_end, seed, chained=True)
    zero = np.zeros((T, N), dtype)
    gae_adv, gae_ret = gae(r, v, nv, term, trunc, gamma, lam)
    tight = {"rtol": 1e-12, "atol": 1e-12} if dtype == np.float64 else {"rtol": 2e-6, "atol": 2e-6}
    # value targets = GAE's returns; advantages="gae" = GAE's advantages, any lam
    adv_g, tgt = vtrace(r, v, nv, term, trunc, zero, gamma, lam, rho_bar, c_bar, advantages="gae")
    np.testing.assert_allclose(tgt, gae_ret, **tight)
    np.testing.assert_allclose(adv_g, gae_adv, **tight)
    # IMPALA's advantage: delta_t + gamma * A_gae[t+1] inside an episode, delta_t at its end...
    adv, _ = vtrace(r, v, nv, term, trunc, zero, gamma, lam, rho_bar, c_bar)
    r64, v64, nv64 = (x.astype(np.float64) for x in (r, v, nv))
    delta = r64 + gamma * np.where(term, 0.0, nv64) - v64
    carried = np.zeros((T, N))
    carried[:-1] = np.where((term | trunc)[:-1], 0.0, gamma * gae_adv[1:].astype(np.float64))
    assert_matches(adv, delta + carried, dtype)
    # ... so GAE's advantages exactly when lam = 1
    gae_adv1, _ = gae(r, v, nv, term, trunc, gamma, 1.0)
    adv1, _ = vtrace(r, v, nv, term, trunc, zero, gamma, 1.0, rho_bar, c_bar)
    assert_matches(adv1, gae_adv1.astype(np.float64), dtype)


# --------------------------------------------------------------------------- #
# (3) lam = 1: the paper's n-step definition; (4) infinite clips
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("lam", [1.0, 0.7])
@pytest.mark.parametrize("clips", [(1.0, 1.0), (2.0, 0.5), (0.7, 1.3), (INF, INF)])
def test_nstep_definition(dtype, lam, clips):
    r, v, nv, term, trunc, lr = make(24, 6, dtype, 0.08, 0.08, seed=2, rho_scale=0.8)
    want = ref_nstep(r, v, nv, term, trunc, lr, 0.97, lam, *clips)
    _, tgt = vtrace(r, v, nv, term, trunc, lr, 0.97, lam, *clips)
    assert_matches(tgt, want, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_infinite_clips_give_importance_weighted_returns(dtype):
    r, v, nv, term, trunc, lr = make(20, 7, dtype, 0.1, 0.1, seed=3, rho_scale=0.6)
    zero = np.zeros_like(v)
    # no value function: the per-decision importance-sampling return (truncation
    # bootstraps from next_values = 0 here, so it is a plain cut too)
    _, tgt = vtrace(r, zero, zero, term, trunc, lr, 0.95, 1.0, INF, INF)
    assert_matches(tgt, ref_pdis_return(r, term, trunc, lr, 0.95), dtype)
    # with values: unclipped ratios in the recursion, none of them cut at 1
    assert (np.exp(lr) > 1).any()
    want = ref_vtrace(r, v, nv, term, trunc, lr, 0.95, 0.9, INF, INF)
    got = vtrace(r, v, nv, term, trunc, lr, 0.95, 0.9, rho_bar=INF, c_bar=INF)
    assert_matches(got[0], want[0], dtype)
    assert_matches(got[1], want[1], dtype)
    clipped = vtrace(r, v, nv, term, trunc, lr, 0.95, 0.9)
    assert not np.allclose(clipped[1], got[1])


# --------------------------------------------------------------------------- #
# edge cases, NaN / inf, layouts, out=
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("shape", [(0, 4), (5, 0), (0, 0)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_empty(shape, dtype):
    z = np.zeros(shape, dtype)
    f = np.zeros(shape, bool)
    adv, tgt = vtrace(z, z, z, f, f, z, 0.9)
    assert adv.shape == tgt.shape == shape and adv.dtype == tgt.dtype == dtype


def test_nothing_crosses_an_episode_end():
    """Where terminated, next_values is never read; an inf ratio or a NaN in the
    next episode does not reach back across a termination or truncation."""
    r, v, nv, term, trunc, lr = make(16, 5, p_term=0.3, p_trunc=0.2, seed=4)
    want = vtrace(r, v, nv, term, trunc, lr, 0.99, 0.95, 1.0, INF)
    got = vtrace(r, v, np.where(term, np.nan, nv), term, trunc, lr, 0.99, 0.95, 1.0, INF)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    # an overflowing ratio at an episode end: rho is clipped, c (infinite clip) is inf
    # but multiplies nothing there
    ends = term | trunc
    got = vtrace(r, v, nv, term, trunc, np.where(ends, 1e4, lr), 0.99, 0.95, 1.0, INF)
    assert np.isfinite(got[1]).all()
    # a NaN in values at (9, n) poisons that step and the earlier steps of its segment only
    T, N = 12, 2
    r, v, nv, term, trunc, lr = make(T, N, p_term=0.0, p_trunc=0.0, seed=5)
    term[4, 0] = True
    v[9] = np.nan
    adv, tgt = vtrace(r, v, nv, term, trunc, lr, 0.9, 0.9)
    assert np.isnan(tgt[5:10, 0]).all() and np.isfinite(tgt[:5, 0]).all() and np.isfinite(tgt[10:, 0]).all()
    assert np.isnan(tgt[:10, 1]).all() and np.isnan(adv[:10, 1]).all()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_layouts_and_out(dtype):
    r, v, nv, term, trunc, lr = make(13, 6, dtype, 0.2, 0.2, seed=6, rho_scale=1.0)
    want = vtrace(r, v, nv, term, trunc, lr, 0.99, 0.9, 1.2, 0.9)
    flipped = [np.ascontiguousarray(x.T).T for x in (r, v, nv, term, trunc, lr)]
    big = np.zeros((26, 6), dtype)
    big[::2] = lr
    flipped[5] = big[::2]  # row-strided, read in place
    got = vtrace(*flipped, 0.99, 0.9, 1.2, 0.9)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    a, b = np.empty_like(v), np.zeros((6, 13), dtype).T  # b through a temporary
    got = vtrace(r, v, nv, term, trunc, lr, 0.99, 0.9, 1.2, 0.9, out=(a, b))
    assert got[0] is a and got[1] is b
    np.testing.assert_array_equal(a, want[0])
    np.testing.assert_array_equal(b, want[1])
    # broadcast (zero-stride) ratios
    got = vtrace(r, v, nv, term, trunc, np.broadcast_to(dtype(0.3), r.shape), 0.99, 0.9)
    want = ref_vtrace(r, v, nv, term, trunc, np.full(r.shape, dtype(0.3)), 0.99, 0.9, 1.0, 1.0)
    assert_matches(got[1], want[1], dtype)


def test_dtype_follows_values():
    r, v, nv, term, trunc, lr = make(8, 3, seed=7)
    v32 = v.astype(np.float32)
    adv, tgt = vtrace(r, v32, nv, term, trunc, lr, 0.99)  # float64 rewards, next_values, log_rhos
    assert adv.dtype == tgt.dtype == np.float32
    want = vtrace(*(x.astype(np.float32) for x in (r, v, nv)), term, trunc, lr.astype(np.float32), 0.99)
    np.testing.assert_array_equal(tgt, want[1])


def test_exported_and_light(tmp_path):
    assert fastvec.vtrace is vtrace
    code = "import sys, fastvec; fastvec.vtrace; print('torch' in sys.modules)"
    # cwd outside the source tree: `python -c` puts it first on sys.path (CI tests the installed package)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- #
# (5) bad input
# --------------------------------------------------------------------------- #
NAMES = ["rewards", "values", "next_values", "terminated", "truncated", "log_rhos"]


def good_args(T=6, N=3):
    return [*make(T, N), 0.99, 0.95]


@pytest.mark.parametrize("i", range(6))
@pytest.mark.parametrize("bad", ["one_d", "three_d", "wrong_T", "wrong_N", "none", "string", "complex", "ragged"])
def test_bad_array_names_it(i, bad):
    args = good_args()
    x = args[i]
    args[i] = {
        "one_d": lambda: x[:, 0],
        "three_d": lambda: x[None],
        "wrong_T": lambda: x[:-1],
        "wrong_N": lambda: x[:, :-1],
        "none": lambda: None,
        "string": lambda: "abc",
        "complex": lambda: x.astype(np.complex128),
        "ragged": lambda: [[1.0, 2.0], [3.0]],
    }[bad]()
    name_re = "values|rewards" if (bad in ("wrong_T", "wrong_N") and i == 1) else NAMES[i]
    with pytest.raises(ValueError, match=name_re) as err:
        vtrace(*args)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("bad", [np.int64, np.float16, np.bool_])
def test_values_dtype(bad):
    args = good_args()
    args[1] = args[1].astype(bad)
    with pytest.raises(ValueError, match="values must be float32 or float64"):
        vtrace(*args)


@pytest.mark.parametrize(
    "name,bad",
    [
        *[("gamma", b) for b in (-0.1, 1.5, math.nan, INF, "0.9", None, True, [0.9])],
        *[("lam", b) for b in (-0.1, 1.0000001, math.nan, -INF, np.array([0.5]))],
        *[(k, b) for k in ("rho_bar", "c_bar", "pg_rho_bar") for b in (0.0, -1.0, math.nan, -INF, "1", None, True)],
    ],
)
def test_bad_scalars_name_it(name, bad):
    r, v, nv, term, trunc, lr = make(6, 3)
    kw = {"gamma": 0.99, "lam": 0.95, "rho_bar": 1.0, "c_bar": 1.0}
    kw[name] = bad
    if name == "pg_rho_bar" and bad is None:
        vtrace(r, v, nv, term, trunc, lr, **kw)  # None: the default, rho_bar
        return
    with pytest.raises(ValueError, match=name):
        vtrace(r, v, nv, term, trunc, lr, **kw)


def test_good_scalar_types():
    args = good_args()
    want = vtrace(*args, 2.0, 0.5)
    for k in (np.float32(2.0), np.float64(2.0), np.array(2.0), 2):
        np.testing.assert_array_equal(vtrace(*args, k, 0.5)[1], want[1])
    vtrace(*args, INF, INF, pg_rho_bar=INF)


def test_bad_mode_and_out():
    args = good_args()
    for mode in ("impala", None, 1):
        with pytest.raises(ValueError, match="advantages must be 'vtrace' or 'gae'"):
            vtrace(*args, advantages=mode)
    with pytest.raises(ValueError, match="pg_rho_bar only applies"):
        vtrace(*args, pg_rho_bar=2.0, advantages="gae")
    ok = np.empty((6, 3))
    for out, msg in [
        ((ok, np.empty((3, 6))), r"out\[1\] \(value targets\) must have shape"),
        ((np.empty((6, 3), np.float32), ok), r"out\[0\] \(advantages\) must have dtype"),
        (ok, r"out must be a tuple \(adv_out, targets_out\)"),
        ((ok, ok), "overlap"),
        ((ok, args[5]), "overlaps the input log_rhos"),
    ]:
        with pytest.raises(ValueError, match=msg):
            vtrace(*args, out=out)


def test_kernel_checks_shapes_itself():
    r, v, nv, term, trunc, lr = make(6, 3)
    t8, u8 = term.view(np.uint8), trunc.view(np.uint8)
    a, b = np.empty((6, 3)), np.empty((6, 3))
    k = (0.9, 0.9, 1.0, 1.0, 1.0, False)
    with pytest.raises(ValueError, match="log_rhos"):
        _gae.vtrace_kernel(r, v, nv, t8, u8, lr[:5], *k, a, b)
    with pytest.raises(ValueError, match="unit-stride"):
        _gae.vtrace_kernel(r, v, nv, t8, u8, np.asfortranarray(lr), *k, a, b)
    with pytest.raises(ValueError, match="overlap"):
        _gae.vtrace_kernel(r, v, nv, t8, u8, lr, *k, a, np.lib.stride_tricks.as_strided(b, (6, 3), (0, 8)))


# --------------------------------------------------------------------------- #
# (6) GIL
# --------------------------------------------------------------------------- #
def test_kernel_releases_gil():
    """As for gae: a counting thread keeps running in the middle of the call."""
    T, N = 4_000_000, 1
    one = np.broadcast_to(np.float32(1.0), (T, N))
    zero = np.broadcast_to(np.float32(0.0), (T, N))
    flags = np.broadcast_to(False, (T, N))
    adv, tgt = np.empty((T, N), np.float32), np.empty((T, N), np.float32)

    def call():
        vtrace(one, one, one, flags, flags, zero, 0.99, 0.95, advantages="gae", out=(adv, tgt))

    call()  # warm up / touch pages
    for _attempt in range(3):
        window = {}
        started, done = threading.Event(), threading.Event()

        def worker():
            started.set()
            window["t0"] = time.perf_counter()
            call()
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
        stamps_a = np.asarray(stamps)
        middle = int(np.count_nonzero((stamps_a > t0 + q) & (stamps_a < t1 - q)))
        if middle >= 10:
            break
    assert middle >= 10, f"counter thread made {middle} steps during a {1e3 * (t1 - t0):.1f} ms vtrace call"
    assert adv[0, 0] == pytest.approx(1.0 / (1 - 0.99 * 0.95) * 0.99, rel=1e-3)
