"""Statistics over many runs (seeds, a sweep's settings): the aggregate a paper reports.

Each run gives one score (its final mean return, or its curve's value at a given env
step); a group is the runs of one setting. For a group this module gives the mean, the
median and the interquartile mean (IQM: the mean of the middle 50% of the scores,
robust to an outlying seed yet less noisy than the median), each with a 95% bootstrap
confidence interval; between two groups, the probability that a run of one beats a run
of the other; and learning curves with a band per point. The definitions follow
Agarwal et al., "Deep RL at the Edge of the Statistical Precipice" (NeurIPS 2021, the
rliable library), for one task: the stratified bootstrap resamples runs within each
group.

The intervals are ``scipy.stats.bootstrap``'s percentile intervals (rliable's choice,
so the figures compare with published ones). Not BCa: with a handful of seeds and tied
scores (CartPole's 500 cap) its jackknife acceleration is undefined and it gives NaN.
With few runs a percentile interval is somewhat too narrow (it covers less than 95%):
report the number of runs beside it. Every bootstrap draws from
``numpy.random.default_rng(seed)``, so a report is the same each time it is made.

numpy and scipy only (no torch), so that a report needs no trainer.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

__all__ = [
    "CONFIDENCE",
    "RESAMPLES",
    "Curve",
    "Interval",
    "aggregate",
    "curves",
    "iqm",
    "probability_of_improvement",
    "value_at",
]

CONFIDENCE = 0.95  # the intervals' level
RESAMPLES = 10_000  # bootstrap resamples per interval


class Interval(NamedTuple):
    """A statistic's point estimate and its confidence interval ``[low, high]``."""

    point: float
    low: float
    high: float


class Curve(NamedTuple):
    """Runs' curves on a common grid: ``x`` (env steps or seconds), the IQM of the runs'
    values at each grid point and its interval (``low``, ``high``), all of one length."""

    x: np.ndarray
    point: np.ndarray
    low: np.ndarray
    high: np.ndarray


# ------------------------------------------------------------------ the statistics
def _iqm_along(x: np.ndarray, axis: int = -1) -> np.ndarray:
    from scipy.stats import trim_mean

    return trim_mean(np.asarray(x, dtype=np.float64), 0.25, axis=axis)


def _mean_along(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def _median_along(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(x, axis=axis)


def _improvement_along(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """P(X > Y) + P(X = Y) / 2 over every pair: the Mann-Whitney U of x over y, divided by
    the number of pairs (computed from the ranks of x in x and y together, ties averaged)."""
    from scipy.stats import rankdata

    x, y = np.moveaxis(x, axis, -1), np.moveaxis(y, axis, -1)
    n, m = x.shape[-1], y.shape[-1]
    ranks = rankdata(np.concatenate((x, y), axis=-1), axis=-1)
    u = ranks[..., :n].sum(axis=-1) - n * (n + 1) / 2
    return u / (n * m)


def iqm(scores: Sequence[float] | np.ndarray) -> float:
    """The interquartile mean of ``scores``: the mean of what is left once the lowest and
    the highest quarter are dropped (``n // 4`` whole scores at each end, as rliable's
    IQM and ``scipy.stats.trim_mean(scores, 0.25)`` count them, so that figures compare
    with published ones; one to three scores: their mean)."""
    return float(_iqm_along(_scores(scores)))


def aggregate(
    scores: Sequence[float] | np.ndarray,
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> dict[str, Interval]:
    """``{"mean", "median", "iqm"}`` of a group's ``scores`` (one per run), each an
    ``Interval``: the statistic and its percentile bootstrap interval at level
    ``confidence`` over ``resamples`` resamples of the runs, drawn from
    ``numpy.random.default_rng(seed)`` (the same resamples for the three statistics).
    At least 2 scores: with one run an interval is undefined."""
    x = _scores(scores)
    _check_bootstrap(confidence, resamples, seed, len(x))
    out = {}
    for name, stat in (("mean", _mean_along), ("median", _median_along), ("iqm", _iqm_along)):
        low, high = _bootstrap((x,), stat, confidence, resamples, seed)
        out[name] = Interval(float(stat(x)), float(low), float(high))
    return out


def probability_of_improvement(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Interval:
    """P(X > Y): the probability that a run of group ``x`` scores higher than a run of
    group ``y``, ties counted 1/2 (the Mann-Whitney U statistic over ``len(x) *
    len(y)``), with its percentile bootstrap interval (each group's runs resampled on
    their own: the stratified bootstrap). 0.5: neither is better; above 0.5 with the
    whole interval above it: x beats y."""
    a, b = _scores(x, "x"), _scores(y, "y")
    _check_bootstrap(confidence, resamples, seed, min(len(a), len(b)))
    low, high = _bootstrap((a, b), _improvement_along, confidence, resamples, seed)
    return Interval(float(_improvement_along(a, b)), float(low), float(high))


# ------------------------------------------------------------------ curves
def value_at(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, at: float) -> float:
    """A run's curve (``y`` against increasing ``x``) at ``at``, interpolated linearly
    between its points; never extrapolated: ``at`` outside ``[x[0], x[-1]]`` is a
    ValueError."""
    xs, ys = _series(x, y)
    if not xs[0] <= at <= xs[-1]:
        raise ValueError(f"{at:g} is outside the curve's range [{xs[0]:g}, {xs[-1]:g}]: it is not extrapolated")
    return float(np.interp(at, xs, ys))


def curves(
    series: Sequence[tuple[Sequence[float] | np.ndarray, Sequence[float] | np.ndarray]],
    *,
    points: int = 100,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Curve:
    """Runs' curves, each ``(x, y)`` with ``x`` increasing (env steps or wall seconds),
    on one grid of ``points`` evenly spaced values from the latest first ``x`` to the
    earliest last ``x`` of the runs, so that every run has a value at every grid point
    (interpolated linearly, never extrapolated past a run's end); at each point the IQM
    of the runs' values and its percentile bootstrap interval (the runs resampled, the
    same resamples at every point). At least 2 runs, whose ranges overlap."""
    if isinstance(points, bool) or not isinstance(points, (int, np.integer)) or points < 2:
        raise ValueError(f"points must be an integer >= 2, got {points!r}")
    runs = [_series(x, y) for x, y in series]
    _check_bootstrap(confidence, resamples, seed, len(runs))
    start, end = max(xs[0] for xs, _ in runs), min(xs[-1] for xs, _ in runs)
    if start >= end:
        raise ValueError(
            f"the runs' curves share no range (the latest start {start:g} is not before the earliest end {end:g})"
        )
    grid = np.linspace(start, end, points)
    values = np.stack([np.interp(grid, xs, ys) for xs, ys in runs], axis=-1)  # [points, runs]
    low, high = _bootstrap((values,), _iqm_along, confidence, resamples, seed)
    return Curve(grid, _iqm_along(values), np.asarray(low), np.asarray(high))


# ------------------------------------------------------------------ checks and the bootstrap
def _scores(scores, name: str = "scores") -> np.ndarray:
    try:
        x = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of numbers, got {type(scores).__name__}") from None
    if x.ndim != 1:
        raise ValueError(f"{name} must be one number per run (1-D), got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"{name} is empty: a group needs at least one run's score")
    bad = np.flatnonzero(~np.isfinite(x))
    if bad.size:
        raise ValueError(f"{name} hold NaN or inf at runs {bad.tolist()}: every run needs a finite score")
    return x


def _series(x, y) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xs.ndim != 1 or xs.shape != ys.shape or xs.size == 0:
        raise ValueError(f"a curve is two 1-D arrays of one non-zero length, got shapes {xs.shape} and {ys.shape}")
    if not (np.isfinite(xs).all() and np.isfinite(ys).all()):
        raise ValueError("a curve holds NaN or inf")
    if xs.size > 1 and not (np.diff(xs) > 0).all():
        raise ValueError("a curve's x must increase strictly")
    return xs, ys


def _check_bootstrap(confidence: float, resamples: int, seed: int, runs: int) -> None:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if isinstance(resamples, bool) or not isinstance(resamples, (int, np.integer)) or resamples < 1:
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if runs < 2:
        raise ValueError(f"an interval needs at least 2 runs, got {runs}: with one run it is undefined")


def _bootstrap(data: tuple, statistic, confidence: float, resamples: int, seed: int) -> tuple:
    """``scipy.stats.bootstrap``'s percentile interval, each sample resampled on its own
    along its last axis, from ``default_rng(seed)``; memory bounded by batches."""
    from scipy.stats import bootstrap

    rng = np.random.default_rng(seed)
    size = sum(math.prod(np.shape(d)) for d in data)
    batch = None if size * resamples <= 2**24 else max(1, 2**24 // size)
    key = "rng" if "rng" in inspect.signature(bootstrap).parameters else "random_state"  # (scipy < 1.15)
    res = bootstrap(
        data,
        statistic,
        n_resamples=resamples,
        batch=batch,
        vectorized=True,
        paired=False,
        axis=-1,
        confidence_level=confidence,
        method="percentile",
        **{key: rng},
    )
    return res.confidence_interval.low, res.confidence_interval.high
