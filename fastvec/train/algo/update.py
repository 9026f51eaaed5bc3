"""Update: ``n_epochs`` passes of minibatch PPO over a rollout whose targets are computed.

The optimiser (``FlatAdam`` on the policy's flat parameters), the epochs and minibatches,
the losses (``fastvec.train.algo.minibatch``, or ``fastvec.train.algo.minibatch`` for small MLPs on
the CPU), the early stop on the approximate KL, and the learning rate's schedule
(``fastvec.train.algo.optim``) all live here, and nowhere else.

Per epoch the per-sample data is permuted with one gather (observations, old
log-probs, advantages, returns and old values packed in one float tensor when the
observations are small vectors), so a minibatch is a contiguous slice. Advantages are
normalised over the whole batch, once. KL and clip-fraction statistics are computed in
the last epoch only, or in every minibatch when ``target_kl`` needs them.

A recurrent policy's minibatches are whole sequences (``_sequences``): each env's
rollout cut into pieces of ``bptt`` steps, the pieces permuted, each replayed from the
state recorded at its start.

With several ranks (``fastvec.train.compute.ranks``) the update is the whole run's: the
advantages are normalised over every rank's batch, the permutation is of the whole
batch (each rank takes its samples of each minibatch, ``_rank_minibatches``), and each
minibatch's gradient and statistics are summed over the ranks (one all-reduce),
weighted by each rank's share of the minibatch, before they are used.
"""

from __future__ import annotations

import collections
import contextlib
import time
from typing import NamedTuple

import numpy as np
import torch

from ..compute.busy import DeviceBusy
from ..compute.ranks import SOLO, Ranks
from ..compute.torch_state import Threads
from ..config.settings import ConfigError, PPOConfig
from ..model.actor_critic import Sequences
from ..model.distributions import GaussianDist
from ..storage.rollout import Rollout
from .minibatch import AutogradMinibatch, NumpyLearner
from .optim import FlatAdam, LRSchedule, mean_kl

__all__ = ["Updater", "UpdateStart", "Learned", "numpy_learner_for", "update_summary"]


class UpdateStart(NamedTuple):
    """An update's inputs (``Updater.begin``): the per-sample columns ``data`` (the
    observations first where they pack, ``D`` columns), the observations (None where
    packed), the actions, the clip range and learning rate, the device's busy span."""

    data: torch.Tensor
    obs: torch.Tensor | None
    acts: torch.Tensor
    D: int
    clip: float
    lr: float
    span: object


class Learned(NamedTuple):
    """What an update's epochs did: the statistics, epochs done, whether the KL stopped
    them, the minibatches stepped, where the last epoch's KLs start in ``stats["kl"]``."""

    stats: dict
    epochs: int
    stopped: bool
    minibatches: int
    kl_from: int


def numpy_learner_for(cfg: PPOConfig, policy, flat_grad, device, learn_threads: int) -> NumpyLearner | None:
    """The minibatch gradient in numpy where it covers the policy (``cfg.learner``:
    "auto" takes it there, "numpy" insists, "torch" keeps autograd)."""
    if cfg.learner == "torch":
        return None
    why = NumpyLearner.why_not(policy, device, learn_threads)
    if why is not None:
        if cfg.learner == "numpy":
            raise ConfigError(f"learner=numpy does not fit this run: {why}; use learner=auto or torch")
        return None
    return NumpyLearner(policy, flat_grad, cfg.ent_coef, cfg.vf_coef, cfg.clip_vf)


class Updater:
    """The learning state: optimiser, schedules and counters (``updates`` done,
    ``grad_steps`` and the ``learn_samples`` they learned from, ``t_learn`` seconds);
    ``run`` updates the policy from a rollout, ``summary`` reports the last update.
    ``batch``: the samples of a rollout (``T * N``), the schedules' unit."""

    def __init__(
        self,
        cfg: PPOConfig,
        policy,
        flat_param: torch.Tensor,
        flat_grad: torch.Tensor,
        batch: int,
        *,
        busy: DeviceBusy,
        threads: Threads,
        ranks: Ranks = SOLO,
    ):
        self.cfg, self.policy, self.flat_param, self.flat_grad = cfg, policy, flat_param, flat_grad
        self.batch, self.busy, self.threads, self.ranks = batch, busy, threads, ranks
        self.device = flat_param.device
        self.opt = FlatAdam(flat_param, cfg.lr, cfg.adam_eps)
        self.np_learner = numpy_learner_for(cfg, policy, flat_grad, self.device, threads.learn)
        self._autograd = AutogradMinibatch(policy, flat_grad, cfg.ent_coef, cfg.vf_coef, cfg.clip_vf)
        # the schedules' horizon, in updates (lr_horizon's, else total_steps'), of the run's batch
        self.num_updates = max(1, (cfg.lr_horizon or cfg.total_steps) // (batch * ranks.world))
        self.lr_schedule = LRSchedule(cfg, self.num_updates)
        self.updates = 0
        self.grad_steps = 0  # minibatch gradient steps taken, over the whole run
        self.learn_samples = 0  # samples those steps learned from (the learner's speed: per t_learn)
        self.t_learn = 0.0
        self.last_stats: tuple | None = None  # the last update's (stats, lr, clip, epochs, early stop)
        self._wire: torch.Tensor | None = None  # with several ranks: a minibatch's gradient and statistics
        self._rollout: Rollout | None = None  # the rollout of the update running (a recurrent policy's states)

    def run(self, rollout: Rollout, adv_weights: torch.Tensor | None = None) -> None:
        """One update from ``rollout`` (its targets computed; ``adv_weights``: per-sample
        weights of the advantages, or None)."""
        t0 = time.perf_counter()
        start = self.begin(rollout, adv_weights)
        npl = self.np_learner
        with npl.one_blas_thread() if npl is not None else contextlib.nullcontext():
            done = Learned(*self._epochs(start.data, start.obs, start.acts, start.D, start.clip))
        self.end(start, done, t0)

    def begin(self, rollout: Rollout, adv_weights: torch.Tensor | None = None) -> UpdateStart:
        """An update's start (``run``'s, or a population's for its members at once): the
        rate and clip of this update set, the samples gathered."""
        span = self.busy.begin()
        cfg = self.cfg
        self.threads.use(self.threads.learn)
        frac = max(1.0 - self.updates / self.num_updates, 0.0)
        self.opt.lr = lr = self.lr_schedule.rate(self.updates)
        clip = max(cfg.clip_coef * frac if cfg.anneal_clip else cfg.clip_coef, 1e-8)
        data, obs, acts, D = self._samples(rollout, adv_weights)
        self._rollout = rollout
        return UpdateStart(data, obs, acts, D, clip, lr, span)

    def end(self, start: UpdateStart, done: Learned, t0: float) -> None:
        """An update's end: counted, the adaptive rate moved, its statistics kept."""
        self.updates += 1
        if self.lr_schedule.adaptive:
            self.lr_schedule.observe(mean_kl(done.stats["kl"][done.kl_from :]))
        self.busy.end(start.span)
        self.busy.synchronize()  # the update's queued device work counts in t_learn
        self.t_learn += time.perf_counter() - t0
        mb = min(self.cfg.minibatch_size, self.batch * self.ranks.world) // self.ranks.world  # this rank's share
        self.learn_samples += done.minibatches * mb
        self.grad_steps += done.minibatches
        self.last_stats = (done.stats, start.lr, start.clip, done.epochs, done.stopped)

    def _advantages(self, rollout: Rollout, adv_weights, keep: torch.Tensor | None) -> torch.Tensor:
        """The batch's advantages, normalised over the samples learned from (``keep``;
        None: all) where ``norm_adv``, and weighted."""
        B, ranks = self.batch, self.ranks
        adv = rollout.adv.view(B)
        kept = adv if keep is None else adv[keep]
        if self.cfg.norm_adv and ranks.solo:
            if kept.numel() > 1:
                adv = (adv - kept.mean()) / (kept.std() + 1e-8)
        elif self.cfg.norm_adv and B * ranks.world > 1:  # the run's mean and (unbiased) std
            n = B * ranks.world
            mean = ranks.sum_(adv.sum().reshape(1)) / n
            var = ranks.sum_((adv - mean).square().sum().reshape(1)) / (n - 1)
            adv = (adv - mean) / (var.sqrt() + 1e-8)
        if adv_weights is not None:
            adv = adv * adv_weights
        return adv

    def _samples(self, rollout: Rollout, adv_weights):
        """The per-sample data as one float tensor ``[B, D + 4]`` (the observations first
        where they pack, ``D`` columns, then old log-prob, advantage, return, old value),
        the observations (None where packed) and the actions; only the samples whose row
        acted (``Rollout.acted``: all but a multi-agent env's agents that left); a
        recurrent policy's sequences keep every sample (``_sequences`` leaves them out)."""
        data, obs, acts, D = self._all_samples(rollout, adv_weights, keep := rollout.acted())
        if keep is None or self.policy.recurrent:
            return data, obs, acts, D
        return data[keep], None if obs is None else obs[keep], acts[keep], D

    def _all_samples(self, rollout: Rollout, adv_weights, keep):
        B, pol, npl = self.batch, self.policy, self.np_learner
        obs = rollout.batch_obs()
        acts = rollout.batch_actions()
        adv = self._advantages(rollout, adv_weights, keep)
        cols = [
            rollout.logp.view(B, 1),
            adv.view(B, 1),
            rollout.ret.view(B, 1),
            rollout.values[: rollout.T].reshape(B, 1),
        ]
        if not pol.packable_obs:
            return torch.cat(cols, 1), obs, acts, 0
        # the numpy learner gets its inputs normalised once for the whole update
        x = pol.preprocess(obs) if npl is not None else obs.reshape(B, pol.obs_dim).float()
        return torch.cat([x, *cols], 1), None, acts, pol.obs_dim

    def _epochs(self, data, obs, acts, D: int, clip: float):
        """The epochs' minibatches, each one gradient step; ``(stats, epochs done, stopped
        by the KL, minibatches stepped, where the last epoch's KLs start in stats)``. One
        rank learns from ``_minibatches``, one of several from ``_rank_minibatches``."""
        cfg = self.cfg
        learn = self._learn if self.ranks.solo else self._rank_learn
        minibatches = self._minibatches if self.ranks.solo else self._rank_minibatches
        if self.policy.recurrent:
            minibatches = self._sequences
        stats: dict = collections.defaultdict(list)
        stop = False
        epochs_done = kl_from = n_mb = 0
        for epoch in range(cfg.n_epochs):
            want_stats = epoch == cfg.n_epochs - 1 or cfg.target_kl is not None
            kl_from = len(stats["kl"])  # where this epoch's KLs start: the adaptive rate reads the last's
            for part in minibatches(data, obs, acts, D):
                if learn(part, clip, want_stats, stats):
                    stop = True
                    break
                self._step()
                n_mb += 1
            epochs_done = epoch + 1
            if stop:
                break
        return stats, epochs_done, stop, n_mb, kl_from

    def _minibatches(self, data, obs, acts, D: int):
        """One epoch's minibatches of the batch permuted (one gather), as ``(observations,
        actions, old log-prob, advantage, return, old value)``."""
        B, npl = data.shape[0], self.np_learner  # (the samples learned from: the batch, or fewer)
        mb = min(self.cfg.minibatch_size, B)
        if mb < B:
            perm = torch.randperm(B, device=self.device)
            data, acts = data[perm], acts[perm]
            obs = None if obs is None else obs[perm]
        if npl is not None:
            data, acts = data.numpy(), acts.numpy()
        for start in range(0, B - 1, mb):
            rows = data[start : start + mb]
            if rows.shape[0] < 2:
                continue
            o = rows[:, :D] if obs is None else obs[start : start + mb]
            yield o, acts[start : start + mb], rows[:, D], rows[:, D + 1], rows[:, D + 2], rows[:, D + 3]

    def _sequences(self, data, obs, acts, D: int):
        """``_minibatches`` of a recurrent policy: each env's rollout cut into sequences of
        ``bptt`` steps (sequence ``c``: env ``c % N``, from step ``(c // N) bptt``), the
        sequences permuted, a minibatch ``minibatch_size / bptt`` of them, its
        observations as ``Sequences`` from the states recorded at their starts (its other
        columns flat, step-major, as ``Sequences`` results are). The samples of rows that
        did not act (agents) run through the sequences but count in no loss."""
        ro, cfg, dev = self._rollout, self.cfg, self.device
        acted = ro.acted_mask()
        T, N = ro.T, ro.N
        L = cfg.bptt or T
        C = N * (T // L)
        per = max(1, min(cfg.minibatch_size, T * N) // L)
        order = torch.randperm(C, device=dev) if per < C else torch.arange(C, device=dev)
        first, env = (order // N) * L, order % N
        steps = first + torch.arange(L, device=dev).unsqueeze(1)  # [L, C]: each sequence's steps
        rows = steps * N + env  # their samples
        for a in range(0, C, per):
            r = rows[:, a : a + per].reshape(-1)
            keep = None if acted is None else acted[r].nonzero().squeeze(1)
            if (r.numel() if keep is None else keep.numel()) < 2:
                continue
            cols = data[r]
            o = cols[:, :D] if obs is None else obs[r]
            seq = Sequences(
                o.view(L, -1, *o.shape[1:]),
                ro.states[first[a : a + per], env[a : a + per]],
                ro.starts[steps[:, a : a + per], env[a : a + per]],
                keep,
            )
            a_r = acts[r]
            if keep is not None:
                cols, a_r = cols[keep], a_r[keep]
            yield seq, a_r, cols[:, D], cols[:, D + 1], cols[:, D + 2], cols[:, D + 3]

    def _minibatch(self, *part, **settings) -> bool:
        """A minibatch's loss and gradient: numpy's where it covers the policy, else autograd's."""
        npl = self.np_learner
        return (npl.minibatch if npl is not None else self._autograd.minibatch)(*part, **settings)

    def _learn(self, part, clip: float, want_stats: bool, stats: dict) -> bool:
        """One minibatch's gradient into ``flat_grad``; True where the KL stops the epochs."""
        return self._minibatch(*part, clip=clip, want_stats=want_stats, target_kl=self.cfg.target_kl, stats=stats)

    def _rank_minibatches(self, data, obs, acts, D: int):
        """``_minibatches`` of one rank of several: the permutation is the run's (the same
        draw on every rank), a minibatch is its slice of it, and this rank's part of it is
        its own samples of the slice (sample ``t * N + n`` of env ``n`` is the run's
        ``t * world N + rank N + n``); yields ``(part or None, its share of the slice)``."""
        cfg, npl, ranks = self.cfg, self.np_learner, self.ranks
        N, W = self.batch // cfg.n_steps, ranks.world
        B = self.batch * W  # the run's batch
        mb = min(cfg.minibatch_size, B)
        perm = torch.randperm(B, device=self.device) if mb < B else torch.arange(B, device=self.device)
        t, col = perm // (W * N), perm % (W * N)
        mine = col // N == ranks.rank
        # this rank's samples in the permutation's order, gathered once: each minibatch's
        # part is then a contiguous slice, as one rank's are
        idx = (t * N + col % N)[mine]
        ends = torch.cumsum(mine, 0).tolist()  # this rank's samples among the first k + 1
        rows_all, acts_all = data[idx], acts[idx]
        obs_all = None if obs is None else obs[idx]
        if npl is not None:
            rows_all, acts_all = rows_all.numpy(), acts_all.numpy()
        for start in range(0, B - 1, mb):
            size = min(mb, B - start)
            if size < 2:
                continue
            lo, hi = ends[start - 1] if start else 0, ends[start + size - 1]
            share = (hi - lo) / size
            if hi == lo:
                yield None, share
                continue
            rows = rows_all[lo:hi]
            o = rows[:, :D] if obs_all is None else obs_all[lo:hi]
            yield (o, acts_all[lo:hi], rows[:, D], rows[:, D + 1], rows[:, D + 2], rows[:, D + 3]), share

    def _rank_learn(self, part_share, clip: float, want_stats: bool, stats: dict) -> bool:
        """This rank's part of a minibatch: its gradient and statistics, weighted by its
        share, summed over the ranks (``_reduced``); True where the run's KL stops."""
        part, share = part_share
        mine: dict = collections.defaultdict(list)
        if part is None:
            self.flat_grad.zero_()
        else:
            self._minibatch(
                *part, clip=clip, want_stats=True, target_kl=None, stats=mine
            )  # every statistic, no stop: the KL stop is the run's
            self.flat_grad.mul_(share)
        return self._reduced(mine, share, want_stats, stats)

    _STATS = ("kl", "cf", "pg", "v", "ent")

    def _reduced(self, mine: dict, share: float, want_stats: bool, stats: dict) -> bool:
        """One minibatch's gradient (in ``flat_grad``) and statistics, each rank's weighted
        by its ``share`` of it, summed over the ranks in one all-reduce; the statistics
        into ``stats``. True where the run's KL stops the epochs (the gradient unused)."""
        keys, grad = self._STATS, self.flat_grad
        n = grad.numel()
        if self._wire is None:
            self._wire = torch.empty(n + len(keys), device=grad.device)
        wire = self._wire
        wire[:n].copy_(grad)
        wire[n:].copy_(torch.tensor([share * float(mine[k][0]) if mine.get(k) else 0.0 for k in keys]))
        self.ranks.sum_(wire)
        grad.copy_(wire[:n])
        total = dict(zip(keys, wire[n:].tolist()))
        target_kl = self.cfg.target_kl
        if target_kl is not None and total["kl"] > 1.5 * target_kl:
            stats["kl"].append(total["kl"])
            return True
        if want_stats:
            for k in keys:
                stats[k].append(total[k])
        return False

    def _step(self) -> None:
        """Apply a minibatch's gradient (with several ranks, their sum: ``_reduced``): its
        global norm clipped (``clip_grad_norm_`` on the one flat gradient), then Adam's step."""
        grad = self.flat_grad
        grad.mul_((self.cfg.max_grad_norm / (grad.norm() + 1e-6)).clamp_(max=1.0))
        self.opt.step()

    def summary(self, rollout: Rollout) -> dict:
        """Losses etc. of the last update (reads tensors: call at logging time only)."""
        return {} if self.last_stats is None else update_summary(self.last_stats, rollout, self.policy.dist)


def update_summary(last_stats: tuple, rollout: Rollout, dist) -> dict:
    """``Updater.summary`` of an update's ``(stats, lr, clip, epochs done, early stop)``."""
    stats, lr, clip, epochs_done, stop = last_stats

    def mean(key):
        xs = stats.get(key)
        return float(np.mean([float(x) for x in xs])) if xs else None

    out = {
        "losses/policy": mean("pg"),
        "losses/value": mean("v"),
        "losses/entropy": mean("ent"),
        "losses/approx_kl": mean("kl"),
        "losses/clip_fraction": mean("cf"),
        "losses/explained_variance": explained_variance(rollout),
        "losses/learning_rate": lr,
        "losses/clip_coef": clip,
        "losses/epochs": epochs_done,
        "losses/kl_early_stop": int(stop),
    }
    if isinstance(dist, GaussianDist):
        out["losses/action_std"] = float(dist.log_std.detach().exp().mean())
    return out


@torch.no_grad()
def explained_variance(rollout: Rollout) -> float:
    """1 - Var(return - value) / Var(return) over the rollout's samples that acted
    (agents: not those of rows whose agent left); NaN where the returns do not vary."""
    ret, v = rollout.ret.reshape(-1), rollout.values[: rollout.T].reshape(-1)
    keep = rollout.acted()
    if keep is not None:
        ret, v = ret[keep], v[keep]
    var_y = ret.var()
    return float(1.0 - (ret - v).var() / var_y) if var_y > 0 else float("nan")
