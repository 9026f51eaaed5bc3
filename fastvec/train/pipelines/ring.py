"""The engine's ring as K rollouts, for the async pipeline: rollout r fills section
``r % K`` (``RingSection``) while the learner reads another."""

from __future__ import annotations

import numpy as np

from ..config.settings import PPOConfig

__all__ = ["RingSection", "ring_slots", "check_ring", "start_where_left"]


def ring_slots(cfg: PPOConfig) -> int:
    """The engine ring's slots for ``cfg``: ``T + 1`` in lock-step, K of those in async."""
    k = cfg.rollout_buffers if cfg.pipeline == "async" else 1
    return k * (cfg.n_steps + 1)


def check_ring(cfg: PPOConfig, storage) -> None:
    """ValueError unless ``storage`` can serve ``cfg``'s pipeline: async needs an engine's
    ring on this machine, sized for its K rollouts."""
    if cfg.pipeline != "async":
        return
    if getattr(storage, "kind", None) != "fastvec" or not hasattr(getattr(storage, "engine", None), "segment_entries"):
        raise ValueError(
            f"pipeline=async needs fastvec's engine on this machine (its learner maps the ring), not {storage.kind!r}"
        )
    want = ring_slots(cfg)
    if storage.obs.shape[0] != want:
        raise ValueError(
            f"pipeline=async with rollout_buffers={cfg.rollout_buffers} needs an engine ring of "
            f"{want} slots (K x (n_steps + 1)), this one has {storage.obs.shape[0]}"
        )


def start_where_left(last, nxt, T: int) -> None:
    """Storage ``nxt``'s slot 0 is storage ``last``'s slot T (the same one in lock-step,
    the ring's previous section in async): the observations, their action masks and (agents)
    which rows act."""
    np.copyto(nxt.obs[0], last.obs[T])
    if getattr(last, "action_mask", None) is not None:
        np.copyto(nxt.action_mask[0], last.action_mask[T])
    if getattr(last, "active", None) is not None:
        np.copyto(nxt.active[0], last.active[T])


class RingSection:
    """Section k of an ``EngineStorage`` whose ring holds K rollouts: the
    ``RolloutStorage`` protocol over slots ``[k (T + 1), (k + 1) (T + 1))``, so ``PPO``
    acts into it and learns from it as from a ring of its own."""

    def __init__(self, storage, k: int, T: int):
        self.storage, self.base = storage, k * (T + 1)
        rows = slice(self.base, self.base + T + 1)
        self.obs, self.final_obs, self.act = storage.obs[rows], storage.final_obs[rows], storage.act[rows]
        self.rewards, self.terminated, self.truncated = (
            storage.rewards[rows],
            storage.terminated[rows],
            storage.truncated[rows],
        )
        active = getattr(storage, "active", None)  # (agents: the rows that act)
        self.active = None if active is None else active[rows]
        masks = getattr(storage, "action_mask", None)
        self.action_mask = None if masks is None else masks[rows]
        self.kind, self.num_envs, self.num_workers = storage.kind, storage.num_envs, storage.num_workers
        self.num_seeds = getattr(storage, "num_seeds", storage.num_envs)  # (the learner's ring: no resets)
        self.single_observation_space = storage.single_observation_space
        self.single_action_space = storage.single_action_space

    @property
    def on_restart(self):
        return self.storage.on_restart

    @on_restart.setter
    def on_restart(self, fn) -> None:
        self.storage.on_restart = fn

    @property
    def groups(self):
        return self.storage.groups

    @property
    def restarts(self):
        return self.storage.restarts

    @property
    def worker_pids(self):
        return self.storage.worker_pids

    def arrays(self) -> list:
        return []  # the whole ring is the storage's to pin

    def reset(self, seed) -> None:
        """Reset every env into this section's first slot (one seed per env, or an int)."""
        self.storage.reset(seed, slot=self.base)

    def step(self, slot: int) -> None:
        self.storage.step(self.base + slot)

    def send(self, g: int, slot: int) -> None:
        self.storage.send(g, self.base + slot)

    def recv(self, g: int, slot: int) -> None:
        self.storage.recv(g, self.base + slot)

    def lost_wakeups(self):
        return self.storage.lost_wakeups()

    def transport(self) -> dict:
        return self.storage.transport()

    def close(self) -> None:
        self.storage.close()
