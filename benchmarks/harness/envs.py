"""Env factories for the benchmarks (module-level, so every start method can pickle them).

- :func:`make_gym`: ``gymnasium.make(env_id, **kwargs)``.
- :func:`workload_envs`: the env factory of the ``pong`` and ``halfcheetah`` workloads of
  ``ceilings.py`` and ``bench_batches.py``.
- :func:`make_pong`: ``ALE/Pong-v5`` with ``frameskip=1, repeat_action_probability=0``,
  wrapped in ``AtariPreprocessing(frame_skip=4, screen_size=84, grayscale_obs=True,
  noop_max=30)`` and ``FrameStackObservation(4)``: the usual DQN/PPO Atari stack.
- :class:`LargeObsEnv`: a synthetic env with trivial dynamics and a large observation
  (1 MiB float32 by default), so that moving observations between processes dominates.
- :class:`BusyEnv`: a synthetic env whose step costs a set number of microseconds of
  CPU, per instance (``bench_placement.py``: envs of uneven cost).
- :func:`metaworld_mt10`: Meta-World's MT10, one env factory per task as its own
  ``make_mt_envs`` builds them (one-hot task ids), ``per_task`` of each, task by task
  (needs ``metaworld``, which pins its own MuJoCo: a venv of its own).
"""

from __future__ import annotations

import functools
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


def make_gym(env_id: str, **kwargs):
    return gym.make(env_id, **kwargs)


def metaworld_mt10(per_task: int = 1, seed: int = 0) -> list:
    import metaworld

    bench = metaworld.MT10(seed=seed)
    fns = []
    for i, (name, cls) in enumerate(bench.train_classes.items()):
        tasks = [t for t in bench.train_tasks if t.env_name == name]
        make = functools.partial(
            metaworld._init_each_env, env_cls=cls, tasks=tasks, seed=seed, env_id=i, num_tasks=10, use_one_hot=True
        )
        fns += [make] * per_task
    return fns


def make_pong():
    import ale_py
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0)
    env = AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30)
    return FrameStackObservation(env, 4)


def workload_envs(workload: str):
    """The env factory of a workload: ``"pong"`` (:func:`make_pong`) or ``"halfcheetah"``."""
    return {"pong": make_pong, "halfcheetah": functools.partial(make_gym, "HalfCheetah-v5")}[workload]


class LargeObsEnv(gym.Env):
    """Trivial dynamics, large observations.

    The observation is one of ``num_frames`` pre-made frames (a fresh copy each step, as
    real envs return fresh arrays), so the cost of a step is mostly the copy of
    ``prod(obs_shape) * itemsize`` bytes plus the vector env's own transport.
    Episodes end (``terminated``) after ``episode_len`` steps; actions are ``Discrete(2)``.

    Parameters
    ----------
    obs_shape : tuple, default (256, 1024)
        With ``dtype="float32"``, 1 MiB per observation. ``(3, 210, 160)`` with
        ``dtype="uint8"`` is an Atari RGB frame (100 KB).
    dtype : str, default "float32"
    episode_len : int, default 200
    """

    metadata = {"render_modes": []}

    def __init__(self, obs_shape=(256, 1024), dtype="float32", episode_len=200, num_frames=4):
        self.obs_shape = tuple(int(s) for s in obs_shape)
        dt = np.dtype(dtype)
        if np.issubdtype(dt, np.integer):
            info = np.iinfo(dt)
            self.observation_space = spaces.Box(int(info.min), int(info.max), self.obs_shape, dt)
        else:
            self.observation_space = spaces.Box(-np.inf, np.inf, self.obs_shape, dt)
        self.action_space = spaces.Discrete(2)
        self.episode_len = int(episode_len)
        rng = np.random.default_rng(0)
        if np.issubdtype(dt, np.integer):
            frames = rng.integers(0, 256, (num_frames, *self.obs_shape), dtype=np.uint8).astype(dt)
        else:
            frames = rng.standard_normal((num_frames, *self.obs_shape)).astype(dt)
        self._frames = frames
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._frames[0].copy(), {}

    def step(self, action):
        self._t += 1
        obs = self._frames[self._t % len(self._frames)].copy()
        reward = float(action)
        terminated = self._t >= self.episode_len
        return obs, reward, terminated, False, {}


def make_large_obs(obs_shape=(256, 1024), dtype="float32", episode_len=200):
    return LargeObsEnv(obs_shape=obs_shape, dtype=dtype, episode_len=episode_len)


class BusyEnv(gym.Env):
    """An env whose step burns ``step_us`` microseconds of CPU (set per instance: the
    uneven costs of mixed tasks, settings or levels), with a 4-float observation and
    episodes of ``episode_len`` steps."""

    metadata = {"render_modes": []}
    observation_space = spaces.Box(-np.inf, np.inf, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, step_us: float = 250.0, episode_len: int = 200):
        self.step_us = float(step_us)
        self.episode_len = int(episode_len)
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        until = time.perf_counter_ns() + int(self.step_us * 1e3)
        while time.perf_counter_ns() < until:
            pass
        self._t += 1
        obs = np.full(4, self._t, np.float32)
        return obs, 0.0, False, self._t >= self.episode_len, {}
