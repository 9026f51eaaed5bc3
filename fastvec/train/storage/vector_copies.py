"""Rollout storage over a vector env the caller owns (``fastvec.train.storage.sources``'
protocol): own ``[T + 1, N, ...]`` arrays with the engine's layout, into which each reset
and step copies the vector env's results (how the benchmarks compare the transports).

- ``GymVectorStorage``: a gymnasium ``VectorEnv`` with same-step autoreset;
- ``SB3VecStorage``: a ``step_async`` / ``step_wait`` vector env (SB3's ``VecEnv``, or a
  baselines-style ``SubprocVecEnv``);
- ``storage_for(venv)`` picks one. Plain (non Dict/Tuple) spaces only, and no action masks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._core.segment import leaves_of
from ..compute.pinned import alloc
from ..config.seeding import seeds_for
from .sources import RolloutStorage, single_leaf

__all__ = ["CopyStorage", "GymVectorStorage", "SB3VecStorage", "storage_for"]


class CopyStorage:
    """Own buffers with the engine's layout, filled from another vector env, which steps
    every env in lock-step: one batch group, no restarts of its own, no wait counts."""

    kind: str
    num_envs: int
    num_workers: int | None
    single_observation_space: Any
    single_action_space: Any
    on_restart: Callable[[], None] | None = None  # never called: the vector env restarts nothing here
    active: np.ndarray | None = None
    action_mask: np.ndarray | None = None  # (a vector env of your own: no masks)

    def _alloc_arrays(self, num_slots: int, pin: bool) -> None:
        single_leaf(self.single_observation_space, "observation", " from a vector env of your own (pass an env id)")
        single_leaf(self.single_action_space, "action")
        (o,), (a,) = leaves_of(self.single_observation_space), leaves_of(self.single_action_space)
        S, N = num_slots, self.num_envs
        self.obs = alloc((S, N, *o.shape), o.dtype, pin)
        self.final_obs = alloc((S, N, *o.shape), o.dtype, pin)
        self.act = alloc((S, N, *a.shape), a.dtype, pin)
        self.rewards = alloc((S, N), np.float64, pin)
        self.terminated = alloc((S, N), np.bool_, pin)
        self.truncated = alloc((S, N), np.bool_, pin)

    worker_pids: list = []

    @property
    def restarts(self) -> list[dict]:  # the caller's vector env does its own fault handling
        return []

    @property
    def groups(self) -> list[tuple[int, int]]:
        return [(0, self.num_envs)]

    step: Callable[[int], None]  # each vector env's own: step it on act[slot], copy its results into slot

    def arrays(self) -> list[np.ndarray]:
        return []  # already pinned at allocation when needed

    def send(self, g: int, slot: int) -> None:
        self.step(slot)  # the only group: the whole step, done when this returns

    def recv(self, g: int, slot: int) -> None:
        pass  # send's step is already done

    def lost_wakeups(self) -> None:
        return None

    def transport(self) -> dict:
        return {
            "num_workers": self.num_workers,
            "main_spin_us": None,
            "env_groups": 1,
            "backend": self.kind,
            "placement": None,
        }

    def close(self) -> None:  # the caller owns the vector env
        pass


class GymVectorStorage(CopyStorage):
    """A gymnasium ``VectorEnv`` with same-step autoreset (``info["final_obs"]``)."""

    kind = "gymnasium"

    def __init__(self, venv, num_slots: int, pin: bool = False):
        from gymnasium.vector import AutoresetMode

        mode = venv.metadata.get("autoreset_mode", None)
        if mode not in (AutoresetMode.SAME_STEP, "same_step", "SameStep"):
            raise ValueError(
                "the PPO trainer needs a gymnasium VectorEnv with "
                "autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP, got "
                f"{mode!r}"
            )
        self.venv = venv
        self.num_envs = self.num_seeds = venv.num_envs
        self.single_observation_space = venv.single_observation_space
        self.single_action_space = venv.single_action_space
        self.num_workers = getattr(venv, "num_workers", None)
        self._alloc_arrays(num_slots, pin)
        self.worker_pids = [p.pid for p in getattr(venv, "processes", [])]

    def reset(self, seed):
        if seed is not None and not isinstance(seed, (int, np.integer)):  # one per env: a list
            seed = seeds_for(seed, self.num_envs)
        obs, _ = self.venv.reset(seed=seed)
        self.obs[0] = obs

    def step(self, slot):
        obs, rew, term, trunc, info = self.venv.step(self.act[slot])
        self.obs[slot] = obs
        self.rewards[slot] = rew
        self.terminated[slot] = term
        self.truncated[slot] = trunc
        mask = info.get("_final_obs")
        if mask is not None and mask.any():
            fo = info["final_obs"]
            for i in np.flatnonzero(mask):
                self.final_obs[slot, i] = fo[i]


class SB3VecStorage(CopyStorage):
    """A ``step_async`` / ``step_wait`` vector env: SB3's ``VecEnv`` API (``step`` ->
    obs, rewards, dones, infos, truncation in ``infos[i]["TimeLimit.truncated"]``) or a
    baselines-style ``SubprocVecEnv`` with gymnasium's 5-tuple (``step`` -> obs,
    rewards, terminated, truncated, infos). Either way the final observation of an
    ended episode must be in ``infos[i]["terminal_observation"]`` (or ``"final_obs"``):
    without it a truncated episode cannot be bootstrapped."""

    kind = "subproc"

    def __init__(self, venv, num_slots: int, pin: bool = False):
        self.venv = venv
        self.num_envs = self.num_seeds = venv.num_envs
        self.single_observation_space = venv.observation_space
        self.single_action_space = venv.action_space
        procs = getattr(venv, "processes", None) or getattr(venv, "ps", None) or []
        self.num_workers = len(procs) or None
        self._alloc_arrays(num_slots, pin)
        self.worker_pids = [p.pid for p in procs]

    def reset(self, seed):
        """SB3's ``VecEnv.seed(seed)`` takes one int and seeds env i with ``seed + i``
        (a baselines-style ``reset(seed=...)`` too): given one seed per env, env 0's
        is that int and env i gets it ``+ i``, not its own."""
        import inspect

        seeds = seeds_for(seed, self.num_envs)
        seed = None if seeds is None else seeds[0]
        try:
            takes_seed = "seed" in inspect.signature(self.venv.reset).parameters
        except (TypeError, ValueError):
            takes_seed = False
        if takes_seed:
            out = self.venv.reset(seed=seed)
        else:  # SB3: seed() then reset()
            if seed is not None:
                self.venv.seed(seed)
            out = self.venv.reset()
        self.obs[0] = out[0] if isinstance(out, tuple) else out

    def step(self, slot):
        out = self.venv.step(self.act[slot])
        if len(out) == 5:
            obs, rew, term, trunc, infos = out
            self.terminated[slot] = term
            self.truncated[slot] = trunc
            done = np.logical_or(term, trunc)
        else:
            obs, rew, done, infos = out
            self.terminated[slot] = done
            self.truncated[slot] = False
        self.obs[slot] = obs
        self.rewards[slot] = rew
        if done.any():
            for i in np.flatnonzero(done):
                info = infos[i]
                final = info.get("terminal_observation", info.get("final_obs"))
                if final is None:
                    raise ValueError(
                        f"{type(self.venv).__name__} does not report the final observation of an "
                        "ended episode (infos[i]['terminal_observation']); the trainer needs it"
                    )
                self.final_obs[slot, i] = final
                if len(out) == 4 and info.get("TimeLimit.truncated", False):
                    self.truncated[slot, i] = True
                    self.terminated[slot, i] = False


def storage_for(venv, num_slots: int, pin: bool = False):
    """Wrap a vector env the trainer did not create itself."""
    import gymnasium as gym

    if isinstance(venv, gym.vector.VectorEnv):
        return GymVectorStorage(venv, num_slots, pin)
    if hasattr(venv, "step_async") and hasattr(venv, "step_wait") and hasattr(venv, "num_envs"):
        return SB3VecStorage(venv, num_slots, pin)
    raise ValueError(f"cannot train on {type(venv).__name__}: give a gymnasium VectorEnv or an SB3 VecEnv")


if TYPE_CHECKING:  # each storage implements the protocol (a type checker verifies it here)

    def _implements(s: GymVectorStorage | SB3VecStorage) -> RolloutStorage:
        return s
