"""fastvec.run_stats against hand-worked examples and independent computations: the IQM
(by hand, and scipy's trim_mean where n is a multiple of 4), the bootstrap intervals
(a brute-force loop over the same resamples), the probability of improvement (a
pairwise count), the intervals' coverage, and curves on a grid."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy.stats import trim_mean

from fastvec import run_stats
from fastvec.run_stats import Interval, aggregate, curves, iqm, probability_of_improvement, value_at


# ------------------------------------------------------------------ IQM
@pytest.mark.parametrize(
    "scores, expected",
    [
        ([1, 2, 3, 4], 2.5),  # the middle two
        ([4, 1, 3, 2], 2.5),  # order does not matter
        ([0, 1, 2, 4, 100], (1 + 2 + 4) / 3),  # 5 // 4 = 1 score dropped at each end
        ([5], 5.0),
        ([1, 3], 2.0),  # fewer than 4: nothing dropped
        ([1, 2, 3, 4, 5, 6], (2 + 3 + 4 + 5) / 4),
        ([-7, 10, 0, 0, 0, 0, 0, 1000], 0.0),
    ],
)
def test_iqm_hand_worked(scores, expected):
    assert iqm(scores) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("n", [4, 8, 12, 40])
def test_iqm_is_trim_mean_where_n_is_a_multiple_of_4(n):
    x = np.random.default_rng(n).standard_cauchy(n)
    assert iqm(x) == pytest.approx(trim_mean(x, 0.25), rel=1e-12)


def test_iqm_drops_a_quarter_at_each_end_for_any_n():
    """rliable's rule, computed here by hand: sort, drop ``n // 4`` at each end, average."""
    for n in range(1, 14):
        x = np.random.default_rng(n).normal(size=n)
        k = n // 4
        assert iqm(x) == pytest.approx(np.sort(x)[k : n - k].mean(), rel=1e-12), n


# ------------------------------------------------------------------ the bootstrap
def _brute_interval(samples, stat, resamples, seed, confidence=0.95):
    """Percentile interval by a loop: each sample resampled in turn from one generator
    (the order scipy.stats.bootstrap draws them in, one batch)."""
    rng = np.random.default_rng(seed)
    idx = [rng.integers(0, len(s), (resamples, len(s))) for s in samples]
    values = [stat(*(s[i[b]] for s, i in zip(samples, idx))) for b in range(resamples)]
    alpha = (1 - confidence) / 2
    return tuple(np.percentile(values, [100 * alpha, 100 * (1 - alpha)]))


def test_aggregate_against_a_brute_force_bootstrap():
    x = np.random.default_rng(3).gamma(2.0, 50.0, size=7)
    got = aggregate(x, resamples=2000, seed=11)
    assert set(got) == {"mean", "median", "iqm"}
    for name, stat in (("mean", np.mean), ("median", np.median), ("iqm", iqm)):
        assert isinstance(got[name], Interval)
        assert got[name].point == pytest.approx(stat(x), rel=1e-12)
        low, high = _brute_interval([x], stat, 2000, 11)
        assert got[name].low == pytest.approx(low, rel=1e-9), name
        assert got[name].high == pytest.approx(high, rel=1e-9), name
        assert got[name].low <= got[name].point <= got[name].high


def test_aggregate_is_reproducible_and_follows_its_seed():
    x = np.random.default_rng(0).normal(size=12)
    assert aggregate(x, resamples=500, seed=4) == aggregate(x, resamples=500, seed=4)
    assert aggregate(x, resamples=500, seed=4)["mean"] != aggregate(x, resamples=500, seed=5)["mean"]


def test_aggregate_of_tied_scores_is_a_point():
    got = aggregate([500.0, 500.0, 500.0])
    assert all(v == (500.0, 500.0, 500.0) for v in got.values())


def test_mean_interval_coverage():
    """A normal sample's 95% interval of the mean holds the true mean in about 95% of
    repetitions (a percentile interval of 30 runs covers a little less; loose bounds)."""
    rng = np.random.default_rng(0)
    hits = 0
    for k in range(200):
        x = rng.normal(10.0, 3.0, size=30)
        m = aggregate(x, resamples=1000, seed=k)["mean"]
        hits += m.low <= 10.0 <= m.high
    assert 0.85 * 200 <= hits <= 0.99 * 200, hits


# ------------------------------------------------------------------ probability of improvement
def _pairwise(x, y):
    return sum((a > b) + 0.5 * (a == b) for a, b in itertools.product(x, y)) / (len(x) * len(y))


@pytest.mark.parametrize(
    "x, y",
    [
        ([1, 2, 3], [0, 2, 5]),  # a tie
        ([500, 500, 480, 500], [500, 470, 500]),  # many ties (CartPole's cap)
        ([10, 11, 12], [1, 2, 3]),  # x always better
        (list(np.random.default_rng(1).normal(size=9)), list(np.random.default_rng(2).normal(0.5, size=6))),
    ],
)
def test_probability_of_improvement_against_a_pairwise_count(x, y):
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    got = probability_of_improvement(x, y, resamples=1500, seed=2)
    assert got.point == pytest.approx(_pairwise(x, y), rel=1e-12)
    low, high = _brute_interval([x, y], _pairwise, 1500, 2)
    assert (got.low, got.high) == pytest.approx((low, high), rel=1e-9)
    other = probability_of_improvement(y, x, resamples=1500, seed=2)
    assert got.point + other.point == pytest.approx(1.0)


def test_probability_of_improvement_hand_worked():
    # pairs (x > y): 1>0; 2>0, 2=2 (1/2); 3>0, 3>2: 1 + 1.5 + 2 = 4.5 of 9
    assert probability_of_improvement([1, 2, 3], [0, 2, 5]).point == pytest.approx(0.5)
    assert probability_of_improvement([10, 11], [1, 2, 3]) == (1.0, 1.0, 1.0)


# ------------------------------------------------------------------ curves
def test_value_at_interpolates_and_never_extrapolates():
    assert value_at([0, 10, 20], [0.0, 100.0, 300.0], 15) == pytest.approx(200.0)
    assert value_at([0, 10, 20], [0.0, 100.0, 300.0], 20) == pytest.approx(300.0)
    with pytest.raises(ValueError, match="outside the curve's range"):
        value_at([0, 10, 20], [0.0, 100.0, 300.0], 21)
    with pytest.raises(ValueError, match="outside the curve's range"):
        value_at([5, 10], [0.0, 1.0], 4)


def test_curves_on_a_common_grid():
    a = ([0, 10], [0.0, 10.0])
    b = ([2, 5, 20], [1.0, 2.0, 3.0])
    c = curves([a, b], points=5)
    # from the latest start (2) to the earliest end (10): b is not cut, a not extrapolated
    np.testing.assert_allclose(c.x, [2, 4, 6, 8, 10])
    va = np.array([2, 4, 6, 8, 10.0])
    vb = np.array([1.0, 1 + 2 / 3, 2 + 1 / 15, 2 + 3 / 15, 2 + 5 / 15])
    np.testing.assert_allclose(c.point, (va + vb) / 2)  # the IQM of two values: their mean
    # two runs: the resamples are (a, a), (a, b), (b, a), (b, b): each end is a run's value
    np.testing.assert_allclose(c.low, np.minimum(va, vb))
    np.testing.assert_allclose(c.high, np.maximum(va, vb))


def test_curves_band_matches_aggregate_at_each_point():
    rng = np.random.default_rng(5)
    runs = [(np.arange(0, 100, 10.0), np.cumsum(rng.normal(size=10))) for _ in range(6)]
    c = curves(runs, points=10, resamples=500, seed=3)
    for k, x in enumerate(c.x):
        values = [np.interp(x, xs, ys) for xs, ys in runs]
        low, high = _brute_interval([np.asarray(values)], iqm, 500, 3)
        assert c.point[k] == pytest.approx(iqm(values))
        assert (c.low[k], c.high[k]) == pytest.approx((low, high))


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: iqm([]), "scores is empty"),
        (lambda: aggregate([]), "scores is empty"),
        (lambda: aggregate([1.0, float("nan"), 2.0]), r"NaN or inf at runs \[1\]"),
        (lambda: iqm([1.0, float("inf")]), "NaN or inf"),
        (lambda: aggregate([3.0]), "at least 2 runs, got 1: with one run it is undefined"),
        (lambda: aggregate([[1.0, 2.0]]), "1-D"),
        (lambda: aggregate(["a", "b"]), "sequence of numbers"),
        (lambda: aggregate([1.0, 2.0], confidence=95), "confidence must be in"),
        (lambda: aggregate([1.0, 2.0], resamples=0), "resamples must be a positive integer"),
        (lambda: aggregate([1.0, 2.0], seed=-1), "seed must be a non-negative integer"),
        (lambda: probability_of_improvement([1.0, 2.0], [3.0]), "at least 2 runs, got 1"),
        (lambda: probability_of_improvement([], [3.0, 4.0]), "x is empty"),
        (lambda: curves([([0, 1], [0, 1])]), "at least 2 runs, got 1"),
        (lambda: curves([([0, 1], [0, 1]), ([2, 3], [0, 1])]), "share no range"),
        (lambda: curves([([0, 1], [0, 1]), ([0, 0], [0, 1])]), "increase strictly"),
        (lambda: curves([([0, 1], [0, 1]), ([0, 1], [0])]), "two 1-D arrays"),
        (lambda: curves([([0, 1], [0, 1]), ([0, 1], [0, 1])], points=1), "points must be"),
    ],
)
def test_bad_input_is_one_line(call, message):
    with pytest.raises(ValueError, match=message) as e:
        call()
    assert "\n" not in str(e.value)


def test_imports_without_torch(tmp_path):
    code = "import sys, fastvec.run_stats; assert 'torch' not in sys.modules, 'torch imported'"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, env=env)  # (not the source tree)


def test_constants():
    assert run_stats.CONFIDENCE == 0.95 and run_stats.RESAMPLES >= 2000
