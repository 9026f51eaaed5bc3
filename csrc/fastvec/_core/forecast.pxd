# Waits that learn the loop: when will the next message come? (Inline: both sides of the
# doorbells call these in their wait loops.)
#
# A side forecasts its next wait from the last ones: a worker, the parent's gap between
# its reply and the next command (the caller's policy, the other workers' step, a learner
# update); the parent, the workers' step time. It naps on its socket (flagged as sleeping,
# so an early message still wakes it) until shortly before the forecast, spins through a
# window around it, and only then sleeps for good. One forecast per side, so a learner's
# long pause is an outlier: it ends one window of spinning, it does not teach the side to
# wait long. How late a nap returns is learned too and taken off the next one. The
# numbers are in tuning.pxd.
from fastvec._core.tuning cimport (
    FORECAST_AVG_WAITS, MAX_FORECAST_NS, NAP_LATE0_NS, NAP_LATE_MAX_NS, OUTLIER_FACTOR, OUTLIER_NS,
    OUTLIERS_TO_RELEARN, SPIN_THROUGH_NS, WINDOW_DEVS,
)


cdef struct Forecast:
    long long expect    # expected wait, ns (0: nothing learned yet)
    long long dev       # its usual error (mean absolute deviation), ns
    long long late      # how late a nap returns, ns
    int outliers        # consecutive outliers seen


cdef inline void fc_init(Forecast *f) noexcept nogil:
    f.expect = 0
    f.dev = 0
    f.late = NAP_LATE0_NS
    f.outliers = 0


cdef inline void fc_observe(Forecast *f, long long waited) noexcept nogil:
    """Learn from one wait of ``waited`` ns."""
    if waited <= 0 or waited > MAX_FORECAST_NS:
        return
    cdef long long d
    if f.expect == 0:
        f.expect = waited
        return
    if waited > OUTLIER_FACTOR * f.expect + OUTLIER_NS:
        f.outliers += 1
        if f.outliers < OUTLIERS_TO_RELEARN:
            return
        f.expect = waited
        f.outliers = 0
        return
    f.outliers = 0
    d = waited - f.expect
    f.expect += d // FORECAST_AVG_WAITS
    f.dev += ((d if d >= 0 else -d) - f.dev) // FORECAST_AVG_WAITS


cdef inline void fc_nap_returned(Forecast *f, long long late) noexcept nogil:
    """A nap returned ``late`` ns after it was asked to."""
    if late < 0:
        late = 0
    elif late > NAP_LATE_MAX_NS:
        late = NAP_LATE_MAX_NS
    f.late += (late - f.late) // FORECAST_AVG_WAITS


cdef inline long long fc_window(Forecast *f, long long lo, long long hi) noexcept nogil:
    """How long past the forecast to keep spinning: its usual error, widened, within [lo, hi]."""
    cdef long long w = WINDOW_DEVS * f.dev
    return lo if w < lo else (hi if w > hi else w)


cdef inline bint fc_long(Forecast *f) noexcept nogil:
    """Whether the next wait is forecast past SPIN_THROUGH_NS (forecast + WINDOW_DEVS x
    its error): napped towards, not spun through from the start."""
    return f.expect + WINDOW_DEVS * f.dev > SPIN_THROUGH_NS


cdef inline long long fc_nap_end(Forecast *f, long long target, long long margin) noexcept nogil:
    """When a nap towards ``target`` should end: early by how late naps return, the
    margin and the widened error; 0 (no nap) for a short forecast, which is spun through."""
    if not fc_long(f):
        return 0
    return target - f.late - margin - WINDOW_DEVS * f.dev
