# How the doorbells wait: every machine-tuned number in one place (compile-time
# constants; times in nanoseconds unless the name says otherwise).
#
# Where they come from: the project's 2-core KVM virtual machine (AMD EPYC, no GPU),
# with the vector-env and real-loop benchmarks (`benchmarks/bench_vecenv.py`,
# `benchmarks/bench_loops.py`), the builds before and after a change interleaved
# (`benchmarks/ab_builds.py`); the commits named below hold each run's tables. On that
# machine a socket round trip costs ~25 us between busy processes and ~55 us after the
# receiver idled 1 ms: a halted virtual CPU takes ~40 us to wake, and a step pays that
# twice (parent -> workers, last worker -> parent). Spinning instead burns a core the
# caller's policy or another worker needs. The forecasts (forecast.pxd) trade these off;
# see docs/guide/engine-internals.md, "Waits". Another machine may want other numbers:
# change them here, and measure before and after.

cdef enum:
    # -- Fixed spins: with spin_us/main_spin_us unset, the first waits (nothing learned
    #    yet) spin this long, then sleep. Measured when they were the defaults (commit
    #    0adee83; CartPole-v1 and HalfCheetah-v5, 16 envs): 200/20 us beat 50/20, 20/20
    #    and 0/0, and spinning only while recent waits were short lost to all.
    FIRST_WORKER_SPIN_NS = 200000
    FIRST_MAIN_SPIN_NS = 20000

    # -- Naps towards a forecast (2026-12-01, commit a0f4f4b; Pong, a large observation and
    #    HalfCheetah x16 rose 1.0-1.2x against the fixed spins). A side naps until
    #    forecast - (how late naps return) - margin - WINDOW_DEVS x its usual error, then
    #    spins through a window of WINDOW_DEVS x the error past the forecast, clamped to
    #    [LO, HI]: the parent's forecast is of the workers' step, a worker's of the
    #    caller's gap between its reply and the next command (longer and less regular).
    MAIN_NAP_MARGIN_NS = 10000
    MAIN_WINDOW_LO_NS = 20000
    MAIN_WINDOW_HI_NS = 300000
    WORKER_NAP_MARGIN_NS = 20000
    WORKER_WINDOW_LO_NS = 100000
    WORKER_WINDOW_HI_NS = 1000000
    WINDOW_DEVS = 2
    MIN_NAP_NS = 40000  # a shorter nap costs more than it saves: spin instead
    # Waits forecast to end within this (forecast + WINDOW_DEVS x error) are spun through
    # from the start, no nap (2026-12-02, commit 2ec8fb8): a nap's wake-up came late often
    # enough that HalfCheetah x8 after a caller's 1 ms of work stepped 1.97x SyncVectorEnv
    # spinning against 1.63x napping, its whole iteration 1.31x against 1.17x (the spin
    # yields the core at every turn, so the caller runs first).
    SPIN_THROUGH_NS = 3000000
    NAP_LATE0_NS = 60000  # first guess of how late a nap returns (the parent's; a worker,
                          # with its timer slack set, starts from 0)
    NAP_LATE_MAX_NS = 500000  # a nap that returned later than this counts as this late
    TIMER_SLACK_NS = 1000  # a worker's timed naps end within ~1 us (Linux default: 50 us)

    # -- Forecasts (forecast.pxd; a0f4f4b): an exponential average over ~FORECAST_AVG_WAITS
    #    waits, with the mean absolute deviation as its usual error.
    FORECAST_AVG_WAITS = 8
    MAX_FORECAST_NS = 1000000000  # longer waits are not learned (plain sleep)
    # A wait above OUTLIER_FACTOR x the forecast + OUTLIER_NS (a learner's update) is an
    # outlier: it costs one window of spinning and teaches nothing, unless it happens
    # OUTLIERS_TO_RELEARN times in a row (the loop changed: start over from it).
    OUTLIER_FACTOR = 4
    OUTLIER_NS = 2000000
    OUTLIERS_TO_RELEARN = 3

    # -- Sleeping for good (2026-12-03, commit 9d84d32): a side asleep on its socket still
    #    looks at the flags every RECHECK_NS, so a wake-up that went missing costs 100 ms,
    #    not the run (twice, in benchmark runs, a trainer and its workers each sat waiting
    #    for the other; cause not found), and is counted (Engine.wait_counts' `lost`). A
    #    ring that arrives within LATE_RING_NS of the flag was in flight, not lost.
    #    Measured level with the build before (HalfCheetah x16, the trainer, the gap loop).
    RECHECK_NS = 100000000
    LATE_RING_NS = 10000000

    # -- Limits, not tuning: how long a peer that started a message may take to finish it
    #    (framing.pyx: one write per message, so its bytes come together), and how long a
    #    worker waits for the doorbell of a command whose payload came ahead of it.
    PARTIAL_MESSAGE_MS = 2000
    PAYLOAD_DOORBELL_MS = 5000
