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
    did, from ``Engine.wait_counts``: ``{"parent": (naps, sleeps), 0: ..., 1: ...}``."""
    actions = np.zeros(eng.num_envs, dtype=np.int64)

    def run(n):
        for t in range(n):
            if gap:
                busy(gap) if gap < 0.005 else time.sleep(gap)
            eng.step(actions, t % 2)

    def flat(c):
        return {
            "parent": (c["parent"]["naps"], c["parent"]["sleeps"]),
            **{w: (c["workers"][w]["naps"], c["workers"][w]["sleeps"]) for w in range(eng.num_workers)},
        }

    run(warm_up)
    before = flat(eng.wait_counts())
    run(steps)
    counts = eng.wait_counts()
    after = flat(counts)
    # every sleep was ended by its doorbell, none by the periodic look at the flags
    assert [counts["parent"]["lost"]] + [w["lost"] for w in counts["workers"]] == [0] * (1 + eng.num_workers), counts
    return {k: (after[k][0] - before[k][0], after[k][1] - before[k][1]) for k in after}


def _cartpoles(**options) -> Engine:
    eng = Engine(
        [lambda: gym.make("CartPole-v1")] * 4, EngineOptions(autoreset_mode="next_step", **options), num_workers=2
    )
    eng.reset(0, {i: {"seed": i} for i in range(4)})
    return eng


def _until(what: str, count, ok, tries: int = 3) -> dict:
    """``count()`` until ``ok`` holds for its counts, at most ``tries`` times. A process of
    someone else's on our 2 cores makes every wait long (and then napping or sleeping is
    right), so one of the tries must find the machine quiet; what must hold whatever the
    load is asserted inside ``count``, on every try."""
    seen = []
    for _ in range(tries):
        counts = count()
        seen.append(counts)
        if ok(counts):
            return counts
    pytest.fail(f"{what}, in {tries} tries: {seen}")


def test_short_waits_are_spun_long_ones_napped():
    # What each side does, counted (not timed): waits forecast short are spun through (a
    # stray nap or sleep when the VM preempts us is allowed), a learner-length gap is
    # napped towards its forecast, and a parent with a zero spin sleeps every time.
    with _cartpoles() as eng:
        for gap, steps in ((0.0, 300), (0.0002, 100)):  # back to back; a small policy
            _until(
                f"waits after {gap * 1e3:g} ms gaps were not spun",
                lambda n=steps, g=gap: _count_waits(eng, n, g),
                lambda c, n=steps: all(naps <= 0.1 * n and sleeps <= 0.3 * n for naps, sleeps in c.values()),
            )
        # a 20 ms learner between steps: the workers' step is still short, so the parent
        # spins through it; each worker naps through the gap
        _until(
            "the parent should spin, the workers nap through 20 ms gaps",
            lambda: _count_waits(eng, 40, 0.02, warm_up=10),
            lambda c: c["parent"][0] == 0 and c[0][0] >= 30 and c[1][0] >= 30,
        )
        with pytest.raises(fastvec.ClosedError):
            eng.close()
            eng.wait_counts()

    def zero_spins():
        c = _count_waits(eng, 100)
        assert c["parent"][0] == c[0][0] == c[1][0] == 0, c  # no spin: nobody naps, whatever the load
        return c

    with _cartpoles(spin_us=0.0, main_spin_us=0.0) as eng:
        # (a worker finds the next command already there when the parent it woke ran
        # first on its core and sent it: then it does not sleep)
        _until(
            "with no spin each side should sleep",
            zero_spins,
            lambda c: c["parent"][1] >= 80 and c[0][1] + c[1][1] >= 60,
        )

    def zero_main_spin():
        c = _count_waits(eng, 100)
        assert c["parent"][0] == 0, c  # no spin: the parent never naps, whatever the load
        return c

    with _cartpoles(main_spin_us=0.0) as eng:  # what fastvec train chooses on full cores
        _until("with no spin the parent should sleep", zero_main_spin, lambda c: c["parent"][1] >= 80)
    # Workers taking ~6 ms per step (2 envs of 3 ms): the parent naps towards its forecast.
    with Engine([SlowStepEnv] * 4, EngineOptions(autoreset_mode="next_step"), num_workers=2) as eng:
        eng.reset(0, {i: {"seed": i} for i in range(4)})
        _until(
            "the parent should nap through a 6 ms step",
            lambda: _count_waits(eng, 30, warm_up=15),
            lambda c: c["parent"][0] >= 20,
        )


# The control block's layout (protocol.pxd): per worker, columns the parent writes, then
# columns the worker writes; the last row is the parent's own.
CMD_SEQ, CMD, SLOT, ARG, LOST, DONE_SEQ, SLEEPING = 0, 1, 2, 3, 7, 8, 12


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
            time.sleep(0.05)
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
        assert took < 2.5, took  # 0.05 s, or 0.15 s with the ring lost: not the 5 s timeout
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
        assert c.worker_waits(0) == (0, 1, 0 if rung else 1), c.worker_waits(0)
        assert took < 2.5, took  # at once, or 0.1 s with the ring lost: not the 5 s join
    finally:
        for a, b in pairs:
            a.close()
            b.close()
