"""``fastvec train --max-time`` (``PPOConfig.max_seconds``): a run stopped by wall time.

References: the run stopped by time against the same run told, in env steps, to stop
where it stopped (the same weights bit for bit: the time limit moves no schedule), and
against its own clock's readings at each safe point; its resume against its own counters
and its checkpoint's wall time; the duration parser against hand-worked values.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import run_clock, stop_checks

from fastvec._cli_util import duration
from fastvec.train.algo.checkpoints import load_checkpoint
from fastvec.train.commands.cli import main as cli_main

BATCH = 8 * 32  # the CartPole preset's rollout: 8 envs x 32 steps
QUIET = ["--no-progress", "--no-tensorboard", "--checkpoint-every", "0"]
SCHEDULE = ["--set", "lr_schedule=linear", "--set", "lr_horizon=200000"]


def _train(capsys, argv) -> dict:
    assert cli_main("train", argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _weights(run_dir) -> dict:
    return load_checkpoint(str(run_dir / "checkpoint.pt"))["state_dict"]


def test_max_time_stops_the_run_where_a_shorter_budget_would(tmp_path, capsys, monkeypatch):
    """Stopped by time after k updates, at the first safe point whose clock read 1.5 s
    or more (every earlier one read less: it ran while it had time), the run has learned
    exactly what the run told k + 1 rollouts learns (its last rollout is collected, not
    learned): same weights."""
    clock = run_clock(monkeypatch)
    timed = _train(
        capsys,
        ["CartPole-v1", "--total-steps", "1e8", "--max-time", "1.5", "--logdir", str(tmp_path / "timed"), *SCHEDULE]
        + QUIET,
    )
    assert timed["out_of_time"] is True and timed["interrupted"] is False
    assert timed["wall_seconds"] < 10  # not a hang
    checks = stop_checks(clock)
    assert len(checks) == timed["updates"] + 1 and all(c < 1.5 for c in checks[:-1]) and checks[-1] >= 1.5, checks
    steps = timed["env_steps"]
    assert steps % BATCH == 0 and 0 < steps < 10**8
    assert timed["updates"] == steps // BATCH  # it stopped at a safe point: every rollout learned
    told = _train(
        capsys,
        ["CartPole-v1", "--total-steps", str(steps + BATCH), "--logdir", str(tmp_path / "told"), *SCHEDULE] + QUIET,
    )
    assert told["out_of_time"] is False and told["updates"] == timed["updates"]
    a, b = _weights(tmp_path / "timed"), _weights(tmp_path / "told")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # a different learning-rate horizon learns differently from the first update: the check can fail
    other = _train(
        capsys,
        ["CartPole-v1", "--total-steps", str(steps + BATCH), "--logdir", str(tmp_path / "other")]
        + ["--set", "lr_schedule=linear", "--set", "lr_horizon=100000", *QUIET],
    )
    c = _weights(tmp_path / "other")
    assert other["updates"] == timed["updates"] and not all(torch.equal(a[k], c[k]) for k in a)


def test_max_time_counts_over_a_resume(tmp_path, capsys, monkeypatch):
    """A resumed run's clock starts where the run it resumes stopped (its checkpoint's
    wall time): it stops at its first safe point past the new limit, counted over both;
    resumed again with all its time spent, it stops at the first."""
    clock = run_clock(monkeypatch)
    run = tmp_path / "run"
    first = _train(capsys, ["CartPole-v1", "--total-steps", "1e8", "--max-time", "1", "--logdir", str(run), *QUIET])
    assert first["out_of_time"] is True
    n, stopped = len(clock), _checkpoint_wall(run, first)
    again = _train(capsys, ["--resume", str(run), "--max-time", "2", *QUIET])  # a safe key on resume
    assert again["resumed"] is True and again["out_of_time"] is True
    assert again["env_steps"] > first["env_steps"]
    assert {before for _phase, before, _s in clock[n:]} == {stopped}
    checks = stop_checks(clock[n:])
    assert len(checks) == again["updates"] - first["updates"] + 1, checks
    assert all(c < 2 for c in checks[:-1]) and checks[-1] >= 2, checks
    n, stopped = len(clock), _checkpoint_wall(run, again)
    spent = _train(capsys, ["--resume", str(run), *QUIET])  # still 2 s, all spent: stops at once
    assert spent["env_steps"] == again["env_steps"] and spent["out_of_time"] is True
    assert {before for _phase, before, _s in clock[n:]} == {stopped}
    assert len(stop_checks(clock[n:])) == 1


def _checkpoint_wall(run_dir, result: dict) -> float:
    """The wall time the checkpoint of the run that gave ``result`` holds (the result's, rounded)."""
    wall = load_checkpoint(str(run_dir / "checkpoint.pt"))["train_state"]["wall_seconds"]
    assert result["wall_seconds"] == pytest.approx(wall, abs=1e-4)
    return wall


@pytest.mark.parametrize(
    "text, seconds", [("300", 300.0), ("90s", 90.0), ("5m", 300.0), ("1.5h", 5400.0), ("2M", 120.0)]
)
def test_duration(text, seconds):
    assert duration(text) == seconds


@pytest.mark.parametrize(
    "argv", [["--max-time", "5x"], ["--max-time", "0"], ["--max-time", "m"], ["--max-time", "inf"]]
)
def test_bad_max_time_is_one_line(capsys, argv):
    with pytest.raises(SystemExit) as exc:  # argparse's usage error
        cli_main("train", ["CartPole-v1", *argv, "--list-keys"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--max-time" in err and "positive duration" in err and "\n" not in err, err


@pytest.mark.parametrize("bad", ["max_seconds=0", "max_seconds=-3", "max_seconds=nan", "max_seconds=soon"])
def test_bad_max_seconds_is_one_line(capsys, bad):
    assert cli_main("train", ["CartPole-v1", "--set", bad, "--list-keys"]) == 2
    err = capsys.readouterr().err.strip()
    assert "max_seconds" in err and "\n" not in err, err
