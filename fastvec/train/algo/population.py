"""A population: K members, each its own PPO run, on one storage's envs.

Member k's ``PPO`` acts into and learns from its own rows of the storage
(``fastvec.train.storage.member_rows``), with its own weights, optimiser, normalisers,
statistics and random numbers: what it computes is what a run alone with its seed and
settings computes. The population does what the members share: it steps every member's
envs at once (one engine step per time step for all of them, so the workers, the
doorbells and the waits are paid once), and it keeps each member's RNG state, swapped
in around whatever the member draws (its initial weights, its sampling noise, its
minibatch permutations), so that member k draws the stream its run alone would.

A member that has finished (solved, or out of steps) no longer acts or learns; its envs
are paused (``MemberEnvs.pause``: its workers no longer step them) where the engine can
pause them, else they step on its last actions, their results unread.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch

from ..storage.member_rows import MemberEnvs
from .stacked import StackedActor, StackedMembers

__all__ = ["Population", "copy_member"]


def _torch_rng() -> tuple:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_torch_rng(state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None and torch.cuda.is_initialized():
        torch.cuda.set_rng_state_all(state[1])


class Population:
    """K members over ``envs`` (``MemberEnvs``): ``seed`` and ``as_member`` give each its
    random numbers, ``ppos[k]`` is member k's trainer once it is built, ``collect`` runs a
    rollout for the members named."""

    def __init__(self, envs: MemberEnvs):
        self.envs = envs
        self.size = len(envs.rows)
        self.ppos: list = [None] * self.size
        self._rng: list[tuple | None] = [None] * self.size
        self._current: int | None = None
        self._stacked: StackedMembers | None = None
        self._actor: StackedActor | None = None  # every member acting in one batched pass

    def seed(self, k: int, seed: int) -> None:
        """Member k's random numbers start as a run alone's with ``seed`` (torch's and
        numpy's global generators seeded with it, as ``fastvec train`` seeds them)."""
        outer = _torch_rng()
        torch.manual_seed(seed)
        np.random.seed(seed)  # (drawn from by nothing in the trainer: not swapped below)
        self._rng[k] = _torch_rng()
        _set_torch_rng(outer)

    @contextlib.contextmanager
    def as_member(self, k: int):
        """Inside, torch's generators (the CPU's, and CUDA's where it is in use) are
        member k's; on leaving, what the member drew is kept for its next turn and the
        generators are as before. (Numpy's global generator, seeded as a run alone seeds
        it, is not swapped: the trainer draws nothing from it, and its state costs ten
        times torch's to read and write.)"""
        if self._rng[k] is None:
            raise RuntimeError(f"member {k} was not seeded")
        if self._current is not None:
            raise RuntimeError(f"member {k}'s turn inside member {self._current}'s")
        outer = _torch_rng()
        _set_torch_rng(self._rng[k])
        self._current = k
        try:
            yield
        finally:
            self._rng[k] = _torch_rng()
            self._current = None
            _set_torch_rng(outer)

    def freeze_actions(self, k: int, action) -> None:
        """Member k acts no more: its envs step on ``action`` (a valid one of the space)."""
        self.envs.rows[k].act[...] = np.asarray(action, dtype=self.envs.rows[k].act.dtype)

    def stack(self) -> str | None:
        """From now on the members learn at once where they can
        (``fastvec.train.algo.stacked``); None if they do, else why they learn one by one."""
        ppos = {k: ppo for k, ppo in enumerate(self.ppos) if ppo is not None}
        self._stacked = StackedMembers.adopt(ppos)
        every = len(ppos) == self.size and self._stacked is not None
        if every and StackedActor.why_not(list(ppos.values())) is None:  # (acting at once too)
            base = self.envs.storage
            self._actor = StackedActor(self._stacked, base.obs, base.act)
        return None if self._stacked is not None else (StackedMembers.why_not(list(ppos.values())) or "one member")

    @property
    def acts_at_once(self) -> bool:
        """Whether the members act in one batched pass while all of them run."""
        return self._actor is not None

    def learn(self, members: list[int]) -> None:
        """The members named learn from the rollout just collected: each its targets,
        then their updates (at once where stacked, else one by one), each with its own
        random numbers."""
        for k in members:
            with self.as_member(k):
                self.ppos[k].prepare()
        # (the batched pass computes every member's rows: worth it while most learn)
        if self._stacked is not None and 1 < len(members) and 2 * len(members) > len(self._stacked.row):
            self._stacked.update(members, self.as_member)
            return
        for k in members:
            with self.as_member(k):
                self.ppos[k].update()

    def collect(self, members: list[int]) -> None:
        """One rollout of T steps on every env: the members named act (each its
        sampling noise drawn from its own stream first), the others' envs step on their
        last actions; each acting member's steps and episodes are counted as its own."""
        ppos = [self.ppos[k] for k in members]
        for k, ppo in zip(members, ppos):
            with self.as_member(k):
                ppo.collector.threads.use(ppo.collector.threads.act)
                with torch.inference_mode():
                    ppo.collector.draw_noise(ppo.rollout.noise)
        if self._actor is not None:
            t_act, t_env = self._steps_at_once(members, ppos)
        else:
            t_act, t_env = self._steps(ppos)
        for ppo, spent in zip(ppos, t_act):
            ppo.collector.count(spent, t_env, ppo.T)
            ppo.count_rollout()

    def _steps_at_once(self, members: list[int], ppos: list) -> tuple[list[float], float]:
        """``_steps`` with the members named acting in one batched pass (``StackedActor``;
        the pass computes the finished members' rows too, into their paused envs' actions,
        unread); each member's share of the acting time is an equal part."""
        actor, step, perf = self._actor, self.envs.step, time.perf_counter
        t_act = t_env = 0.0
        actor.begin(members, ppos)
        for t in range(ppos[0].T):
            t0 = perf()
            actor.act(t)
            t1 = perf()
            step(t + 1)
            t_env += perf() - t1
            t_act += t1 - t0
        actor.end(members, ppos)
        return [t_act / len(ppos)] * len(ppos), t_env

    def _steps(self, ppos: list) -> tuple[list[float], float]:
        """The rollout's T steps: each member acts on its rows of slot t (its own copies
        to and from the device where it has them), then every env steps into t + 1.
        Each member's seconds acting, and the seconds in the envs."""
        T = ppos[0].T
        step, perf = self.envs.step, time.perf_counter
        t_act = [0.0] * len(ppos)
        t_env = 0.0
        with torch.inference_mode():
            for t in range(T):
                for i, ppo in enumerate(ppos):
                    t0 = perf()
                    obs, obs_h, noise, act, act_h, raw, logp, val, mask, mask_h = ppo.rollout.steps[t]
                    copies = ppo.rollout.copies
                    if copies:
                        obs.copy_(obs_h, non_blocking=True)
                        if mask is not None:
                            mask.copy_(mask_h, non_blocking=True)
                    ppo.policy.act_(obs, noise, act, raw, logp, val, mask=mask)
                    if copies:
                        act_h.copy_(act)
                    t_act[i] += perf() - t0
                t1 = perf()
                step(t + 1)
                t_env += perf() - t1
            for ppo in ppos:
                ppo.rollout.last_obs_to_device()
        return t_act, t_env


def copy_member(src, dst, keys) -> None:
    """Population-based training's exploit step: member ``dst`` (a ``PPO``) takes ``src``'s
    weights (with its observation normaliser), Adam state, learning-rate schedule, reward
    normaliser statistics and the settings ``keys``; it keeps its own envs, episodes in
    progress, counters and statistics."""
    dst.policy.load_state_dict(src.policy.state_dict())  # (into dst's own parameters: views stay)
    dst.opt.load_state_dict(src.opt.state_dict())
    dst.lr_schedule.load(src.lr_schedule.state())
    if src.reward_scaler is not None and dst.reward_scaler is not None:
        dst.reward_scaler.load(src.reward_scaler.state())  # (its running returns stay its envs')
    for key in keys:
        setattr(dst.cfg, key, getattr(src.cfg, key))
    dst.updater.retune()
