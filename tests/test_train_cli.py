"""``fastvec train`` and ``fastvec eval`` as a user runs them: the run directory's
files and metrics, eval's figures against the episodes replayed by hand, one-line
errors for bad input and bad checkpoints, the real ``fastvec`` command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from gymnasium import spaces
from helpers import one_line_error

from fastvec.train import load_checkpoint
from fastvec.train.algo.checkpoints import policy_from_checkpoint
from fastvec.train.commands.cli import main as cli_main
from fastvec.train.config.presets import env_factory


def test_run_directory_contents_and_eval(tmp_path):
    run = tmp_path / "run"
    code = cli_main(
        "train",
        [
            "CartPole-v1",
            "--total-steps",
            "4096",
            "--logdir",
            str(run),
            "--no-progress",
            "--seed",
            "1",
            "--set",
            "log_every_s=0.01",
        ],
    )
    assert code == 0
    files = os.listdir(run)
    assert any(f.startswith("events.out.tfevents") for f in files)
    assert {"metrics.jsonl", "learning_curve.png", "checkpoint.pt", "result.json"} <= set(files)
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    keys = set().union(*rows)
    for k in (
        "charts/env_sps",
        "charts/learner_sps",
        "losses/approx_kl",
        "losses/clip_fraction",
        "losses/explained_variance",
        "health/workers_alive",
        "health/step_latency_us",
        "health/main_rss_mb",
        "charts/mean_episode_length",
        "health/lost_wakeups",
    ):
        assert k in keys, k
    assert all(row.get("health/lost_wakeups", 0) == 0 for row in rows)
    ckpt = load_checkpoint(str(run / "checkpoint.pt"))
    assert ckpt["env_id"] == "CartPole-v1" and ckpt["action_space"] == spaces.Discrete(2)
    assert "state_dict" in ckpt and ckpt["config"]["seed"] == 1
    assert cli_main("eval", [str(run / "checkpoint.pt"), "--episodes", "3", "--seed", "0"]) == 0


def test_eval_reports_mean_return(tmp_path, capsys):
    run = tmp_path / "r"
    assert (
        cli_main(
            "train", ["CartPole-v1", "--total-steps", "2048", "--logdir", str(run), "--no-progress", "--no-tensorboard"]
        )
        == 0
    )
    capsys.readouterr()
    assert cli_main("eval", [str(run), "--episodes", "4"]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    res = json.loads(out)
    assert res["episodes"] == 4 and res["env_id"] == "CartPole-v1"
    # the same four episodes, played one env at a time (env i seeded 0 + i, the mode of
    # the policy's logits each step): eval reports exactly their returns and lengths
    pol = policy_from_checkpoint(load_checkpoint(str(run / "checkpoint.pt")))
    returns, lengths = [], []
    for i in range(4):
        env = env_factory("CartPole-v1")()
        obs, _ = env.reset(seed=i)
        ret, n, done = 0.0, 0, False
        while not done:
            with torch.no_grad():
                logits = pol.actor_params(torch.as_tensor(obs[None], dtype=torch.float32))
            obs, r, term, trunc, _ = env.step(int(logits.argmax(-1)))
            ret, n, done = ret + r, n + 1, term or trunc
        env.close()
        returns.append(ret)
        lengths.append(n)
    assert res["mean_return"] == pytest.approx(np.mean(returns))
    assert (res["min_return"], res["max_return"]) == (min(returns), max(returns))
    assert res["mean_length"] == pytest.approx(np.mean(lengths))
    # beside it, the training return the run ended with (result.json's, stochastic actions)
    trained = json.load(open(run / "result.json"))
    assert res["training_mean_return"] == pytest.approx(trained["final_mean_return"], abs=1e-4)
    assert res["training_env_steps"] == trained["env_steps"] == 2048


def test_cli_unknown_env(capsys):
    one_line_error(capsys, cli_main("train", ["NoSuchEnv-v0"]), "unknown env id")


def test_cli_bad_set_key_and_value(capsys):
    one_line_error(capsys, cli_main("train", ["CartPole-v1", "--set", "bogus=1"]), "unknown --set key 'bogus'")
    one_line_error(capsys, cli_main("train", ["CartPole-v1", "--set", "lr=fast"]), "bad value for lr")
    one_line_error(capsys, cli_main("train", ["CartPole-v1", "--set", "gamma=1.5"]), "gamma")
    one_line_error(capsys, cli_main("train", ["CartPole-v1", "--set", "noequals"]), "key=value")
    one_line_error(capsys, cli_main("train", ["CartPole-v1", "--num-envs", "0"]), "num_envs")
    for bad in ("critic_hidden=64,0", "critic_hidden=64,a", "hidden=-1", "hidden=64,,64", "hidden=64,", "hidden="):
        one_line_error(capsys, cli_main("train", ["CartPole-v1", "--set", bad]), bad.split("=")[0])


def test_cli_checkpoint_errors(tmp_path, capsys):
    one_line_error(capsys, cli_main("eval", [str(tmp_path / "missing.pt")]), "checkpoint not found")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    one_line_error(capsys, cli_main("eval", [str(junk)]), "not")
    torch.save({"hello": 1}, tmp_path / "other.pt")
    one_line_error(capsys, cli_main("eval", [str(tmp_path / "other.pt")]), "not a fastvec PPO checkpoint")
    run = tmp_path / "run"
    assert (
        cli_main(
            "train", ["CartPole-v1", "--total-steps", "512", "--logdir", str(run), "--no-progress", "--no-tensorboard"]
        )
        == 0
    )
    capsys.readouterr()
    ck = str(run / "checkpoint.pt")
    one_line_error(capsys, cli_main("eval", [ck, "--env", "Acrobot-v1"]), "trained on CartPole-v1, not Acrobot-v1")
    one_line_error(
        capsys, cli_main("train", ["Acrobot-v1", "--init-from", ck, "--no-progress"]), "trained on CartPole-v1"
    )


def test_cli_end_to_end_subprocess(tmp_path):
    """The real `fastvec` command: JSON last line on success, one-line errors otherwise."""
    exe = [sys.executable, "-m", "fastvec"]
    # cwd: outside the source tree, so `-m fastvec` finds the installed package
    out = subprocess.run(
        exe + ["train", "CartPole-v1", "--total-steps", "1024", "--logdir", str(tmp_path / "r"), "--no-tensorboard"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    for k in ("solved", "env_steps", "wall_seconds", "final_mean_return", "sps"):
        assert k in res
    assert res["env_steps"] == 1024  # 4 rollouts of the preset's 8 envs x 32 steps
    bad = subprocess.run(exe + ["train", "Nope-v9"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
