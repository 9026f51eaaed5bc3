"""``fastvec train`` on a mix of envs (``--mix``, ``fastvec.train.config.mix``) and the
trainer's ``placement``.

References: the same run placed in env order (``placement=contiguous``): a placement
moves envs between workers, never what they do, so the weights must be equal bit for
bit; a run given its settings as one group against the same settings as ``env_kwargs``.
"""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import CostEnv

from fastvec.train import ConfigError, PPOConfig, load_checkpoint
from fastvec.train.algo.statistics import EpisodeTracker
from fastvec.train.commands.cli import main
from fastvec.train.commands.cli import run_training as train
from fastvec.train.commands.evaluate import evaluate
from fastvec.train.config.mix import counted_total, describe_mix, parse_group, resolve_mix

COST_ID = "FastvecTest/Cost-v0"
if COST_ID not in gym.registry:  # the workers fork, so they know it too
    gym.register(id=COST_ID, entry_point=CostEnv)

# 2 costly envs first, 2 cheap ones: env order puts the costly pair on one worker
MIX = ["cost_us=3000,episode_len=20", "cost_us=50,episode_len=30"]


def _cfg(**kw) -> PPOConfig:
    base = dict(num_envs=4, num_workers=2, n_steps=16, n_epochs=2, minibatch_size=32, total_steps=4 * 16 * 4)
    return PPOConfig(**{**base, "device": "cpu", "seed": 3, **kw})


def _weights(run_dir) -> dict:
    return load_checkpoint(str(run_dir))["state_dict"]


def test_parse_group_reads_json_values_and_text():
    g = parse_group("id=Foo-v1,count=3,frame_skip=20,w=0.5,on=true,xml=./a.xml,sizes=[1, 2],none=null")
    assert g == {
        "env_id": "Foo-v1",
        "count": 3,
        "env_kwargs": {"frame_skip": 20, "w": 0.5, "on": True, "xml": "./a.xml", "sizes": [1, 2], "none": None},
    }
    assert parse_group("frame_skip=5") == {"env_id": None, "count": None, "env_kwargs": {"frame_skip": 5}}


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "key=value"),
        ("frame_skip", "key=value"),
        ("=3", "key=value"),
        ("count=0", "positive integer"),
        ("count=2.5", "positive integer"),
        ("count=true", "positive integer"),
        ("id=3", "env id"),
        ("a=1,a=2", "gives a twice"),
        ("count=1,count=2", "gives count twice"),
    ],
)
def test_parse_group_refuses_bad_text(text, words):
    with pytest.raises(ConfigError, match=words):
        parse_group(text)


def test_resolve_mix_shares_the_uncounted_envs():
    mix = resolve_mix(["count=2", "x=1", "id=CartPole-v0"], "CartPole-v1", 8)
    assert [(g["env_id"], g["count"], g["env_kwargs"]) for g in mix] == [
        ("CartPole-v1", 2, {}),
        ("CartPole-v1", 3, {"x": 1}),
        ("CartPole-v0", 3, {}),
    ]
    assert resolve_mix(mix, "CartPole-v1", 8) == mix  # a resolved mix (a checkpoint's) resolves to itself
    assert resolve_mix([], "CartPole-v1", 8) is None
    assert counted_total(["count=2", "count=5"]) == 7 and counted_total(["count=2", "x=1"]) is None
    assert describe_mix(mix) == "2 x CartPole-v1 + 3 x CartPole-v1[x=1] + 3 x CartPole-v0"


@pytest.mark.parametrize(
    "groups, n, words",
    [
        (["count=3", "count=3"], 8, "cannot share num_envs=8"),
        (["count=9"], 8, "cannot share"),
        (["count=7", "x=1", "x=2"], 8, "cannot share"),
        (["x=1", "x=2", "x=3"], 8, "cannot share"),
        (["id=Nope-v9"], 8, "unknown env id 'Nope-v9'"),
        ([{"env_id": "CartPole-v1", "count": -1}], 8, "positive integer"),
        ([{"env": "CartPole-v1"}], 8, "a dict of env_id"),
    ],
)
def test_resolve_mix_refuses_what_does_not_add_up(groups, n, words):
    with pytest.raises(ConfigError, match=words):
        resolve_mix(groups, "CartPole-v1", n)


def test_tracker_keeps_each_groups_returns():
    tr = EpisodeTracker(3, window=2)
    tr.set_groups([0, 0, 1])
    rewards = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    ends = np.array([[True, False, False], [False, True, False], [True, True, True]])
    tr.update(rewards, ends, np.zeros_like(ends))
    # in order: env 0's 1, env 1's 4, env 0's 2, env 1's 2, env 2's 9; each window keeps the last two
    assert tr.group_means() == [2.0, 9.0] and tr.mean() == pytest.approx(5.5)
    again = EpisodeTracker(3, window=2)
    again.set_groups([0, 0, 1])
    again.load(tr.state())
    assert again.group_means() == [2.0, 9.0]
    old = {k: v for k, v in tr.state().items() if k != "group_windows"}  # a checkpoint from before groups
    again.set_groups([0, 0, 1])
    again.load(old)
    assert again.group_means() == [None, None] and again.mean() == pytest.approx(5.5)


def test_placement_moves_envs_not_what_is_learned(tmp_path):
    """Balanced (the mix's default) spreads the costly pair over both workers; the
    weights equal the contiguous run's bit for bit."""
    a = train(COST_ID, _cfg(placement="contiguous"), mix=MIX, run_dir=str(tmp_path / "a"), progress=False)
    b = train(COST_ID, _cfg(), mix=MIX, run_dir=str(tmp_path / "b"), progress=False)
    assert a["placement"]["workers"] == [[0, 1], [2, 3]]
    assert b["placement"]["mode"] == "balanced"
    assert sorted(len(set(w) & {0, 1}) for w in b["placement"]["workers"]) == [1, 1]
    assert b["placement"]["balance"] > a["placement"]["balance"]
    assert (
        a["mix"]
        == b["mix"]
        == [
            {"env_id": COST_ID, "env_kwargs": {"cost_us": 3000, "episode_len": 20}, "count": 2},
            {"env_id": COST_ID, "env_kwargs": {"cost_us": 50, "episode_len": 30}, "count": 2},
        ]
    )
    for key in ("env_steps", "episodes", "final_mean_return"):
        assert a[key] == b[key], key
    assert a["group_mean_returns"] == b["group_mean_returns"] == [20.0, 30.0]  # a reward of 1 a step
    ev = evaluate(str(tmp_path / "b"), episodes=4, seed=0)
    assert [(g["episodes"], g["mean_return"]) for g in ev["groups"]] == [(2, 20.0), (2, 30.0)]
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_async_pipeline_on_a_mix_learns_as_lockstep(tmp_path):
    """max_policy_lag=0 reproduces the lock-step run; the learner's checkpoint keeps the mix."""
    a = train(COST_ID, _cfg(placement="contiguous"), mix=MIX, run_dir=str(tmp_path / "a"), progress=False)
    b = train(COST_ID, _cfg(pipeline="async", max_policy_lag=0), mix=MIX, run_dir=str(tmp_path / "b"), progress=False)
    assert b["pipeline"] == "async" and b["group_mean_returns"] == a["group_mean_returns"]
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert load_checkpoint(str(tmp_path / "b"))["mix"] == a["mix"]


def test_placement_test_can_fail(tmp_path):
    """The comparison above sees a change in what the envs do (a setting of one env)."""
    train(COST_ID, _cfg(placement="contiguous"), mix=MIX, run_dir=str(tmp_path / "a"), progress=False)
    other = [MIX[0], "cost_us=50,episode_len=31"]
    train(COST_ID, _cfg(placement="contiguous"), mix=other, run_dir=str(tmp_path / "b"), progress=False)
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert not all(torch.equal(wa[k], wb[k]) for k in wa)


def test_one_group_is_settings_and_trains_as_env_kwargs(tmp_path):
    kw = {"cost_us": 10, "episode_len": 7}
    a = train(COST_ID, _cfg(), env_kwargs=kw, run_dir=str(tmp_path / "a"), progress=False)
    b = train(COST_ID, _cfg(), mix=["cost_us=10,episode_len=7"], run_dir=str(tmp_path / "b"), progress=False)
    assert b["mix"] is None and b["placement"]["mode"] == "contiguous"
    assert load_checkpoint(str(tmp_path / "b"))["env_kwargs"] == kw
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a["episodes"] == b["episodes"]


def test_cli_mix_trains_resumes_and_evaluates(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", "CartPole-v1", "--mix", "count=3", "--mix", "id=CartPole-v0,count=3", "--num-workers", "2"]
    common = ["--no-progress", "--no-tensorboard", "--logdir", str(run)]
    assert main(args[0], args[1:] + ["--total-steps", "600", "--checkpoint-every", "0"] + common) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["num_envs"] == 6 and [g["env_id"] for g in first["mix"]] == ["CartPole-v1", "CartPole-v0"]
    assert sorted(i for w in first["placement"]["workers"] for i in w) == list(range(6))
    assert main("train", ["--resume", str(run), "--total-steps", "1200", "--no-progress", "--no-tensorboard"]) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert second["resumed"] and second["mix"] == first["mix"] and second["env_steps"] >= 1200
    ev = evaluate(str(run), episodes=8, seed=1)
    assert [(g["env_id"], g["episodes"]) for g in ev["groups"]] == [("CartPole-v1", 4), ("CartPole-v0", 4)]
    means = [g["mean_return"] for g in ev["groups"]]
    assert ev["mean_return"] == pytest.approx(np.mean(means))  # equal episode counts


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--mix", "count=3", "--mix", "x=1", "--mix", "x=2"], "cannot share num_envs=8"),
        (["--mix", "count=3", "--mix", "count=3", "--num-envs", "8"], "add up to 6 envs, but num_envs=8"),
        (["--mix", "id=Nope-v9"], "unknown env id"),
        (["--mix", "x", "--mix", "y=1"], "key=value"),
        (["--mix", "id=Acrobot-v1"], "action space"),
        (["--mix", "id=FastvecTest/Cost-v0"], "observation space"),
        (["--mix", "sutton_barto_reward=true,no_such_setting=1"], "does not build: TypeError"),
        (["--set", "placement=balanced", "--set", "env_groups=2"], "placement=balanced needs env_groups=1"),
        (["--set", "placement=spread"], "placement must be contiguous, balanced or none"),
        (["--set", "placement=balanced", "--backend", "ray"], "placement=balanced needs fastvec's engine"),
    ],
)
def test_cli_refuses_a_bad_mix_in_one_line(extra, words, tmp_path, capsys):
    # (each group is checked against group 0, CartPole-v1 here)
    argv = ["CartPole-v1", *extra, "--no-progress", "--logdir", str(tmp_path / "r")]
    if "id=Acrobot-v1" in extra or "id=FastvecTest/Cost-v0" in extra:
        argv[1:1] = ["--mix", "count=4"]
    assert main("train", argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastvec train: error:") and words in err[0], err
    assert not (tmp_path / "r").exists()


def test_resume_refuses_a_new_mix(tmp_path, capsys):
    run = tmp_path / "run"
    assert main("train", ["CartPole-v1", "--total-steps", "256", "--no-progress", "--logdir", str(run)]) == 0
    capsys.readouterr()
    assert main("train", ["--resume", str(run), "--mix", "count=8"]) == 2
    assert "does not take --mix" in capsys.readouterr().err
    with pytest.raises(ValueError, match="does not take a mix"):
        train(resume=str(run), mix=["count=8"], progress=False)


def test_a_mix_with_a_vector_env_of_ones_own_is_refused():
    venv = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    try:
        with pytest.raises(ValueError, match="a mix builds its own envs"):
            train("CartPole-v1", PPOConfig(num_envs=2), venv=venv, mix=["count=2"], save=False, progress=False)
        with pytest.raises(ValueError, match="placement=contiguous needs fastvec's engine"):
            train(None, PPOConfig(num_envs=2, placement="contiguous"), venv=venv, save=False, progress=False)
    finally:
        venv.close()
