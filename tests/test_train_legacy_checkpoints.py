"""Checkpoints written before the policy was made of pieces (format ``fastvec-ppo-2``, by
fastvec at a2237cd: ``tests/data/legacy/write_legacy.py``) still load, compute what their
policy computed then, evaluate and resume."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from fastvec.train import PPOConfig, load_checkpoint, policy_from_checkpoint, run_training
from fastvec.train.algo.checkpoints import CHECKPOINT_FORMAT, upgrade_state_dict
from fastvec.train.commands.cli import main as cli_main
from fastvec.train.model.actor_critic import make_policy

LEGACY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "legacy")


@pytest.mark.parametrize("name", ["cartpole", "pendulum", "cnn"])
def test_a_legacy_policy_computes_what_it_computed(name):
    ckpt = load_checkpoint(os.path.join(LEGACY, name, "checkpoint.pt"))
    assert ckpt["format"] == "fastvec-ppo-2"
    then = torch.load(os.path.join(LEGACY, name, "outputs.pt"))
    pol = policy_from_checkpoint(ckpt)
    with torch.no_grad():
        params, values = pol.params_and_value(then["obs"])
    torch.testing.assert_close(params, then["params"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(values, then["values"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["cartpole", "pendulum", "cnn"])
def test_the_old_names_need_the_upgrade(name):
    """Without the mapping of the old names the state dict does not load: the check above
    reads the upgraded weights, not a fresh policy's."""
    ckpt = load_checkpoint(os.path.join(LEGACY, name, "checkpoint.pt"))
    c = ckpt["config"]
    pol = make_policy(
        ckpt["observation_space"], ckpt["action_space"], hidden=tuple(c["hidden"]), normalize_obs=c["normalize_obs"]
    )
    with pytest.raises(RuntimeError, match="Missing key"):
        pol.load_state_dict(ckpt["state_dict"])
    upgraded = upgrade_state_dict(ckpt["state_dict"], ckpt["format"])
    assert sorted(upgraded) == sorted(pol.state_dict())
    assert upgrade_state_dict(upgraded, CHECKPOINT_FORMAT) is upgraded


@pytest.mark.parametrize("name", ["cartpole", "pendulum"])
def test_a_legacy_run_resumes(tmp_path, name):
    """Resumed with no steps left, the run writes back the weights and train state it read
    (in this format); resumed further, it continues its counters."""
    run = tmp_path / name
    shutil.copytree(os.path.join(LEGACY, name), run)
    old = load_checkpoint(str(run / "checkpoint.pt"))
    steps = old["train_state"]["env_steps"]
    res = run_training(resume=str(run), progress=False, tensorboard=False)
    assert res["resumed"] and res["env_steps"] == steps
    same = load_checkpoint(str(run / "checkpoint.pt"))
    assert same["format"] == CHECKPOINT_FORMAT
    want = upgrade_state_dict(old["state_dict"], old["format"])
    assert same["state_dict"].keys() == want.keys()
    assert all(torch.equal(same["state_dict"][k], want[k]) for k in want)
    assert same["train_state"]["optimizer"]["t"] == old["train_state"]["optimizer"]["t"]
    assert torch.equal(same["train_state"]["optimizer"]["m"], old["train_state"]["optimizer"]["m"])
    assert same["train_state"]["updates"] == old["train_state"]["updates"]

    cfg = PPOConfig.from_dict(old["config"])
    cfg.total_steps = steps + 2 * cfg.num_envs * cfg.n_steps
    res = run_training(config=cfg, resume=str(run), progress=False, tensorboard=False)
    more = load_checkpoint(str(run / "checkpoint.pt"))
    assert res["env_steps"] == cfg.total_steps and res["updates"] == old["train_state"]["updates"] + 1
    assert more["train_state"]["optimizer"]["t"] > old["train_state"]["optimizer"]["t"]


def test_a_legacy_checkpoint_evaluates(capsys):
    assert cli_main("eval", [os.path.join(LEGACY, "cartpole"), "--episodes", "2"]) == 0
    assert '"episodes": 2' in capsys.readouterr().out
