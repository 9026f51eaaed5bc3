"""Checkpoints written by ``fastvec train``: weights, config, spaces and env id.

Written atomically (a temporary file, then ``os.replace``): a reader never sees half a
checkpoint.
"""
from __future__ import annotations

import os

import torch

from .policies import ActorCritic, describe_policy, make_policy

__all__ = ["CHECKPOINT_FORMAT", "save_checkpoint", "load_checkpoint", "policy_from_checkpoint", "check_spaces"]

CHECKPOINT_FORMAT = "fastvec-ppo-1"


def save_checkpoint(path: str, ppo, env_id: str | None, env_kwargs: dict | None, extra=None) -> str:
    pol = ppo.policy
    state = {k: v.detach().cpu().clone() for k, v in pol.state_dict().items()}
    ckpt = {
        "format": CHECKPOINT_FORMAT,
        "env_id": env_id,
        "env_kwargs": dict(env_kwargs or {}),
        "config": ppo.cfg.to_dict(),
        "observation_space": ppo.storage.single_observation_space,
        "action_space": ppo.storage.single_action_space,
        "policy": describe_policy(pol),
        "state_dict": state,
        "env_steps": ppo.env_steps,
        "extra": extra or {},
    }
    tmp = path + ".tmp"
    torch.save(ckpt, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str) -> dict:
    """Load a checkpoint written by ``fastvec train``; ValueError with a one-line
    message if the file is missing or is not one."""
    if not os.path.exists(path):
        raise ValueError(f"checkpoint not found: {path}")
    if os.path.isdir(path):
        cand = os.path.join(path, "checkpoint.pt")
        if not os.path.exists(cand):
            raise ValueError(f"{path} is a directory without checkpoint.pt")
        path = cand
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ValueError(f"{path} is not a readable checkpoint: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a fastvec PPO checkpoint")
    return ckpt


def policy_from_checkpoint(ckpt: dict) -> ActorCritic:
    c = ckpt["config"]
    pol = make_policy(ckpt["observation_space"], ckpt["action_space"], hidden=tuple(c["hidden"]),
                      activation=c["activation"], ortho_init=False, log_std_init=c["log_std_init"],
                      normalize_obs=c["normalize_obs"])
    pol.load_state_dict(ckpt["state_dict"])
    pol.eval()
    return pol


def check_spaces(ckpt: dict, obs_space, act_space, env_id) -> None:
    if ckpt["observation_space"] != obs_space or ckpt["action_space"] != act_space:
        raise ValueError(
            f"checkpoint spaces (obs {ckpt['observation_space']}, actions {ckpt['action_space']}) "
            f"do not match {env_id} (obs {obs_space}, actions {act_space})"
        )
