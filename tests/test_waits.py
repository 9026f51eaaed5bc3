"""Waits that learn the loop: whatever the caller does between steps (nothing, a policy,
a learner's long pause, other commands), results stay those of the serial reference,
and each side's forecast follows what it measured.

No speed is asserted here (that is ``benchmarks/bench_loops.py``); what is asserted is
that napping, spinning and sleeping in any order lose no command and no reply, and
(counted, not timed: ``Engine.wait_counts``) which of them each side chose.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest
from envs import FlatInfoEnv, RandomEndEnv
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import assert_same

import fastvec
from fastvec.engine import Engine
from fastvec.options import EngineOptions


def busy(seconds: float) -> None:
    """A caller computing (on its core) for ``seconds``."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# Gaps in seconds between steps: back to back, a policy's worth, long ones, one learner
# pause, and gaps that change abruptly (so forecasts are wrong in both directions).
SCHEDULE = [0.0] * 25 + [0.002] * 25 + [0.0, 0.004, 0.0001, 0.001, 0.0] * 6 + [0.3] + [0.0005] * 20 + [0.01, 0.0] * 5


class SlowStepEnv(gym.Env):
    """CartPole that takes ``delay`` seconds of wall time per step (sleeping)."""

    def __init__(self, delay: float = 0.003):
        self.inner = gym.make("CartPole-v1")
        self.observation_space = self.inner.observation_space
        self.action_space = self.inner.action_space
        self.delay = delay

    def reset(self, *, seed=None, options=None):
        return self.inner.reset(seed=seed, options=options)

    def step(self, action):
        time.sleep(self.delay)
        return self.inner.step(action)


@pytest.mark.parametrize("maker", [RandomEndEnv, FlatInfoEnv], ids=["random_end", "flat_info"])
def test_irregular_gaps_match_sync(maker):
    fns = [maker for _ in range(4)]
    ref = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.NEXT_STEP)
    env = fastvec.AsyncVectorEnv(fns, num_workers=2)
    try:
        assert env.engine.spin_us is None and env.engine.main_spin_us is None  # learned waits
        assert_same(env.reset(seed=3)[0], ref.reset(seed=3)[0], "reset obs")
        ref.action_space.seed(4)
        for t, gap in enumerate(SCHEDULE):
            busy(gap) if gap < 0.05 else time.sleep(gap)  # the long pause sleeps, like a learner on a GPU
            actions = ref.action_space.sample()
            got, want = env.step(actions), ref.step(actions)
            for k, name in enumerate(("obs", "rewards", "terminated", "truncated", "infos")):
                assert_same(got[k], want[k], f"step {t} (after {gap * 1e3:g} ms) {name}")
            if t % 37 == 36:  # other commands between steps: they must not confuse the forecasts
                assert env.get_attr("spec") == ref.get_attr("spec")
            if t == 80:
                assert_same(env.reset(seed=9)[0], ref.reset(seed=9)[0], "reset obs mid-run")
        assert env.engine._ctl.forecast_us > 0
    finally:
        env.close()
        ref.close()


def test_sb3_door_after_gaps_matches_a_replay():
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv

    fns = [RandomEndEnv for _ in range(4)]
    ref = DummyVecEnv(fns)
    env = fastvec.SubprocVecEnv(fns, num_workers=2)
    try:
        ref.seed(5)
        env.seed(5)
        assert_same(env.reset(), ref.reset(), "reset obs")
        rng = np.random.default_rng(0)
        for t, gap in enumerate(SCHEDULE[::2]):
            busy(gap) if gap < 0.05 else time.sleep(gap)
            actions = rng.integers(0, 2, size=4)
            got, want = env.step(actions), ref.step(actions)
            for k, name in enumerate(("obs", "rewards", "dones")):
                assert_same(got[k], want[k], f"step {t} {name}", check_dtype=False)
            assert [i.get("TimeLimit.truncated") for i in got[3]] == [i.get("TimeLimit.truncated") for i in want[3]]
    finally:
        env.close()
        ref.close()


def test_parent_forecast_follows_the_workers_step_time():
    # Each worker steps 2 envs of 3 ms: the step takes ~6 ms of wall time.
    with Engine([SlowStepEnv] * 4, EngineOptions(autoreset_mode="next_step"), num_workers=2) as eng:
        eng.reset(0, {i: {"seed": i} for i in range(4)})
        for k in range(30):
            eng.step(np.zeros(4, dtype=np.int64), k % 2)
        forecast = eng._ctl.forecast_us
        assert 5000 <= forecast <= 100_000, f"forecast {forecast:.0f} us for a ~6 ms step"


def test_fixed_spins_learn_nothing():
    opts = EngineOptions(spin_us=50.0, main_spin_us=10.0)
    with Engine([SlowStepEnv] * 2, opts, num_workers=2) as eng:
        assert eng.spin_us == 50.0 and eng.main_spin_us == 10.0
        eng.reset(0, {i: {"seed": i} for i in range(2)})
        for k in range(10):
            eng.step(np.zeros(2, dtype=np.int64), k % 2)
        assert eng._ctl.forecast_us == 0.0


@pytest.mark.parametrize("delay", [0.001, 0.005], ids=["spun_through", "napped"])
def test_step_timeout_still_holds_while_spinning_or_napping(delay):
    # The forecast says ~1 ms (spun through) or ~5 ms (napped: over SPIN_THROUGH_NS); then
    # one step takes 20 s: neither the spin nor the nap may outlast step_timeout (0.5 s).
    class Stalls(SlowStepEnv):
        def __init__(self):
            super().__init__(delay)
            self.n = 0

        def step(self, action):
            self.n += 1
            if self.n == 25:
                time.sleep(20.0)  # killed by close() long before
            return super().step(action)

    with Engine([Stalls] * 2, EngineOptions(step_timeout=0.5, context="fork"), num_workers=2) as eng:
        eng.reset(0, {i: {"seed": i} for i in range(2)})
        for k in range(24):
            eng.step(np.zeros(2, dtype=np.int64), k % 2)
        t0 = time.perf_counter()
        with pytest.raises(fastvec.WorkerError, match="did not answer"):
            eng.step(np.zeros(2, dtype=np.int64), 0)
        # generous (10 times step_timeout, for a loaded host): a wait that outlasted the
        # timeout would have had the env's answer after 20 s and raised nothing
        assert time.perf_counter() - t0 < 5.0


def _count_waits(eng, steps: int, gap: float = 0.0, warm_up: int = 30) -> dict:
    """Step ``eng`` ``warm_up`` then ``steps`` times (the caller busy for ``gap`` s before
    each, or asleep when the gap is a learner's); what the waits of the last ``steps``
    did, from ``Engine.wait_counts``: ``{"parent": (naps, sleeps, long), 0: ..., 1: ...}``."""
    actions = np.zeros(eng.num_envs, dtype=np.int64)

    def run(n):
        for t in range(n):
            if gap:
                busy(gap) if gap < 0.005 else time.sleep(gap)
            eng.step(actions, t % 2)

    def flat(c):
        keys = ("naps", "sleeps", "long")
        return {
            "parent": tuple(c["parent"][k] for k in keys),
            **{w: tuple(c["workers"][w][k] for k in keys) for w in range(eng.num_workers)},
        }

    run(warm_up)
    before = flat(eng.wait_counts())
    run(steps)
    counts = eng.wait_counts()
    after = flat(counts)
    # every sleep was ended by its doorbell, none by the periodic look at the flags
    assert [counts["parent"]["lost"]] + [w["lost"] for w in counts["workers"]] == [0] * (1 + eng.num_workers), counts
    return {k: tuple(a - b for a, b in zip(after[k], before[k])) for k in after}


def _cartpoles(**options) -> Engine:
    eng = Engine(
        [lambda: gym.make("CartPole-v1")] * 4, EngineOptions(autoreset_mode="next_step", **options), num_workers=2
    )
    eng.reset(0, {i: {"seed": i} for i in range(4)})
    return eng


def _slow(**options) -> Engine:
    """Two workers of two envs that sleep 3 ms a step: a step takes >= 6 ms on any host."""
    eng = Engine([SlowStepEnv] * 4, EngineOptions(autoreset_mode="next_step", **options), num_workers=2)
    eng.reset(0, {i: {"seed": i} for i in range(4)})
    return eng


def test_the_forecast_rule_on_known_waits():
    """The rule each side decides by (forecast.pxd), fed waits of known length: a wait
    forecast to end within the spin-through (the forecast plus WINDOW_DEVS times its
    error) is spun through from the start, a longer one is napped towards. Back to back,
    a small policy's gaps and a fast step are short; 20 ms gaps and a 6 ms step are long;
    one learner's pause amid short waits teaches nothing, three in a row are relearned."""
    from fastvec._core.controller import FORECAST_RULE, forecast_of

    us, ms = 1000, 1_000_000
    through, devs = FORECAST_RULE["spin_through_ns"], FORECAST_RULE["window_devs"]
    rng = np.random.default_rng(0)

    def waits(mean_ns, n, spread=0.3):
        return [int(w) for w in rng.uniform(1 - spread, 1 + spread, n) * mean_ns]

    def long_after(ws):
        expect, dev, long = forecast_of(ws)
        assert long == (expect + devs * dev > through), (expect, dev, long)  # the rule, as documented
        return long

    back_to_back, policy = waits(50 * us, 300), waits(200 * us, 100)
    assert not long_after(back_to_back) and not long_after(back_to_back + policy)
    assert forecast_of(back_to_back)[0] < 100 * us
    # a 20 ms learner after short waits: two are outliers (still spun through), the third relearns
    short = back_to_back + policy
    assert [long_after(short + [20 * ms] * k) for k in (1, 2, 3)] == [False, False, True]
    assert long_after(short + waits(20 * ms, 40, 0.1)) and long_after(waits(6 * ms, 30, 0.1))
    # one pause of 300 ms amid 0.5 ms waits: an outlier, the forecast stays short
    half = waits(500 * us, 30)
    expect, _dev, long = forecast_of(half + [300 * ms] + half)
    assert not long and expect < 1 * ms
    # the boundary: steady waits (no error) of exactly the spin-through are spun, 1 ns more napped
    assert not long_after([through] * 20) and long_after([through + 1] * 20)
    # the error counts: waits of 1 and 3 ms in turn average 2 ms, but 2 ms +- 1 ms x 2 is long
    expect, dev, long = forecast_of([1 * ms, 3 * ms] * 40)
    assert long and expect < through and 1.5 * ms < expect < 2.5 * ms and dev > 0.5 * ms, (expect, dev)
    assert forecast_of([]) == (0, 0, False)  # nothing learned: the fixed first spin, no forecast


def test_short_waits_are_spun_long_ones_napped():
    # What each side chose, counted (not timed), against what it forecast: a side naps
    # only on a wait it forecast long (``long``: past the spin-through); gaps and steps
    # that are long whatever the load (20 ms asleep; 2 envs sleeping 3 ms) are forecast
    # long and napped; with no spin nothing is forecast and nobody naps. Which waits a
    # loaded host makes long is the host's doing: which waits of known length the rule
    # spins through is test_the_forecast_rule_on_known_waits'.
    with _cartpoles() as eng:
        for gap, steps in ((0.0, 300), (0.0002, 100)):  # back to back; a small policy
            c = _count_waits(eng, steps, gap)
            assert all(naps <= long for naps, _sleeps, long in c.values()), c
        # a 20 ms learner between steps: each worker forecasts the gap long (relearned
        # after three) and naps through it (a worker that finds the command already
        # there at its first look has nothing to forecast); the parent naps only on the
        # workers' step, if the host makes that long
        c = _count_waits(eng, 40, 0.02, warm_up=10)
        assert c["parent"][0] <= c["parent"][2], c
        assert all(c[w][2] >= 30 and 0 < c[w][0] <= c[w][2] for w in (0, 1)), c
        with pytest.raises(fastvec.ClosedError):
            eng.close()
            eng.wait_counts()

    # No spin: no forecast, so no nap, whatever the load, and a side sleeps whenever
    # what it waits for is not in at its first look. Workers taking >= 6 ms per step
    # (2 envs sleeping 3 ms) and 5 ms gaps make every side wait on any host (on fast
    # steps a loaded host often has the answer in first: a woken worker that preempts
    # the parent has stepped before the parent looks). That a side with no spin sleeps
    # at once is also shown exactly, on bare doorbells, by the tests below.
    with _slow(spin_us=0.0, main_spin_us=0.0) as eng:
        c = _count_waits(eng, 100, 0.005, warm_up=5)
        assert all(naps == long == 0 for naps, _sleeps, long in c.values()), c
        assert all(sleeps >= 80 for _naps, sleeps, _long in c.values()), c
    with _slow(main_spin_us=0.0) as eng:  # what fastvec train chooses on full cores
        c = _count_waits(eng, 100, 0.005, warm_up=5)
        assert c["parent"][0] == c["parent"][2] == 0 and c["parent"][1] >= 80, c
        assert all(c[w][0] <= c[w][2] for w in (0, 1)), c
    # Workers taking >= 6 ms per step (2 envs sleeping 3 ms): every step is forecast long
    # and the parent naps towards it.
    with _slow() as eng:
        naps, _sleeps, long = _count_waits(eng, 30, warm_up=15)["parent"]
        assert long == 30 and 0 < naps <= long, (naps, long)


# The control block's layout (protocol.pxd): per worker, columns the parent writes, then
# columns the worker writes; the last row is the parent's own.
CMD_SEQ, CMD, SLOT, ARG, LOST, DONE_SEQ, SLEEPING = 0, 1, 2, 3, 7, 8, 12
M_SLEEPING = 0  # in the parent's own row


def _doorbells(n_workers: int = 1):
    """A bare control block and one socketpair per worker: both sides of the doorbells
    in this process, with no engine around them."""
    import socket

    from fastvec._core import protocol as P

    ctl = np.zeros((n_workers + 1, P.CTL_COLS), dtype=np.int64)
    pairs = [socket.socketpair() for _ in range(n_workers)]
    fds = np.array([a.fileno() for a, _b in pairs], dtype=np.intc)
    return ctl, pairs, fds


@pytest.mark.parametrize("rung", [True, False], ids=["rung", "ring_lost"])
def test_a_parent_asleep_finds_replies_whose_doorbell_never_rang(rung):
    """The parent sleeps until the last worker rings; should that ring never come, its
    periodic look at the flags ends the wait 100 ms late (not never) and counts it."""
    import threading

    from fastvec._core.channel import Controller

    from fastvec._core import protocol as P

    ctl, pairs, fds = _doorbells(2)
    try:
        c = Controller(ctl, fds, 0.0)  # no spin: it sleeps at once
        c.issue_all(P.CMD_STEP, 0)

        def workers_answer():
            # once the parent is asleep (it flags that holding the GIL, which it lets go
            # only to poll): an answer that came first would be found by its first look
            deadline = time.monotonic() + 5
            while not ctl[2, M_SLEEPING] and time.monotonic() < deadline:
                time.sleep(0.001)
            for w in (0, 1):
                ctl[w, DONE_SEQ] = ctl[w, CMD_SEQ]  # the reply, published ...
            if rung:  # ... and the last worker's doorbell
                pairs[1][1].send(np.array([P.WAKE, 0, 0, 0], dtype=np.int32).tobytes())

        t = threading.Thread(target=workers_answer, daemon=True)
        t0 = time.monotonic()
        t.start()
        status = c.wait(np.array([0, 1], dtype=np.intc), 5.0)
        took = time.monotonic() - t0
        t.join()
        assert status == (0, -1), status
        assert c.sleeps == 1 and c.lost == (0 if rung else 1), (c.sleeps, c.lost)
        assert took < 2.5, took  # at once, or 0.1 s with the ring lost: not the 5 s timeout
    finally:
        for a, b in pairs:
            a.close()
            b.close()


@pytest.mark.parametrize("rung", [True, False], ids=["rung", "ring_lost"])
def test_a_worker_asleep_finds_a_command_whose_doorbell_never_rang(rung):
    """The same on the worker's side: asleep for the next command, it finds one that came
    without its doorbell on its next look at the flags, and counts it."""
    import threading

    from fastvec._core.channel import Controller, WorkerChannel

    from fastvec._core import protocol as P

    ctl, pairs, fds = _doorbells(1)
    try:
        c = Controller(ctl, fds, 0.0)
        chan = WorkerChannel(ctl, 0, pairs[0][1].fileno(), 0.0)  # no spin: it sleeps at once
        got = []
        t = threading.Thread(target=lambda: got.append(chan.wait_command()), daemon=True)
        t.start()
        deadline = time.monotonic() + 5
        while not ctl[0, SLEEPING] and time.monotonic() < deadline:
            time.sleep(0.001)
        assert ctl[0, SLEEPING] == 1, "the worker did not go to sleep"
        t0 = time.monotonic()
        if rung:
            c.issue_all(P.CMD_STEP, 3)  # sees the worker asleep: rings
        else:  # the same command, published without the doorbell
            ctl[0, CMD], ctl[0, SLOT], ctl[0, ARG] = P.CMD_STEP, 3, P.NO_PAYLOAD
            ctl[0, CMD_SEQ] += 1
        t.join(5)
        took = time.monotonic() - t0
        assert not t.is_alive(), "the worker never saw its command"
        assert got == [(P.CMD_STEP, 3, P.NO_PAYLOAD, None)], got
        assert c.worker_waits(0) == (0, 1, 0 if rung else 1, 0), c.worker_waits(0)  # naps, sleeps, lost, long
        assert took < 2.5, took  # at once, or 0.1 s with the ring lost: not the 5 s join
    finally:
        for a, b in pairs:
            a.close()
            b.close()
