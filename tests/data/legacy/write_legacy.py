"""Writes the checkpoints in this folder with an older fastvec, for the tests that check
checkpoints from before a layout change still load, evaluate and resume.

Run once with the build to be kept readable first on the path, from this folder:

    PYTHONPATH=/path/to/old/fastvec python write_legacy.py

The files here were written by fastvec at commit a2237cd (format ``fastvec-ppo-2``, the
policy's modules named ``actor``, ``critic``, ``trunk``, ``actor_head``, ``critic_head``).
Beside each checkpoint, ``outputs.pt`` keeps what that build's policy computed on a
fixed batch of observations (the parameters of the action distribution and the values):
a checkpoint read by a later build must give the same numbers.
"""

from __future__ import annotations

import os
import shutil
import sys
from types import SimpleNamespace

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # tests/, for envs.py


def _train(name: str, env_id: str, overrides: dict) -> str:
    from fastvec.train import PPOConfig, apply_overrides
    from fastvec.train.commands.cli import run_training
    from fastvec.train.config.presets import preset_for

    cfg = apply_overrides(PPOConfig(), preset_for(env_id))
    apply_overrides(cfg, {"device": "cpu", "torch_threads": 1, "checkpoint_every": 0, **overrides})
    run_dir = os.path.join(HERE, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_training(env_id, cfg, run_dir=run_dir, progress=False, tensorboard=False)
    for f in os.listdir(run_dir):  # the checkpoint is what the tests read
        if f != "checkpoint.pt":
            p = os.path.join(run_dir, f)
            shutil.rmtree(p) if os.path.isdir(p) else os.unlink(p)
    return os.path.join(run_dir, "checkpoint.pt")


def _cnn() -> str:
    """A CNN policy's checkpoint (weights only: a CNN's optimiser state is large)."""
    from gymnasium import spaces

    from fastvec.train import PPOConfig
    from fastvec.train.algo.checkpoints import save_checkpoint
    from fastvec.train.model.actor_critic import make_policy

    torch.manual_seed(5)
    obs_space = spaces.Box(0, 255, (36, 36, 3), np.uint8)
    act_space = spaces.Discrete(3)
    pol = make_policy(obs_space, act_space)
    cfg = PPOConfig()
    view = SimpleNamespace(
        policy=pol,
        cfg=cfg,
        storage=SimpleNamespace(single_observation_space=obs_space, single_action_space=act_space),
        env_steps=0,
    )
    run_dir = os.path.join(HERE, "cnn")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    return save_checkpoint(os.path.join(run_dir, "checkpoint.pt"), view, None, {})


def _outputs(path: str) -> None:
    """The distribution's parameters and the values of the checkpoint's policy on 16
    observations drawn from its space (seed 0), next to it."""
    from fastvec.train.algo.checkpoints import load_checkpoint, policy_from_checkpoint

    ckpt = load_checkpoint(path)
    pol = policy_from_checkpoint(ckpt)
    space = ckpt["observation_space"]
    space.seed(0)
    obs = torch.as_tensor(np.stack([space.sample() for _ in range(16)]))
    with torch.no_grad():
        params, values = pol.params_and_value(obs)
    torch.save({"obs": obs, "params": params, "values": values}, os.path.join(os.path.dirname(path), "outputs.pt"))


def main() -> None:
    import fastvec

    print(f"fastvec {fastvec.__version__} from {os.path.dirname(fastvec.__file__)}")
    torch.set_num_threads(1)
    paths = [
        _train("cartpole", "CartPole-v1", {"seed": 3, "total_steps": 2048, "num_envs": 4, "n_steps": 64}),
        _train(
            "pendulum",
            "Pendulum-v1",
            {
                "seed": 4,
                "total_steps": 2048,
                "num_envs": 4,
                "n_steps": 64,
                "normalize_obs": True,
                "normalize_reward": True,
                "lr_schedule": "adaptive",
            },
        ),
        _cnn(),
    ]
    for p in paths:
        _outputs(p)
        print(p, os.path.getsize(p))


if __name__ == "__main__":
    main()
