"""Schedules: when a run collects and when it learns.

A run (``fastvec.train.run.loop``) asks its schedule, iteration after iteration, to
``collect`` a rollout and then to ``learn`` on it, and at its safe points for what a
checkpoint holds. Two schedules answer:

- ``LockStep`` (``pipeline=lockstep``): collect, then prepare and update, in this
  process, one after the other;
- ``fastvec.train.pipelines.collector.Pipeline`` (``pipeline=async``): collect here while a learner
  process learns on the rollout before; ``learn`` hands the rollout over.

Both keep the ``Schedule`` protocol below; nothing else in a run depends on which.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import torch

from ..algo.ppo import PPO
from ..compute.pinned import HostPin
from ..compute.ranks import SOLO, Ranks
from ..config.settings import PPOConfig
from .ring import RingSection, start_where_left

__all__ = ["Saved", "Schedule", "LockStep", "trainer_for"]


class Saved(NamedTuple):
    """What a checkpoint writes: ``holder`` has what ``save_checkpoint`` reads of a
    ``PPO`` (``policy``, ``cfg``, ``storage``, ``env_steps``), ``state`` the train state."""

    holder: Any
    state: dict


class Schedule(Protocol):
    ppo: PPO
    """The trainer that acts in this process (the collector's, in async)."""

    def collect(self) -> None:
        """The next rollout, once its turn has come."""

    def learn(self) -> None:
        """Learn on the rollout just collected (or have it learned)."""

    def safe_point(self) -> Saved | None:
        """What a checkpoint at this safe point holds (None: nothing learned to keep yet)."""

    def after_failure(self, phase: str, rng: dict | None) -> Saved | None:
        """What to keep after a failure in ``phase`` (``rng``: the RNG state of the last
        safe point); None where the state is not whole."""

    def finish(self) -> None:
        """The run ends: everything collected and handed over is learned."""

    def summary(self) -> dict:
        """The last update's losses etc."""

    def stats(self, now: float) -> dict | None:
        """The schedule's own figures (``pipeline_stats``); None for none."""

    def close(self) -> None:
        """Release what the schedule holds. Safe to call twice."""


def trainer_for(cfg: PPOConfig, storage, device: torch.device, policy=None, ranks: Ranks = SOLO) -> PPO:
    """The ``PPO`` this process acts with: over the storage on the learner's ``device``
    (lock-step; ``ranks``: this rank's of a data-parallel run), or over the ring's first
    section on the CPU (async: the learner process has the device, and the collector acts
    into shared memory)."""
    if cfg.pipeline == "async":
        return PPO(cfg, RingSection(storage, 0, cfg.n_steps), torch.device("cpu"), policy, ranks=ranks)
    return PPO(cfg, storage, device, policy, ranks=ranks)


class LockStep:
    """Collect, then learn, in this process. On CUDA the storage's arrays are page-locked
    for the rollouts' asynchronous copies to the device."""

    def __init__(self, ppo: PPO):
        self.ppo = ppo
        self.pin = None
        if ppo.device.type == "cuda":
            torch.backends.cudnn.benchmark = True
            arrays = ppo.storage.arrays()
            self.pin = HostPin(arrays) if arrays else None

    def collect(self) -> None:
        self.ppo.collect()

    def learn(self) -> None:
        ppo = self.ppo
        ppo.prepare()
        ppo.update()
        start_where_left(ppo.storage, ppo.storage, ppo.T)  # the next rollout starts where this one ended

    def safe_point(self) -> Saved:
        return Saved(self.ppo, self.ppo.train_state())

    def after_failure(self, phase: str, rng: dict | None) -> Saved | None:
        """The envs failed while collecting (or at the safe point before): the state of
        the last safe point is whole (its RNG state kept from there); after that the
        update was half done."""
        if phase not in ("collect", "safe point"):
            return None
        return Saved(self.ppo, self.ppo.train_state(rng if phase == "collect" else None))

    def finish(self) -> None:
        pass

    def summary(self) -> dict:
        return self.ppo.summarize()

    def stats(self, now: float) -> None:
        return None

    def close(self) -> None:
        if self.pin is not None:
            self.pin.release()
            self.pin = None
