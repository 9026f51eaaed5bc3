"""Collect: the policy acts into the rollout storage for T steps, and nothing else.

Per-step overhead is kept small: acting runs under ``torch.inference_mode()`` with a
functional forward of the actor only (``fastvec.train.model.acting``; values and old
log-probs of MLP policies are computed for the whole rollout afterwards, by
``fastvec.train.algo.targets``), the sampling noise is drawn once per rollout, and the actions
are written in place into the storage's action slot. On a GPU (or with separate
buffers) each step's observations are copied to the device before acting and its
actions back after it.

Two ways through a rollout: **lock-step** (act on every env's observations of step t,
then step them all) and **by groups** (``env_groups``: group g's step t is in flight
while the policy acts on the other groups'). A recurrent policy acts in lock-step with
each env's state (``_recurrent``), zeroed where an episode starts.
"""

from __future__ import annotations

import time

import torch

from ..compute.busy import DeviceBusy
from ..compute.ranks import SOLO, Ranks
from ..compute.torch_state import Threads
from ..storage.rollout import Rollout

__all__ = ["Collector"]


class Collector:
    """Runs the policy through rollouts (``run``); counts where the time went.

    ``between_steps``: None, or called with ``t`` before acting at each step ``t`` (the
    async pipeline's collector takes up new weights there and records which version
    acted). ``t_act`` / ``t_env``: seconds acting and waiting for the envs, summed over
    the run; ``last_act_latency`` / ``last_env_latency``: per step, in the last rollout."""

    def __init__(self, policy, busy: DeviceBusy, threads: Threads, ranks: Ranks = SOLO):
        self.policy, self.busy, self.threads, self.ranks = policy, busy, threads, ranks
        self._run_noise: torch.Tensor | None = None  # with several ranks: the whole run's draw
        self.last: Rollout | None = None  # a recurrent policy's last rollout (None: the envs were reset)
        self.between_steps = None
        self.t_act = self.t_env = 0.0
        self.last_act_latency = self.last_env_latency = 0.0

    def run(self, rollout: Rollout) -> None:
        """One rollout of T steps on every env of ``rollout``'s storage."""
        self.threads.use(self.threads.act)
        views = rollout.steps_by_group()
        with torch.inference_mode():
            self.draw_noise(rollout.noise)
            if rollout.memory:
                t_act, t_env = self._recurrent(rollout)
            elif views is not None:
                t_act, t_env = self._by_groups(rollout, views)
            else:
                t_act, t_env = self._lockstep(rollout)
            rollout.last_obs_to_device()
        self.count(t_act, t_env, rollout.T)

    def count(self, t_act: float, t_env: float, T: int) -> None:
        """A rollout of ``T`` steps took ``t_act`` seconds acting, ``t_env`` in the envs."""
        self.t_act += t_act
        self.t_env += t_env
        self.last_env_latency = t_env / T
        self.last_act_latency = t_act / T

    def draw_noise(self, noise: torch.Tensor) -> None:
        """The rollout's sampling noise; with several ranks, this rank's envs' share of
        the whole run's draw (``fastvec.train.compute.ranks``: the same actions as on one rank)."""
        sample_noise, ranks = self.policy.dist.sample_noise, self.ranks
        if ranks.solo:
            sample_noise(noise)
            return
        T, N = noise.shape[:2]
        shape = (T, N * ranks.world, *noise.shape[2:])
        if self._run_noise is None or self._run_noise.shape != shape:
            self._run_noise = torch.empty(shape, dtype=noise.dtype, device=noise.device)
        noise.copy_(sample_noise(self._run_noise)[:, ranks.rank * N : (ranks.rank + 1) * N])

    def _lockstep(self, rollout: Rollout) -> tuple[float, float]:
        """Act on step t's observations, then step every env. With separate device
        buffers the observations go to the device before acting and the actions come
        back after it (``busy`` times that span on the device)."""
        policy_act, step, copies = self.policy.act_, rollout.storage.step, rollout.copies
        begin, end = self.busy.begin, self.busy.end
        hook = self.between_steps
        perf = time.perf_counter
        t_act = t_env = 0.0
        for t, slots in enumerate(rollout.steps):
            obs, obs_h, noise, act, act_h, raw, logp, val, mask, mask_h = slots
            t0 = perf()
            if hook is not None:
                hook(t)
            if copies:
                span = begin()
                obs.copy_(obs_h, non_blocking=True)
                if mask is not None:
                    mask.copy_(mask_h, non_blocking=True)
            policy_act(obs, noise, act, raw, logp, val, mask=mask)
            if copies:
                end(span)
                act_h.copy_(act)  # synchronous: the env needs it now
            t1 = perf()
            step(t + 1)
            t_env += perf() - t1
            t_act += t1 - t0
        return t_act, t_env

    def _recurrent(self, rollout: Rollout) -> tuple[float, float]:
        """``_lockstep`` for a recurrent policy: step t acts with the states fed at t
        (``rollout.states[t]``, from the last rollout's slot T at 0) and leaves the actor's
        into ``states[t + 1]``, which the episodes that end there zero (``mark_starts``).
        With the async pipeline (``shared``) acting records its log-probs too: older
        weights may have acted, and the learner keeps theirs as the old ones."""
        act, step, copies = self.policy.act_recurrent, rollout.storage.step, rollout.copies
        states, begin, end, hook = rollout.states, self.busy.begin, self.busy.end, self.between_steps
        logp = rollout.logp if rollout.shared is not None else [None] * rollout.T
        perf = time.perf_counter
        t_act = t_env = 0.0
        rollout.begin_sequences(self.last)
        self.last = rollout
        for t, slots in enumerate(rollout.steps):
            obs, obs_h, noise, a, act_h, raw, _logp, _value, mask, mask_h = slots
            t0 = perf()
            if hook is not None:
                hook(t)
            if copies:
                span = begin()
                obs.copy_(obs_h, non_blocking=True)
                if mask is not None:
                    mask.copy_(mask_h, non_blocking=True)
            act(obs, states[t], states[t + 1], noise, a, raw_out=raw, logp_out=logp[t], mask=mask)
            if copies:
                end(span)
                act_h.copy_(a)
            t1 = perf()
            step(t + 1)
            t_env += perf() - t1
            rollout.mark_starts(t + 1)
            t_act += t1 - t0
        return t_act, t_env

    def _by_groups(self, rollout: Rollout, views: list) -> tuple[float, float]:
        """Group g's step t is in flight while the policy acts on the other groups'
        observations of step t, so acting and the envs overlap. Every env sees the same
        actions as in lock-step (the noise is drawn per rollout): results differ only by
        floating-point rounding of the smaller batches. A failure leaves other groups in
        flight: the engine's close collects them."""
        T, sto = rollout.T, rollout.storage
        policy_act, send, recv = self.policy.act_, sto.send, sto.recv
        copies = rollout.copies
        begin, end = self.busy.begin, self.busy.end
        hook = self.between_steps
        perf = time.perf_counter
        t_act = t_env = 0.0
        for t in range(T):
            if hook is not None:
                hook(t)
            for g, by_step in enumerate(views):
                t0 = perf()
                if t:
                    recv(g, t)
                t1 = perf()
                obs, obs_h, noise, act, act_h, raw, logp, val, mask, mask_h = by_step[t]
                if copies:
                    span = begin()
                    obs.copy_(obs_h, non_blocking=True)
                    if mask is not None:
                        mask.copy_(mask_h, non_blocking=True)
                policy_act(obs, noise, act, raw, logp, val, mask=mask)
                if copies:
                    end(span)
                    act_h.copy_(act)  # synchronous: the env needs it now
                t2 = perf()
                send(g, t + 1)
                t3 = perf()
                t_env += (t1 - t0) + (t3 - t2)
                t_act += t2 - t1
        t0 = perf()
        for g in range(len(views)):
            recv(g, T)
        t_env += perf() - t0
        return t_act, t_env
