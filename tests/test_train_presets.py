"""The presets: every one validates; the MuJoCo ones train, resume and evaluate on
either pipeline; Pong's env stacks frames for the CNN."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from fastvec.train import PPOConfig, apply_overrides, load_checkpoint
from fastvec.train.commands.cli import main as cli_main
from fastvec.train.commands.cli import run_training as train
from fastvec.train.config.presets import PRESETS, env_factory, preset_for
from fastvec.train.model.actor_critic import make_policy


def test_presets_exist_and_validate():
    assert {"CartPole-v1", "Acrobot-v1", "InvertedPendulum-v5", "HalfCheetah-v5", "ALE/Pong-v5"} <= set(PRESETS)
    for env_id in PRESETS:
        preset = preset_for(env_id)
        cfg = apply_overrides(PPOConfig(), preset).validate()
        assert {key: getattr(cfg, key) for key in preset} == preset, env_id  # every choice taken
    assert preset_for("ALE/Breakout-v5")["n_steps"] == 128  # Atari defaults for other ALE ids


MUJOCO_PRESETS = [e for e in ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5") if e in PRESETS]


@pytest.mark.parametrize("env_id", MUJOCO_PRESETS)
@pytest.mark.parametrize("pipeline", ["lockstep", "async"])
def test_mujoco_preset_trains_resumes_and_evaluates(tmp_path, capsys, env_id, pipeline):
    """Each MuJoCo preset as a user runs it, short: trained with a --set override on either
    pipeline, resumed, evaluated; its checkpoint holds the preset's policy and schedule."""
    pytest.importorskip("mujoco")
    preset = preset_for(env_id)
    run = tmp_path / "run"
    short = ["--set", "n_steps=16", "--set", f"pipeline={pipeline}", "--no-progress", "--no-tensorboard"]
    steps = 2 * 16 * preset["num_envs"]
    assert cli_main("train", [env_id, "--total-steps", str(steps), "--logdir", str(run), *short]) == 0
    ckpt = load_checkpoint(str(run / "checkpoint.pt"))
    assert ckpt["config"]["hidden"] == list(preset.get("hidden", PPOConfig().hidden))
    for key, value in preset.items():  # every choice of the preset, but what this run overrides
        if key not in ("n_steps", "total_steps", "hidden"):  # hidden: a list in the checkpoint
            assert ckpt["config"][key] == value, key
    assert ckpt["config"]["n_steps"] == 16 and ckpt["env_steps"] == steps
    more = [env_id, "--total-steps", str(2 * steps), "--resume", str(run), "--no-progress", "--no-tensorboard"]
    assert cli_main("train", more) == 0
    assert load_checkpoint(str(run / "checkpoint.pt"))["env_steps"] == 2 * steps
    capsys.readouterr()
    assert cli_main("eval", [str(run), "--episodes", "1"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["episodes"] == 1


def test_pong_env_factory_stacks_frames():
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")  # AtariPreprocessing resizes with OpenCV
    try:
        env = env_factory("ALE/Pong-v5")()
    except (gym.error.NameNotFound, gym.error.NamespaceNotFound) as exc:  # an ale_py without Pong
        pytest.skip(f"ALE Pong is not registered here: {exc}")
    try:
        assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
        assert env.unwrapped._frameskip == 1
        pol = make_policy(env.observation_space, env.action_space)
        assert pol.kind == "cnn"
    finally:
        env.close()


def test_continuous_control_short_run():
    pytest.importorskip("mujoco")
    cfg = apply_overrides(PPOConfig(), preset_for("InvertedPendulum-v5"))
    apply_overrides(cfg, ["total_steps=2048", "num_envs=4", "n_steps=64", "device=cpu"])
    res = train("InvertedPendulum-v5", cfg, progress=False)
    assert res["env_steps"] == 2048 and res["policy"].startswith("mlp+gaussian")  # 8 rollouts of 4 x 64
