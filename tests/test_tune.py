"""``fastvec tune`` and ``num_workers="auto"``: the candidates, the choice (against a
fake clock, so it cannot depend on this machine's noise), the doors and the command."""

from __future__ import annotations

import functools

import psutil
import pytest
from envs import CostEnv, RandomEndEnv
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from test_gym_equivalence import run_lockstep

import fastvec
from fastvec import tune as tuning
from fastvec._core.placement import contiguous
from fastvec.cli import main as cli
from fastvec.engine import batch_fits
from fastvec.tune import KEEP, Layout, layouts


def test_layouts_start_with_the_default_and_fit_their_batches():
    got = layouts(8, 2)
    assert got[0] == Layout(2)
    assert Layout(1) in got and Layout(2, "groups", 4) in got and Layout(2, "ready", 4) in got
    assert not any(c.placement == "balanced" for c in got)
    assert Layout(2, placement="balanced") in layouts(8, 2, uneven=True)
    assert all(c.batch_mode is None for c in layouts(8, 16, batches=False))
    assert [c.num_workers for c in layouts(8, 16, batches=False)] == [8, 1, 2, 4]
    for c in layouts(12, 8):
        if c.batch_mode is not None:  # every candidate can be built
            assert batch_fits(c.num_workers, 12, c.batch_size, c.batch_mode)
    assert layouts(3, 2)[0] == Layout(2) and all(c.batch_mode is None for c in layouts(3, 2))


def _fake_clock(monkeypatch, rates: dict):
    """``measure`` answering from ``rates`` (steps/s per layout); records the calls."""
    calls = []

    def measure(fns, layout, policy_us, seconds, **kw):
        calls.append(layout)
        return rates[layout], (10.0,) * len(fns), tuple(tuple(r) for r in contiguous(len(fns), layout.num_workers))

    monkeypatch.setattr(tuning, "measure", measure)
    monkeypatch.setattr(tuning, "available_cores", lambda: 2)
    return calls


def test_tune_takes_the_fastest_only_when_it_pays(monkeypatch):
    fns = [RandomEndEnv] * 8
    rates = {c: 1000.0 for c in layouts(8, 2)}
    rates[Layout(2, "groups", 4)] = 1000.0 * KEEP * 1.01
    rates[Layout(1)] = 1020.0
    calls = _fake_clock(monkeypatch, rates)
    result = tuning.tune(fns, policy_us=500)
    assert result.chosen == Layout(2, "groups", 4) and result.runner_up == Layout(1)
    # each timed twice; the change confirmed by two more timings of it and of the default
    assert calls.count(Layout(2)) == calls.count(Layout(2, "groups", 4)) == 4
    assert all(calls.count(c) == 2 for c in rates if c not in (Layout(2), Layout(2, "groups", 4)))
    assert "<- chosen" in str(result) and "policy stand-in 500 us" in str(result)
    rates[Layout(2, "groups", 4)] = 1000.0 * KEEP * 0.99  # within KEEP of the default: keep it
    result = tuning.tune(fns)
    assert result.chosen == Layout(2) == result.default


def test_tune_keeps_the_default_when_a_lead_does_not_hold(monkeypatch):
    """A candidate ahead in its first two timings, behind in the confirming two."""
    fns = [RandomEndEnv] * 8
    rates = {c: 1000.0 for c in layouts(8, 2)}
    lucky = Layout(2, "ready", 4)
    seen = []

    def measure(fns, layout, policy_us, seconds, **kw):
        seen.append(layout)
        runs = tuple(tuple(r) for r in contiguous(8, layout.num_workers))
        if layout == lucky:
            return (1200.0 if seen.count(lucky) <= 2 else 900.0), (10.0,) * 8, runs
        return rates[layout], (10.0,) * 8, runs

    monkeypatch.setattr(tuning, "measure", measure)
    monkeypatch.setattr(tuning, "available_cores", lambda: 2)
    result = tuning.tune(fns)
    assert seen.count(lucky) == 4 and result.chosen == Layout(2) and result.runner_up == lucky


def test_a_balanced_candidate_that_kept_the_runs_counts_as_the_runs(monkeypatch):
    fns = [RandomEndEnv] * 8
    timings = []

    def measure(fns, layout, policy_us, seconds, **kw):
        timings.append(layout)
        return (2000.0 if layout.placement == "balanced" else 1000.0), (10.0,) * 8, ((0, 1, 2, 3), (4, 5, 6, 7))

    monkeypatch.setattr(tuning, "measure", measure)
    monkeypatch.setattr(tuning, "available_cores", lambda: 2)
    result = tuning.tune(fns, candidates=[Layout(2), Layout(2, placement="balanced")])
    assert result.chosen == Layout(2) and Layout(2, placement="balanced") not in dict(result.trials)


def test_tune_refuses_bad_arguments():
    with pytest.raises(ValueError, match="policy_us"):
        tuning.tune([RandomEndEnv], policy_us=-1)
    with pytest.raises(ValueError, match="seconds"):
        tuning.tune([RandomEndEnv], seconds=0)


def test_measure_runs_each_loop_for_real():
    fns = [functools.partial(CostEnv, 50.0)] * 4
    for layout in (Layout(2), Layout(2, "groups", 2), Layout(2, "ready", 2), Layout(2, placement="balanced")):
        sps, env_us, workers = tuning.measure(fns, layout, policy_us=100, seconds=0.2)
        assert 100 < sps < 4 * 1e6 / 50  # no faster than four envs on four cores
        assert all(us > 40 for us in env_us)
        assert sorted(i for w in workers for i in w) == [0, 1, 2, 3]


@pytest.mark.parametrize("door", ["gym", "sb3"])
def test_auto_workers_pick_a_layout_and_match_the_reference(door):
    fns = [RandomEndEnv] * 4
    if door == "gym":
        env = fastvec.AsyncVectorEnv(fns, num_workers="auto")
        ref = SyncVectorEnv(fns)
        try:
            assert 1 <= env.num_workers <= 4
            run_lockstep(env, ref, 30, seed=2, mode=AutoresetMode.NEXT_STEP)
        finally:
            env.close()
            ref.close()
    else:
        from stable_baselines3.common.vec_env import DummyVecEnv
        from test_sb3_equivalence import run_lockstep as sb3_lockstep

        env = fastvec.SubprocVecEnv(fns, num_workers="auto")
        ref = DummyVecEnv(fns)
        try:
            sb3_lockstep(env, ref, 30, seed=2)
        finally:
            env.close()
            ref.close()


def test_auto_workers_with_batches():
    with fastvec.AsyncVectorEnv([RandomEndEnv] * 8, num_workers="auto", batch_size=4) as env:
        assert env.batch_size == 4 and batch_fits(env.num_workers, 8, 4, "groups")
        env.async_reset(seed=0)
        obs, *_ = env.recv()
        assert len(obs) == 4


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_workers": "fast"}, "positive int, None or 'auto'"),
        ({"num_workers": "auto", "placement": [[0], [1]]}, "picks the placement too"),
        ({"num_workers": "auto", "placement": "balanced", "env_costs": [1, 2]}, "picks the placement too"),
        ({"num_workers": "auto", "max_concurrency": 2}, "give one"),
    ],
)
def test_auto_conflicts_are_refused_before_any_process_starts(kwargs, message):
    before = psutil.Process().children(recursive=True)
    with pytest.raises(ValueError, match=message):
        fastvec.AsyncVectorEnv([RandomEndEnv] * 2, **kwargs)
    assert psutil.Process().children(recursive=True) == before


def test_tune_command(capsys):
    assert cli(["tune", "CartPole-v1", "--num-envs", "4", "--seconds", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "chosen:" in out and "[default]" in out and "env step cost" in out
    for bad in (
        ["tune", "NoSuchEnv-v9"],
        ["tune", "CartPole-v1", "--policy-us", "-3"],
        ["tune", "CartPole-v1", "--seconds", "0"],
    ):
        with pytest.raises(SystemExit) as exc:
            cli(bad)
        assert exc.value.code == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
