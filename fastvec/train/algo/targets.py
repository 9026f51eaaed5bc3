"""Targets: what a rollout is learned towards, computed after it was collected.

For the rollout's steps: the values and old log-probs of the weights that acted (one
batched pass for an MLP policy, whose acting computed neither), the truncation
bootstrap, then the advantages and value targets: GAE (``fastvec.gae``) or V-trace
(``fastvec.vtrace``), both compiled kernels over the ``[T, N]`` arrays.

Truncation is bootstrapped: ``next_values[t] = V(final_obs[t])`` where an episode was
truncated at step ``t`` (terminated steps do not bootstrap), ``V(obs[t + 1])``
elsewhere.

Off-policy steps (the async pipeline: older weights acted some of the rollout,
``acted_by``): values, old log-probs and bootstraps are those of the weights that acted,
or (``values_of=learner``) the values those of the current weights; with
``targets=vtrace`` (or ``auto``) the targets are importance-clipped towards the current
weights, and with ``proximal_policy=learner`` each sample is weighted by the current
weights' ratio to the acting ones (decoupled PPO: ``adv_weights``).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ...returns.gae_estimates import gae
from ...returns.vtrace_targets import vtrace
from ..compute.busy import DeviceBusy
from ..compute.ranks import SOLO, Ranks
from ..compute.torch_state import Threads
from ..config.settings import PPOConfig
from ..model.actor_critic import Sequences
from ..model.observations import as_torch
from ..storage.rollout import Rollout
from .statistics import RewardScaler

__all__ = ["Targets"]


class Targets:
    """Computes a rollout's targets in place (``compute``): ``rollout.values``,
    ``logp``, ``adv`` and ``ret``, and ``adv_weights``. ``flat_param``: the policy's flat
    parameters (``fastvec.train.algo.optim.flatten_parameters``), where the behaviour passes
    put the acting weights for a while; ``t_prep``: seconds spent, over the run."""

    def __init__(
        self,
        cfg: PPOConfig,
        policy,
        flat_param: torch.Tensor,
        reward_scaler: RewardScaler | None,
        *,
        busy: DeviceBusy,
        threads: Threads,
        ranks: Ranks = SOLO,
    ):
        self.cfg, self.policy, self.flat_param = cfg, policy, flat_param
        self.reward_scaler, self.busy, self.threads = reward_scaler, busy, threads
        self.ranks = ranks  # the normalisers' statistics are every rank's
        self.t_prep = 0.0
        # per-sample weights of the advantages (proximal_policy=learner), set by compute
        self.adv_weights: torch.Tensor | None = None
        self._carry: torch.Tensor | None = None  # a recurrent critic's state fed at the next rollout's slot 0

    @torch.no_grad()
    def compute(self, rollout: Rollout, version: int, acted_by=None) -> None:
        """Values, old log-probs, truncation bootstrap and the targets for ``rollout``.

        ``version``: the current weights' (updates done); ``acted_by``: None where they
        acted the whole rollout (lock-step), else ``(versions, weights)``: the weights
        version that acted at each step (``[T]``) and a mapping from version to flat
        weights."""
        t0 = time.perf_counter()
        span = self.busy.begin()
        cfg, ro, b, T, pol = self.cfg, rollout, rollout.storage, rollout.T, self.policy
        self.threads.use(self.threads.learn)
        if pol.obs_norm is not None:
            pol.update_obs_norm(ro.acted_obs(1), self.ranks)
        term, trunc = b.terminated[1:], b.truncated[1:]
        boot = trunc & ~term
        current_logp = None  # the current weights' log-probs, where a pass computed them
        if ro.memory:  # one pass with the weights in place; acting recorded the old log-probs where older ones acted
            found, current_logp = self._sequence_pass(ro, boot, keep_logp=acted_by is not None)
            boots = [found]
        elif acted_by is None:
            boots = [self.behaviour_pass(ro, np.arange(T + 1), boot)]
        else:
            boots, current_logp = self._acting_passes(ro, version, acted_by, boot)
        ro.values_to_host()
        np.copyto(ro.next_values_np, ro.values_np[1:])
        for found in boots:
            if found is not None:
                ts, ns, v_final = found
                ro.next_values_np[ts, ns] = v_final
        rewards = b.rewards[1:]
        if self.reward_scaler is not None:
            acted = None if ro.active is None else ro.active[:T].numpy()
            rewards = self.reward_scaler(rewards, term | trunc, self.ranks, acted)
        log_rhos = None if acted_by is None else self._log_rhos(ro, current_logp)
        self._advantages(ro, rewards, term, trunc, log_rhos)
        self.adv_weights = None
        if log_rhos is not None and cfg.proximal_policy == "learner":
            # decoupled PPO: clip around the current weights, weight by their ratio to the acting ones
            lr_ = torch.from_numpy(log_rhos).to(ro.device)
            ro.logp.add_(lr_)  # log pi_prox = log mu + log(pi_prox / mu)
            self.adv_weights = lr_.exp().clamp_(max=cfg.vtrace_rho_bar).reshape(-1)
        ro.targets_to_device()
        self.busy.end(span)
        self.t_prep += time.perf_counter() - t0

    def _acting_passes(self, ro: Rollout, version: int, acted_by, boot: np.ndarray):
        """The behaviour passes of an off-policy rollout: each older version's weights over
        the steps it acted (the current weights put back after), and with
        ``values_of=learner`` the current weights' pass over every step, whose log-probs
        replace those of the steps the current weights acted. ``(bootstraps, the current
        weights' log-probs or None)``."""
        cfg, T, flat = self.cfg, ro.T, self.flat_param
        versions, weights = acted_by
        by_step = np.append(versions, versions[-1])  # slot T's value: the last step's weights
        learner_pass = cfg.values_of == "learner" and not self.policy.values_at_act
        acted = np.unique(by_step)
        current = weights.get(version) if learner_pass else None
        mine = version if current is not None and torch.equal(current, flat) else -1
        acted = acted[acted != mine]  # the learner's pass below gives the log-probs of the steps it acted
        now = flat.detach().clone()
        boots = []
        for v in acted:
            flat.copy_(weights[int(v)])
            rows = np.flatnonzero(by_step == v)
            in_rows = np.zeros_like(boot)
            if not learner_pass:  # else the learner's pass bootstraps every truncation
                in_rows[rows[rows < T]] = True
            boots.append(self.behaviour_pass(ro, rows, boot & in_rows))
        flat.copy_(now)
        if not learner_pass:
            return boots, None
        # the values (and bootstraps) of the learner's current weights; the log-probs stay the acting ones'
        acting_logp = ro.logp.clone()
        boots = [self.behaviour_pass(ro, np.arange(T + 1), boot)]
        current_logp = ro.logp.clone()  # the same pass's: log_rhos need no pass of their own
        by_me = torch.from_numpy(versions == mine).to(ro.device).unsqueeze(1)
        ro.logp.copy_(torch.where(by_me, current_logp, acting_logp))
        return boots, current_logp

    def behaviour_pass(self, ro: Rollout, rows: np.ndarray, boot: np.ndarray):
        """Values and log-probs at the steps ``rows`` (of ``0..T``; slot T has no action)
        with the weights in place, and the values of the final observations where ``boot``
        (the truncations among them): ``(ts, ns, values)`` or None."""
        T, N, pol = ro.T, ro.N, self.policy
        if not pol.values_at_act:
            # One batched pass (the policy did not change while acting).
            if len(rows) == T + 1:
                flat = ro.obs_dev.flatten(0, 1)
                params, v = pol.params_and_value(flat)
                ro.values.copy_(v.view(T + 1, N))
                ro.logp.copy_(pol.dist.log_prob(params[: T * N], ro.batch_actions()).view(T, N))
            else:
                idx = torch.from_numpy(rows)
                params, v = pol.params_and_value(ro.obs_dev[idx].flatten(0, 1))
                ro.values[idx] = v.view(len(rows), N)
                acted = rows[rows < T]
                acts = ro.batch_actions()
                acts = acts.view(T, N, *acts.shape[1:])[torch.from_numpy(acted)].reshape(
                    len(acted) * N, *acts.shape[1:]
                )
                ro.logp[torch.from_numpy(acted)] = pol.dist.log_prob(params[: len(acted) * N], acts).view(len(acted), N)
        elif rows[-1] == T:
            ro.values[T].copy_(pol.value(ro.obs_dev[T]))
        if not boot.any():
            return None
        ts, ns = np.nonzero(boot)
        final = as_torch(ro.storage.final_obs[1:][ts, ns]).to(ro.device)
        return ts, ns, pol.value(final).float().cpu().numpy()

    def _sequence_pass(self, ro: Rollout, boot: np.ndarray, keep_logp: bool = False):
        """A recurrent policy's targets pass, with the weights in place (the ones that
        acted, in lock-step; the learner's current ones, in async): one pass over slots
        ``0..T`` from the states fed at 0 (the actor's as acting recorded them; the
        critic's as this pass left them after the last rollout, ``_carry``) gives the
        values and log-probs (the old log-probs, unless acting recorded them:
        ``keep_logp``), and records the states fed where PPO's sequences start (every
        ``bptt`` steps); a truncated episode's final observation is valued with the state
        its last step left. ``(the bootstraps, the log-probs of these weights)``."""
        T, N, pol = ro.T, ro.N, self.policy
        L = self.cfg.bptt or T
        k = pol.acting_state  # the critic's columns follow
        if self._carry is not None:
            ro.states[0, :, k:].copy_(self._carry)
        ts, ns = np.nonzero(boot)
        need = sorted({*range(L - 1, T, L), *ts.tolist()})
        params, v, left = pol.sequence_pass(Sequences(ro.obs_dev, ro.states[0], ro.starts), need)
        ro.values.copy_(v.view(T + 1, N))
        logp = pol.dist.log_prob(params[: T * N], ro.batch_actions()).view(T, N)
        if not keep_logp:
            ro.logp.copy_(logp)
        for t in range(L, T, L):
            ro.states[t].copy_(left[t - 1] * (~ro.starts[t]).unsqueeze(-1))
        self._carry = (left[T - 1][:, k:] * (~ro.starts[T]).unsqueeze(-1)).clone()  # the next rollout's
        if not len(ts):
            return None, logp
        final = as_torch(ro.storage.final_obs[1:][ts, ns]).to(ro.device)
        fed = torch.stack([left[t][n] for t, n in zip(ts.tolist(), ns.tolist())])
        return (ts, ns, pol.value_fed(final, fed).float().cpu().numpy()), logp

    def _log_rhos(self, ro: Rollout, current: torch.Tensor | None = None) -> np.ndarray:
        """log pi(a|s) - log mu(a|s) over the rollout: the current weights against the
        log-probs of the weights that acted (``rollout.logp``); ``current``: the current
        weights' log-probs where a pass already computed them."""
        if current is None:
            pol = self.policy
            params, _ = pol.params_and_value(ro.batch_obs())
            current = pol.dist.log_prob(params, ro.batch_actions()).view(ro.T, ro.N)
        return (current - ro.logp).cpu().numpy()

    def _advantages(self, ro: Rollout, rewards, term, trunc, log_rhos) -> None:
        """GAE, or V-trace where asked (``targets=vtrace``, or ``auto`` off-policy), into
        ``ro.adv_np`` and ``ro.ret_np``."""
        cfg, T = self.cfg, ro.T
        if cfg.targets == "vtrace" or (cfg.targets == "auto" and log_rhos is not None):
            vtrace(
                rewards,
                ro.values_np[:T],
                ro.next_values_np,
                term,
                trunc,
                log_rhos if log_rhos is not None else np.zeros_like(ro.adv_np),
                cfg.gamma,
                cfg.gae_lambda,
                cfg.vtrace_rho_bar,
                cfg.vtrace_c_bar,
                advantages="gae",
                out=(ro.adv_np, ro.ret_np),
            )
        else:
            gae(
                rewards,
                ro.values_np[:T],
                ro.next_values_np,
                term,
                trunc,
                cfg.gamma,
                cfg.gae_lambda,
                out=(ro.adv_np, ro.ret_np),
            )
