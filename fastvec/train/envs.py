"""Envs ``fastvec train`` registers with gymnasium (on import of ``fastvec.train``).

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

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

__all__ = ["CartPoleNoVel", "HAS_POPGYM"]


class CartPoleNoVel(CartPoleEnv):
    """CartPole whose observation is ``(x, theta)``: the velocities are left out."""

    def __init__(self, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        full = self.observation_space
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
        entry_point="fastvec.train.envs:CartPoleNoVel",
        max_episode_steps=500,
        reward_threshold=475.0,
    )


try:  # registers popgym-*-v0 (8 ms; it needs only numpy and gymnasium)
    import popgym  # noqa: F401

    HAS_POPGYM = True
except Exception:  # not installed, or a broken install: its ids stay unknown
    HAS_POPGYM = False
