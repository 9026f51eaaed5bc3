"""The rules a trainer config's values obey (``PPOConfig.validate`` applies them): the
allowed choices, and the checks of the schedule, the pipeline and the policy's core,
each raising ``ConfigError`` with a one-line message."""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "ConfigError",
    "ACTIVATION_NAMES",
    "CORES",
    "ACTION_MASKS",
    "LR_SCHEDULES",
    "PIPELINES",
    "TARGETS",
    "PROXIMAL",
    "positive_int",
    "check_schedule_pair",
    "check_schedule",
    "check_pipeline",
    "check_core",
    "video_settings",
]

LR_SCHEDULES = ("linear", "constant", "adaptive")
PIPELINES = ("lockstep", "async")
TARGETS = ("auto", "gae", "vtrace")
PROXIMAL = ("acting", "learner")
# What the model builds (``fastvec.train.model``): its encoders' activations, its cores.
ACTIVATION_NAMES = ("tanh", "relu", "elu", "gelu", "silu")
CORES = ("none", "lstm", "gru")
ACTION_MASKS = ("none", "auto", "info", "method", "dict")  # fastvec.action_masks.MASK_SOURCES


class ConfigError(ValueError):
    """A bad configuration value or key (reported as a one-line error by the CLI)."""


def positive_int(name: str, v) -> None:
    """ConfigError unless ``v`` is an integer of at least 1 (not a bool)."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ConfigError(f"{name} must be a positive integer, got {v!r}")


def check_schedule_pair(anneal_lr, lr_schedule) -> None:
    """ConfigError where ``anneal_lr`` and ``lr_schedule``, given together, disagree."""
    if bool(anneal_lr) != (lr_schedule == "linear"):
        raise ConfigError(
            f"anneal_lr={str(anneal_lr).lower()} contradicts lr_schedule={lr_schedule} "
            "(anneal_lr is its older spelling: true is linear, false any other schedule); give one of them"
        )


def check_pipeline(cfg) -> None:
    """The async pipeline's settings (each is checked in lock-step runs too)."""
    if cfg.pipeline not in PIPELINES:
        raise ConfigError(f"pipeline must be one of {', '.join(PIPELINES)}, got {cfg.pipeline!r}")
    v = cfg.max_policy_lag
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        raise ConfigError(f"max_policy_lag must be a non-negative integer (updates), got {v!r}")
    v = cfg.rollout_buffers
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 2:
        raise ConfigError(
            f"rollout_buffers must be an integer of at least 2 (one rollout fills while the learner reads another), got {v!r}"
        )
    if cfg.action_mask not in ACTION_MASKS:
        raise ConfigError(f"action_mask must be one of {', '.join(ACTION_MASKS)}, got {cfg.action_mask!r}")
    if cfg.action_mask != "none" and cfg.pipeline == "async":
        raise ConfigError("action masks need pipeline=lockstep (the async learner does not read them)")
    if cfg.video_settings:
        video_settings(cfg)
    if cfg.targets not in TARGETS:
        raise ConfigError(f"targets must be one of {', '.join(TARGETS)}, got {cfg.targets!r}")
    if cfg.targets == "vtrace" and cfg.pipeline != "async":
        raise ConfigError(f"targets={cfg.targets} needs pipeline=async (lock-step learns on-policy: gae)")
    if cfg.values_of not in ("acting", "learner"):
        raise ConfigError(f"values_of must be acting or learner, got {cfg.values_of!r}")
    if cfg.proximal_policy not in PROXIMAL:
        raise ConfigError(f"proximal_policy must be one of {', '.join(PROXIMAL)}, got {cfg.proximal_policy!r}")
    for name in ("vtrace_rho_bar", "vtrace_c_bar"):
        v = getattr(cfg, name)
        if not v > 0:  # inf allowed: no clipping
            raise ConfigError(f"{name} must be a positive number (inf allowed), got {v!r}")


def check_core(cfg) -> None:
    """The policy's core and, for a recurrent one, its sequences and what it runs with."""
    if cfg.policy_core not in CORES:
        raise ConfigError(f"policy_core must be one of {', '.join(CORES)}, got {cfg.policy_core!r}")
    positive_int("core_size", cfg.core_size)
    if cfg.policy_core == "none":
        return
    L = cfg.bptt if cfg.bptt is not None else cfg.n_steps
    positive_int("bptt", L)
    if cfg.n_steps % L:
        raise ConfigError(f"bptt={L} must divide n_steps={cfg.n_steps} (each rollout is cut into whole sequences)")
    if cfg.minibatch_size % L and cfg.minibatch_size < cfg.n_steps * cfg.num_envs:
        raise ConfigError(
            f"minibatch_size={cfg.minibatch_size} must be a multiple of bptt={L} with "
            f"policy_core={cfg.policy_core}: a minibatch holds whole sequences"
        )
    for why, bad in (
        (
            "values_of=acting (the acting weights' critic states are not kept: use values_of=learner)",
            cfg.pipeline == "async" and cfg.values_of == "acting",
        ),
        (f"env_groups={cfg.transport.env_groups} (use env_groups=1)", cfg.transport.env_groups > 1),
        ("learner=numpy (use auto or torch)", cfg.learner == "numpy"),
    ):
        if bad:
            raise ConfigError(f"policy_core={cfg.policy_core} does not work with {why}")


def check_schedule(cfg) -> None:
    """The learning rate's schedule and the adaptive one's bounds."""
    if cfg.lr_schedule not in LR_SCHEDULES:
        raise ConfigError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {cfg.lr_schedule!r}")
    for name in ("lr_kl_target", "lr_min", "lr_max"):
        v = getattr(cfg, name)
        if not (v > 0 and math.isfinite(v)):
            raise ConfigError(f"{name} must be a positive number, got {v!r}")
    if not (cfg.lr_factor > 1 and math.isfinite(cfg.lr_factor)):
        raise ConfigError(f"lr_factor must be a number above 1, got {cfg.lr_factor!r}")
    if cfg.lr_min > cfg.lr_max:
        raise ConfigError(f"lr_min={cfg.lr_min!r} exceeds lr_max={cfg.lr_max!r}")
    if cfg.lr_schedule == "adaptive" and not cfg.lr_min <= cfg.lr <= cfg.lr_max:
        raise ConfigError(
            f"lr={cfg.lr!r} is outside [lr_min, lr_max] = [{cfg.lr_min!r}, {cfg.lr_max!r}] "
            "(the adaptive schedule starts at lr and stays within them)"
        )


def video_settings(cfg) -> dict:
    """``cfg.video_settings`` as the filmed env's extra settings (empty: none);
    ConfigError, one line, on bad text."""
    from ...env_ids import parse_settings

    if not cfg.video_settings:
        return {}
    try:
        return parse_settings(cfg.video_settings, "video_settings")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
