"""Per-env hyperparameter presets (like RL Zoo's) and env construction.

``preset_for(env_id)`` returns the overrides for ``PPOConfig`` (every one of them can be
overridden again from the command line with ``--set key=value``). ``env_factory`` builds
the picklable env constructor the workers call: plain ``gymnasium.make`` for most ids
(``MODULE:ENV_ID`` too, which imports ``MODULE`` in the worker first), the entry point
for a ``MODULE:CALLABLE`` (``fastvec.env_ids``), and the standard Atari pipeline for
``ALE/...`` ids.

Where the numbers come from:

- CartPole-v1: tuned here for *wall time to solve* (mean of the last 20 returns >= 475)
  on a 2-core machine; see ``benchmarks/bench_train.py``. RL Zoo's preset (8 envs,
  n_steps 32, batch 256, gamma 0.98, lambda 0.8, 20 epochs, lr 1e-3) is
  ``preset_for("CartPole-v1", zoo=True)``.
- CartPoleNoVel-v1 (CartPole without its velocities, ``fastvec.train.config.presets``): an LSTM of
  64 units after a 64-unit ReLU layer (actor and critic each), RL Zoo's RecurrentPPO
  hyperparameters for the env (batch 256, gamma 0.98, lambda 0.8, lr 1e-3 and clip 0.2
  annealed, observations normalised) with 16 envs, rollouts of 64 steps and 10 epochs
  instead of 8, 32 and 20. To 475 within 300k steps: RL Zoo's solved seed 1 of seeds
  1-2 (187k steps); 8 envs x 64 steps x 10 epochs 4 of seeds 1-5 (seed 4 ended at 271);
  16 envs 5 of 5 (52k-221k steps, 10-32 s here).
- popgym-RepeatPreviousEasy-v0 (POPGym's, where popgym is installed): CartPoleNoVel's
  network (64 ReLU units, then an LSTM of 64) on 16 envs x 64 steps, 10 epochs, lr 1e-3
  annealed, lambda 0.8, gamma 0.5 (0.98 took 80k steps to 0.95, 0.5 and 0 33k-45k; 4
  epochs 207k), 200k steps; see ``benchmarks/bench_memory_popgym.py``.
- Acrobot-v1: RL Zoo (16 envs, n_steps 256, gamma 0.99, lambda 0.94, 4 epochs,
  normalised observations).
- InvertedPendulum-v5: tuned for wall time to a mean return of 950.
- HalfCheetah-v5: CleanRL's MuJoCo defaults (lr 3e-4, gamma 0.99, lambda 0.95,
  10 epochs, 64x64 tanh, normalised observations and rewards) on 8 envs, with the
  Gaussian's log std starting at -1 and a constant learning rate, chosen by
  ``benchmarks/search_presets.py`` (the worst of 3 seeds' training return after 2
  minutes: 5,730 against CleanRL's defaults' 1,552, which start at log std 0). The
  rate does not depend on ``total_steps``: a run told 1M steps is the beginning of one
  told 10M. With ``pipeline=async`` its targets are V-trace's where older weights acted
  (``targets=auto``: GAE's had ended below on every seed of six at 300k steps).
- Ant-v5: HalfCheetah's with 16 envs, 20 epochs, lr 2e-4, lambda 0.98, clip 0.1, log
  std from -2 and gradients clipped at 1, chosen by ``benchmarks/search_presets.py``
  (the worst of 3 seeds after 2 minutes: 1,572 against HalfCheetah's settings' 1,053)
  and kept at 1M steps (``benchmarks/bench_presets.py``: deterministic evaluation
  2,376-2,470 on 3 seeds against 1,516-3,476, in about 5 minutes a run; RL Zoo's
  published PPO: 1,327).
- Hopper-v5: CleanRL's MuJoCo settings on 16 envs x 512 steps, lr 1e-4 (constant),
  gamma 0.995, clip 0.3, log std from -1, 128x128 ReLU, gradients clipped at 1, chosen
  by ``benchmarks/search_presets.py`` (the worst of 3 seeds after 2 minutes: 2,571
  against the preset before's 1,603: CleanRL's with minibatches of 64) and kept at 1M
  steps (deterministic evaluation 3,274-3,442 on 3 seeds against 1,469-3,204, under 3
  minutes a run; RL Zoo's published PPO: 2,410).
- Walker2d-v5: CleanRL's with minibatches of 64 (CleanRL's 32 gradient steps a
  rollout's epoch), chosen at 1M steps against minibatches of 256 and kept by the search
  (the worst of 3 seeds after 2 minutes: 2,386, the best of the 8 candidates tried);
  deterministic evaluation at 1M steps 4,672 median, 3,354 the worst, about 3.5 minutes
  a run (RL Zoo's: 3,479).
- ALE/*-v5 (Pong): CleanRL's ``ppo_atari`` (8 envs, n_steps 128, 4 epochs, 4
  minibatches, lr 2.5e-4 annealed, clip 0.1, ent 0.01), with ``frameskip=1,
  repeat_action_probability=0`` and ``AtariPreprocessing(frame_skip=4, screen_size=84,
  grayscale_obs=True, noop_max=30)`` + ``FrameStackObservation(4)``; two batch groups
  (``env_groups=2``: the CNN acts on one while the other steps; 1.04x lock-step's wall
  time here, ``benchmarks/results/train_groups``; MLP presets stay in lock-step, where
  groups were slower: 0.89x on HalfCheetah).

Envs ``fastvec train`` registers with gymnasium (on import of ``fastvec.train``).

- ``CartPoleNoVel-v1``: CartPole-v1 observed without its velocities (the cart's
  position and the pole's angle only), as RL Zoo defines it: a task that needs memory,
  since one observation does not tell which way the pole is falling. 500 steps, solved
  at a mean return of 475. Registered only where no package registered the id first.
- POPGym's envs (``popgym-RepeatPreviousEasy-v0`` and the rest, Morad et al., ICLR 2023),
  where popgym is installed: importing it registers its ids with gymnasium, and the
  workers import this module before they make an env, so ``fastvec train popgym-...``
  works as for a gymnasium id. Not installed (or failing to import), nothing is
  registered and ``fastvec.train`` imports as before.
"""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from ...composite_actions import flat_actions_factory
from ...env_ids import env_id_problem, env_problem, is_atari, make_entry_env, own_env_kind, registered_spec
from .rules import ConfigError

__all__ = [
    "PRESETS",
    "preset_for",
    "env_factory",
    "check_env_id",
    "check_env",
    "is_atari",
    "solve_threshold",
    "CartPoleNoVel",
    "HAS_POPGYM",
]

# CleanRL's MuJoCo settings on 8 envs x 256 steps (its 2,048-sample rollout).
_CLEANRL_MUJOCO = dict(
    num_envs=8,
    n_steps=256,
    n_epochs=10,
    minibatch_size=256,
    lr=3e-4,
    gamma=0.99,
    gae_lambda=0.95,
    clip_coef=0.2,
    ent_coef=0.0,
    normalize_obs=True,
    normalize_reward=True,
    total_steps=1_000_000,
    solve_return=None,
)

# RL Zoo's CartPole hyperparameters (SB3 PPO), for comparison runs of this trainer.
# vf_coef=1.0 here is SB3's vf_coef=0.5: this trainer's value loss has a 0.5 factor
# (CleanRL), SB3's does not.
ZOO_CARTPOLE = dict(
    num_envs=8,
    num_workers=1,
    n_steps=32,
    n_epochs=20,
    minibatch_size=256,
    lr=1e-3,
    anneal_lr=True,
    gamma=0.98,
    gae_lambda=0.8,
    clip_coef=0.2,
    anneal_clip=True,
    clip_vf=None,
    ent_coef=0.0,
    vf_coef=1.0,
    total_steps=100_000,
    solve_return=475.0,
)


PRESETS: dict[str, dict] = {
    "CartPole-v1": dict(
        num_envs=8,
        num_workers=1,
        n_steps=32,
        n_epochs=3,
        minibatch_size=64,
        lr=5e-3,
        anneal_lr=False,
        gamma=0.98,
        gae_lambda=0.8,
        clip_coef=0.2,
        clip_vf=None,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        total_steps=200_000,
        solve_return=475.0,
    ),
    "Acrobot-v1": dict(
        num_envs=16,
        n_steps=256,
        n_epochs=4,
        minibatch_size=1024,
        lr=1e-3,
        gamma=0.99,
        gae_lambda=0.94,
        ent_coef=0.0,
        normalize_obs=True,
        total_steps=1_000_000,
        solve_return=-100.0,
    ),
    "InvertedPendulum-v5": dict(
        num_envs=8,
        n_steps=16,
        n_epochs=3,
        minibatch_size=64,
        lr=3e-3,
        anneal_lr=False,
        gamma=0.98,
        gae_lambda=0.9,
        clip_coef=0.2,
        clip_vf=None,
        ent_coef=0.0,
        total_steps=500_000,
        solve_return=950.0,
    ),
    # Chosen by benchmarks/search_presets.py: a narrower start (log std -1) and a constant rate
    "HalfCheetah-v5": {**_CLEANRL_MUJOCO, "log_std_init": -1.0, "lr_schedule": "constant", "targets": "auto"},
    # Chosen by the same search: a narrower start still, smaller and more careful steps
    "Ant-v5": {
        **_CLEANRL_MUJOCO,
        "num_envs": 16,
        "n_epochs": 20,
        "lr": 2e-4,
        "gae_lambda": 0.98,
        "clip_coef": 0.1,
        "log_std_init": -2.0,
        "max_grad_norm": 1.0,
        "lr_schedule": "constant",
    },
    # Chosen by the same search: twice the envs and 4x the rollout, a gentler, constant rate,
    # a longer horizon, a wider clip, log std from -1 and a 128x128 ReLU network
    "Hopper-v5": {
        **_CLEANRL_MUJOCO,
        "num_envs": 16,
        "n_steps": 512,
        "lr": 1e-4,
        "gamma": 0.995,
        "clip_coef": 0.3,
        "log_std_init": -1.0,
        "hidden": (128, 128),
        "activation": "relu",
        "max_grad_norm": 1.0,
        "lr_schedule": "constant",
    },
    # CleanRL's with CleanRL's 32 minibatches an epoch; the search found nothing better
    "Walker2d-v5": {**_CLEANRL_MUJOCO, "minibatch_size": 64},
    "ALE/Pong-v5": dict(
        num_envs=8,
        n_steps=128,
        n_epochs=4,
        minibatch_size=256,
        lr=2.5e-4,
        gamma=0.99,
        gae_lambda=0.95,
        clip_coef=0.1,
        clip_vf=0.1,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        total_steps=10_000_000,
        solve_return=18.0,
        env_groups=2,
    ),
}
# Needs memory: an LSTM. RL Zoo's RecurrentPPO settings for the env are its CartPole ones;
# here with 16 envs, rollouts of 64 steps and 10 epochs instead of 8, 32 and 20 (see above)
PRESETS["CartPoleNoVel-v1"] = {
    **ZOO_CARTPOLE,
    "num_envs": 16,
    "n_steps": 64,
    "n_epochs": 10,
    "hidden": (64,),
    "activation": "relu",
    "ortho_init": False,
    "normalize_obs": True,
    "policy_core": "lstm",
    "core_size": 64,
    "total_steps": 300_000,
}
# Needs memory: the suit of the card dealt 3 cards before the one shown (an MLP guesses: -0.5).
# A step's reward hangs on its own action only, hence the short horizon (see above)
PRESETS["popgym-RepeatPreviousEasy-v0"] = dict(
    num_envs=16,
    n_steps=64,
    n_epochs=10,
    minibatch_size=256,
    lr=1e-3,
    gamma=0.5,
    gae_lambda=0.8,
    ent_coef=0.0,
    hidden=(64,),
    activation="relu",
    policy_core="lstm",
    core_size=64,
    total_steps=200_000,
    solve_return=0.95,
)
# PettingZoo's MPE simple_spread (fastvec.env_ids' pettingzoo: ids): one policy over every
# agent's row; chosen from 4 candidates on 3 seeds at 200k agent steps (mean training
# return per agent -19.7 to -21.0 against the defaults' -20.9 to -23.4; random play -27).
PRESETS["pettingzoo:mpe2.simple_spread_v3"] = {
    "num_envs": 16,
    "n_steps": 128,
    "n_epochs": 4,
    "lr": 1e-3,
    "minibatch_size": 512,
    "normalize_obs": True,
    "return_window": 100,
}
# Every other ALE id gets the Atari defaults (Pong's preset without its threshold).
_ATARI_DEFAULTS = {**PRESETS["ALE/Pong-v5"], "solve_return": None}


def check_env_id(env_id: str) -> None:
    """Raise ValueError with a one-line message if ``env_id`` names no env
    (``fastvec.env_ids.env_id_problem``: it builds none)."""
    why = env_id_problem(env_id)
    if why is not None:
        raise ValueError(why)


def check_env(env_id: str, env_kwargs: dict | None = None) -> None:
    """``check_env_id``, and for an entry point (``MODULE:CALLABLE``) one env built in
    this process with ``env_kwargs``: ConfigError, one line, where it fails to build or is
    no ``gymnasium.Env`` (``fastvec.env_ids.env_problem``); the same where settings are
    given for any other id (one env built with them)."""
    why = env_problem(env_id, env_kwargs)
    if why is not None:
        raise ConfigError(why)


def preset_for(env_id: str, zoo: bool = False) -> dict:
    """Config overrides for ``env_id`` (an empty dict for ids without a preset)."""
    if zoo and env_id == "CartPole-v1":
        return dict(ZOO_CARTPOLE)
    if env_id in PRESETS:
        return dict(PRESETS[env_id])
    if is_atari(env_id):
        return dict(_ATARI_DEFAULTS)
    return {}


def solve_threshold(env_id: str) -> float | None:
    """The mean return that counts ``env_id`` as solved: its preset's ``solve_return``,
    else gymnasium's ``reward_threshold``; None where neither says."""
    p = preset_for(env_id)
    if p.get("solve_return") is not None:
        return float(p["solve_return"])
    spec = registered_spec(env_id)
    return None if spec is None else spec.reward_threshold


def _make_plain(env_id: str, env_kwargs: dict):
    return gym.make(env_id, **env_kwargs)


def _make_atari(env_id: str, env_kwargs: dict):
    import ale_py

    gym.register_envs(ale_py)
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    kwargs: dict = dict(frameskip=1, repeat_action_probability=0.0)
    kwargs.update(env_kwargs)
    env = gym.make(env_id, **kwargs)
    env = AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30)
    return FrameStackObservation(env, 4)


def env_factory(env_id: str, env_kwargs: dict | None = None):
    """A picklable zero-argument callable that builds one env for ``env_id``, as the
    trainer steps it: a ``Dict``/``Tuple`` action space taken as one flat vector
    (``fastvec.composite_actions.FlatActions``)."""
    env_kwargs = dict(env_kwargs or {})
    if own_env_kind(env_id) == "entry":
        fn = functools.partial(make_entry_env, env_id, env_kwargs)
    elif is_atari(env_id):
        return functools.partial(_make_atari, env_id, env_kwargs)
    else:
        fn = functools.partial(_make_plain, env_id, env_kwargs)
    return flat_actions_factory(fn)


class CartPoleNoVel(CartPoleEnv):
    """CartPole whose observation is ``(x, theta)``: the velocities are left out."""

    def __init__(self, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        full = self.observation_space
        assert isinstance(full, gym.spaces.Box)
        keep = [0, 2]  # x, theta
        self.observation_space = gym.spaces.Box(full.low[keep], full.high[keep], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return obs[[0, 2]], info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs[[0, 2]], reward, terminated, truncated, info


if "CartPoleNoVel-v1" not in gym.registry:
    gym.register(
        "CartPoleNoVel-v1",
        entry_point="fastvec.train.config.presets:CartPoleNoVel",
        max_episode_steps=500,
        reward_threshold=475.0,
    )


try:  # registers popgym-*-v0 (8 ms; it needs only numpy and gymnasium)
    import popgym  # noqa: F401

    HAS_POPGYM = True
except Exception:  # not installed, or a broken install: its ids stay unknown
    HAS_POPGYM = False
