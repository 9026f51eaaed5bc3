"""A population's members learning at once: their updates as one batched pass.

Each member of a population (``fastvec.train.algo.population``) is its own PPO run; run
one after another, K members' updates cost K times a run alone's, and for the small MLPs
these runs train that cost is mostly per-call overhead, not arithmetic (see
``fastvec.train.algo.minibatch``). Here the members' flat parameters, gradients and Adam
moments are the rows of ``[K, P]`` arrays (each member's policy, optimiser and learner
keep views of their row), and each minibatch step is one pass for all of them: the
forward and backward of ``StackedLearner`` on ``[K, n, ...]`` batches (numpy's batched
``matmul``), each member's gradient clipped by its own norm, one Adam step over the rows.

What stays each member's own: its minibatch permutation (drawn from its random numbers,
``as_member``), its learning rate and clip range (its schedules), its coefficients
(``ent_coef``, ``vf_coef``, ``max_grad_norm``, ``adam_eps``, ``target_kl``, ``clip_vf``),
its epochs, and its KL early stop: a member that stops is out of the rest of the update,
its weights and Adam state untouched. A member computes what its run alone computes, up
to float rounding (the batched matmul, the norm and Adam's step per row).

Why numpy rather than ``torch.func``: timed on this machine (Intel Xeon, 2 cores, one
thread each, 8 members of a 64x64 MLP), a minibatch's gradients took 0.59 ms stacked
here, 0.87 ms as 8 numpy learners one after another and 2.1 ms as ``vmap(grad(...))``
over ``stack_module_state``'s parameters with CartPole's minibatch of 64; with
HalfCheetah's of 256, 2.2, 2.2 and 4.7 ms: the arithmetic dominates there, and the
stacked pass saves only the calls.

``StackedActor`` is the acting step's twin: while every member runs, their actors act
on their rows of a slot in one batched pass (each with its own noise, drawn per rollout
from its stream, and its observation normaliser).

It serves the members the numpy learner serves (an MLP over a Box or Discrete space on
the CPU, one learner thread: ``NumpyLearner.why_not``); other members update one after
another.
"""

from __future__ import annotations

import collections
import math
import time

import numpy as np
import torch
import torch.nn as nn

from .minibatch import NumpyLearner
from .update import Learned, numpy_learner_for

__all__ = ["StackedMembers", "StackedLearner"]


def _row_views(policy, flat: torch.Tensor, rows: np.ndarray, params) -> list:
    """``params``' views into ``rows`` ``[K, P]`` (each member's copy of ``params``,
    located by its offset in the member's flat tensor ``flat``), as ``[K, *shape]``."""
    base = flat.data_ptr()
    out = []
    for p in params:
        off = (p.data_ptr() - base) // p.element_size()
        view = rows[:, off : off + p.numel()].reshape(rows.shape[0], *p.shape)
        if not np.shares_memory(view, rows):  # pragma: no cover - numpy views these slices
            raise ValueError("a member's parameters are not rows of the stacked arrays")
        out.append(view)
    return out


class StackedLearner:
    """``NumpyLearner``'s loss and gradient for K members at once: the members' weights
    and gradients as ``[K, ...]`` views of the stacked rows."""

    def __init__(self, policy, flat: torch.Tensor, param_rows: np.ndarray, grad_rows: np.ndarray):
        self.gaussian = policy.dist.__class__.__name__ == "GaussianDist"
        self.relu = any(isinstance(m, nn.ReLU) for m in policy.stack("actor"))

        def layers(side):
            linear = [m for m in policy.stack(side) if isinstance(m, nn.Linear)]
            ps = [p for m in linear for p in (m.weight, m.bias)]
            w = _row_views(policy, flat, param_rows, ps)
            g = _row_views(policy, flat, grad_rows, ps)
            return [((w[i], g[i]), (w[i + 1], g[i + 1])) for i in range(0, len(ps), 2)]

        self.actor, self.critic = layers("actor"), layers("critic")
        if self.gaussian:
            (ls,) = _row_views(policy, flat, param_rows, [policy.dist.log_std])
            (gls,) = _row_views(policy, flat, grad_rows, [policy.dist.log_std])
            self.log_std = (ls, gls)
        self._log2pi_half = 0.5 * math.log(2 * math.pi)

    def _forward(self, layers, x):
        hs, h = [x], x
        for (w, _gw), (b, _gb) in layers[:-1]:
            h = np.matmul(h, w.transpose(0, 2, 1))
            h += b[:, None, :]
            if self.relu:
                np.maximum(h, 0.0, out=h)
            else:
                np.tanh(h, out=h)
            hs.append(h)
        (w, _gw), (b, _gb) = layers[-1]
        out = np.matmul(h, w.transpose(0, 2, 1))
        out += b[:, None, :]
        return hs, out

    def _backward(self, layers, hs, g) -> None:
        for i in range(len(layers) - 1, -1, -1):
            (w, gw), (_b, gb) = layers[i]
            h = hs[i]
            gw[...] = np.matmul(g.transpose(0, 2, 1), h)
            gb[...] = g.sum(1)
            if i:
                g = np.matmul(g, w)
                if self.relu:
                    g *= h > 0
                else:
                    g *= 1.0 - h * h

    def minibatch(self, x, actions, old_logp, adv, ret, old_v, *, co: dict) -> dict:
        """Every member's minibatch (``[K, n, ...]``; ``co``: the members' ``clip``,
        ``ent_coef``, ``vf_coef`` as ``[K]`` arrays, ``clip_vf`` one for all or None): the
        gradients into the rows, and each member's statistics as ``[K]`` arrays."""
        n = x.shape[1]
        ha, params = self._forward(self.actor, x)
        hc, v = self._forward(self.critic, x)
        v = v[..., 0]
        logp, ent, dist = self._log_probs(params, actions)
        logratio = logp - old_logp
        ratio = np.exp(logratio)
        lo, hi = (1.0 - co["clip"])[:, None], (1.0 + co["clip"])[:, None]
        s1, s2 = adv * ratio, adv * np.clip(ratio, lo, hi)
        out = {"kl": ((ratio - 1.0) - logratio).mean(1)}
        out["cf"] = (np.abs(ratio - 1.0) > co["clip"][:, None]).mean(1)
        out["pg"] = -np.minimum(s1, s2).mean(1)
        v_loss, g_v = self._value_loss(v, ret, old_v, n, co)
        out["v"] = 0.5 * v_loss
        if self.gaussian:
            ls = self.log_std[0]
            out["ent"] = ls.sum(1) + (0.5 + self._log2pi_half) * ls.shape[1]
        else:
            out["ent"] = ent.mean(1)
        g_logp = (ratio >= lo) & (ratio <= hi)
        g_logp |= s1 < s2
        g_logp = g_logp * adv
        g_logp *= ratio
        g_logp *= -1.0 / n
        g_params = self._params_grad(g_logp, ent, dist, n, co["ent_coef"])
        self._backward(self.actor, ha, g_params.astype(np.float32, copy=False))
        self._backward(self.critic, hc, g_v[..., None].astype(np.float32, copy=False))
        return out

    def _log_probs(self, params, actions):
        if self.gaussian:
            ls = self.log_std[0]
            inv = np.exp(-ls)[:, None, :]
            z = actions - params
            z *= inv
            zz = z * z
            logp = zz.sum(2)
            logp *= -0.5
            logp -= (ls.sum(1) + self._log2pi_half * ls.shape[1])[:, None]
            return logp, None, (z, zz, inv)
        m = params.max(2, keepdims=True)
        logp_all = params - m
        e = np.exp(logp_all)
        s = e.sum(2, keepdims=True)
        logp_all -= np.log(s)
        p = e
        p /= s
        idx = actions.astype(np.intp, copy=False)[..., None]
        logp = np.take_along_axis(logp_all, idx, 2)[..., 0]
        ent = -(p * logp_all).sum(2)
        return logp, ent, (p, logp_all, idx)

    def _value_loss(self, v, ret, old_v, n: int, co: dict):
        d = v - ret
        clip_vf = co["clip_vf"]
        if clip_vf is not None:
            dv = v - old_v
            inside_v = (dv >= -clip_vf) & (dv <= clip_vf)
            dc = old_v + np.clip(dv, -clip_vf, clip_vf) - ret
            d2, dc2 = d * d, dc * dc
            v_loss = np.maximum(d2, dc2).mean(1)
            share = np.where(d2 > dc2, 1.0, np.where(d2 == dc2, 0.5, 0.0)).astype(np.float32)
            g_v = share * 2.0 * d + (1.0 - share) * 2.0 * dc * inside_v
        else:
            v_loss = (d * d).mean(1)
            g_v = 2.0 * d
        g_v *= (0.5 * co["vf_coef"] / n)[:, None].astype(np.float32)
        return v_loss, g_v

    def _params_grad(self, g_logp, ent, dist, n: int, ent_coef: np.ndarray):
        if self.gaussian:
            z, zz, inv = dist
            gls = self.log_std[1]
            g_params = z * inv
            g_params *= g_logp[..., None]
            zz -= 1.0
            gls[...] = np.matmul(g_logp[:, None, :], zz)[:, 0]
            gls -= ent_coef[:, None].astype(np.float32)
            return g_params
        p, logp_all, idx = dist
        g_params = -p * g_logp[..., None]
        np.put_along_axis(g_params, idx, np.take_along_axis(g_params, idx, 2) + g_logp[..., None], 2)
        g_params += (ent_coef / n)[:, None, None].astype(np.float32) * p * (logp_all + ent[..., None])
        return g_params


class StackedMembers:
    """K members' flat parameters, gradients and Adam moments as rows of ``[K, P]``
    tensors (``adopt`` moves each member's there); ``update`` runs some members' updates
    at once. Build with ``StackedMembers.adopt(ppos)``, or None where ``why_not``."""

    @staticmethod
    def why_not(ppos: list) -> str | None:
        """None when the members' updates can run stacked; else why not."""
        first = ppos[0]
        for ppo in ppos:
            why = NumpyLearner.why_not(ppo.policy, ppo.device, ppo.threads.learn)
            if why is not None or ppo.updater.np_learner is None:
                return why or "a member learns with autograd (learner=torch)"
            if not ppo.ranks.solo:
                return "a member is one rank of several"
            if ppo.flat_param.numel() != first.flat_param.numel():
                return "the members' networks differ"
            if (ppo.cfg.clip_vf is None) != (first.cfg.clip_vf is None) or ppo.cfg.clip_vf != first.cfg.clip_vf:
                return "the members' clip_vf differ"
        return None

    @classmethod
    def adopt(cls, ppos: dict) -> StackedMembers | None:
        """``ppos``: member index -> its ``PPO``."""
        fits = len(ppos) > 1 and cls.why_not(list(ppos.values())) is None
        return cls(ppos) if fits else None

    def __init__(self, ppos: dict):
        K, P = len(ppos), next(iter(ppos.values())).flat_param.numel()
        self.param, self.grad = torch.empty(K, P), torch.zeros(K, P)
        self.m, self.v = torch.zeros(K, P), torch.zeros(K, P)
        self.ppos, self.row = ppos, {k: r for r, k in enumerate(ppos)}
        for k, ppo in ppos.items():
            self._move(ppo, self.row[k])
        first = next(iter(ppos.values()))
        self.learner = StackedLearner(first.policy, first.flat_param, self.param.numpy(), self.grad.numpy())

    def _move(self, ppo, k: int) -> None:
        """Member k's parameters, gradient and Adam moments into row k: its policy's
        parameters, its flat tensors and its optimiser become views of the row (values
        kept), and its numpy learner is made again over them."""
        flat, base = ppo.flat_param, ppo.flat_param.data_ptr()
        row, grad_row = self.param[k], self.grad[k]
        row.copy_(flat.data)
        for p in ppo.policy.parameters():
            if p.requires_grad:
                off = (p.data_ptr() - base) // p.element_size()
                p.data = row[off : off + p.numel()].view_as(p)
                p.grad = grad_row[off : off + p.numel()].view_as(p)
        flat.data = row
        ppo.flat_grad.data = grad_row  # (the flat parameter's .grad: the same tensor)
        opt = ppo.opt
        self.m[k].copy_(opt.m)
        self.v[k].copy_(opt.v)
        opt.m.data, opt.v.data = self.m[k], self.v[k]
        up = ppo.updater
        up.np_learner = numpy_learner_for(ppo.cfg, ppo.policy, ppo.flat_grad, ppo.device, up.threads.learn)

    # ------------------------------------------------------------------ one update
    def update(self, members: list[int], as_member) -> None:
        """The update of each member named (its targets computed), all at once; each
        member's counters and statistics as its own ``Updater.run`` leaves them.
        ``as_member(k)``: the context in which member k draws its random numbers."""
        t0 = time.perf_counter()
        ppos = [self.ppos[k] for k in members]
        starts = [ppo.updater.begin(ppo.rollout, ppo.adv_weights) for ppo in ppos]
        rows = [self.row[k] for k in members]
        with ppos[0].updater.np_learner.one_blas_thread():
            done = self._epochs(members, ppos, starts, rows, as_member)
        share = (time.perf_counter() - t0) / len(ppos)  # (each member's part of the time)
        for ppo, start, learned in zip(ppos, starts, done):
            ppo.updater.end(start, learned, time.perf_counter() - share)

    def _epochs(self, members, ppos, starts, rows, as_member) -> list[Learned]:
        """The members' epochs, minibatch by minibatch, until each has done its
        ``n_epochs`` or its KL stopped it; what each did (``Learned``). Every row is
        computed (the batched pass is over all of them); only the members' are used."""
        K, cfgs = len(ppos), [ppo.cfg for ppo in ppos]
        D, B = starts[0].data.shape[1] - 4, starts[0].data.shape[0]
        mb = min(cfgs[0].minibatch_size, B)
        every = self.param.shape[0]
        data = np.zeros((every, *starts[0].data.shape), np.float32)
        acts = np.zeros((every, *starts[0].acts.shape), starts[0].acts.numpy().dtype)
        co = {key: np.zeros(every, np.float32) for key in ("clip", "ent_coef", "vf_coef")}
        for r, start, cfg in zip(rows, starts, cfgs):
            co["clip"][r], co["ent_coef"][r], co["vf_coef"][r] = start.clip, cfg.ent_coef, cfg.vf_coef
        co["clip_vf"] = cfgs[0].clip_vf
        stats = [collections.defaultdict(list) for _ in ppos]
        epochs, mbs, kl_from, stopped = [0] * K, [0] * K, [0] * K, [False] * K
        active = [i for i in range(K) if cfgs[i].n_epochs > 0]
        for epoch in range(max(c.n_epochs for c in cfgs)):
            active = [i for i in active if epoch < cfgs[i].n_epochs]
            if not active:
                break
            for i in active:
                epochs[i] = epoch + 1  # (an epoch the KL stops counts, as in a run alone)
                kl_from[i] = len(stats[i]["kl"])
                with as_member(members[i]):
                    perm = torch.randperm(B) if mb < B else None
                data[rows[i]] = starts[i].data.numpy() if perm is None else starts[i].data[perm].numpy()
                acts[rows[i]] = starts[i].acts.numpy() if perm is None else starts[i].acts[perm].numpy()
            for first in range(0, B - 1, mb):
                part = data[:, first : first + mb]
                if part.shape[1] < 2:
                    continue
                out = self.learner.minibatch(
                    part[..., :D], acts[:, first : first + mb], *(part[..., D + j] for j in range(4)), co=co
                )
                active = self._record(active, {k: v[rows] for k, v in out.items()}, cfgs, epoch, stats, stopped)
                if not active:
                    break
                self._step([rows[i] for i in active], [ppos[i] for i in active], [starts[i].lr for i in active])
                for i in active:
                    mbs[i] += 1
        return [Learned(stats[i], epochs[i], stopped[i], mbs[i], kl_from[i]) for i in range(K)]

    @staticmethod
    def _record(active, out: dict, cfgs, epoch: int, stats, stopped) -> list[int]:
        """One minibatch's statistics into each active member's (as ``NumpyLearner``
        appends them); the members its KL stops leave ``active``, their gradient unused."""
        still = []
        for i in active:
            kl, target = float(out["kl"][i]), cfgs[i].target_kl
            if target is not None and kl > 1.5 * target:
                stats[i]["kl"].append(kl)
                stopped[i] = True
                continue
            if epoch == cfgs[i].n_epochs - 1 or target is not None:
                for key in ("kl", "cf", "pg", "v", "ent"):
                    stats[i][key].append(float(out[key][i]))
            still.append(i)
        return still

    def _step(self, rows: list[int], ppos: list, lrs: list[float]) -> None:
        """The rows' gradients clipped each by its own norm (``max_grad_norm``), then
        Adam's step on each row with its own rate, epsilon and step count."""
        idx = None if rows == list(range(self.param.shape[0])) else torch.tensor(rows)
        pick = (lambda t: t) if idx is None else (lambda t: t[idx])
        g, m, v, w = pick(self.grad), pick(self.m), pick(self.v), pick(self.param)
        col = lambda xs: torch.tensor(xs, dtype=torch.float32).unsqueeze(1)  # noqa: E731
        with torch.no_grad():
            norms = g.norm(dim=1, keepdim=True)
            g.mul_((col([p.cfg.max_grad_norm for p in ppos]) / (norms + 1e-6)).clamp_(max=1.0))
            opts = [p.opt for p in ppos]
            for opt in opts:
                opt.t += 1
            b1, b2 = opts[0].b1, opts[0].b2
            m.lerp_(g, 1.0 - b1)
            v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            denom = v.sqrt().div_(col([math.sqrt(1.0 - b2**o.t) for o in opts])).add_(col([o.eps for o in opts]))
            w.add_(m / denom * col([-lr / (1.0 - b1**o.t) for lr, o in zip(lrs, opts)]))
            if idx is not None:
                self.m[idx], self.v[idx], self.param[idx] = m, v, w


class StackedActor:
    """The members' acting step at once: every member's actor on its rows of the slot
    (``[K, N, ...]`` views of the storage's ``[K N, ...]`` arrays), numpy's batched matmul
    over the actor rows of ``StackedMembers``; the arithmetic of ``NumpyActor`` per member.
    ``begin(members, ppos)`` before a rollout (the acting members' noise and normalisers;
    the others' rows act on zero noise, unread); ``act(t)`` acts on slot t into slot t + 1;
    ``end(members, ppos)`` gives each acting member its raw samples."""

    @staticmethod
    def why_not(ppos: list) -> str | None:
        for ppo in ppos:
            np_actor = None if ppo.policy.image else ppo.policy.acting_path().numpy
            if np_actor is None or ppo.rollout.copies or ppo.policy.masked:
                return "a member acts outside the numpy actor (an image, a mask, another activation, a device)"
        return None

    def __init__(self, stacked: StackedMembers, obs: np.ndarray, act: np.ndarray):
        self.learner = stacked.learner
        K = stacked.param.shape[0]
        self.obs_rows = obs.reshape(obs.shape[0], K, -1, *obs.shape[2:])  # [T + 1, K, N, ...] views
        self.act_rows = act.reshape(act.shape[0], K, -1, *act.shape[2:])
        self.noise: np.ndarray | None = None
        self.raw: np.ndarray | None = None
        self.norm: tuple | None = None

    def begin(self, members: list[int], ppos: list) -> None:
        """A rollout's start: the acting members' (``members``, their ``ppos``) sampling
        noise stacked, their normalisers read; the rows of the others act on nothing."""
        first_noise = ppos[0].rollout.noise.numpy()
        K = self.act_rows.shape[1]
        self.noise = np.zeros((first_noise.shape[0], K, *first_noise.shape[1:]), first_noise.dtype)  # [T, K, N, ...]
        for k, ppo in zip(members, ppos):
            self.noise[:, k] = ppo.rollout.noise.numpy()
        first = ppos[0].policy.acting_path().numpy
        self.np_actor = first
        if first.norm is not None:
            shift = np.zeros((K, *first.norm[0].shape), first.norm[0].dtype)
            scale = np.ones((K, *first.norm[1].shape), first.norm[1].dtype)
            for k, ppo in zip(members, ppos):
                shift[k], scale[k] = ppo.policy.acting_path().numpy.norm[:2]
            self.norm = (shift[:, None], scale[:, None], first.norm[2])
        self.raw = np.empty(self.noise.shape, np.float32) if first.gaussian else None

    def act(self, t: int) -> None:
        K, n = self.act_rows.shape[1], self.act_rows.shape[2]
        x = self.obs_rows[t].reshape(K, n, -1)
        if self.norm is not None:
            shift, scale, clip = self.norm
            x = np.subtract(x, shift, dtype=np.float32)
            x *= scale
            np.clip(x, -clip, clip, out=x)
        elif x.dtype != np.float32:
            x = x.astype(np.float32)
        _hs, params = self.learner._forward(self.learner.actor, x)
        a = self.np_actor
        if a.gaussian:
            raw = self.raw[t]
            np.multiply(np.exp(self.learner.log_std[0])[:, None, :], self.noise[t], out=raw)
            raw += params
            out = self.act_rows[t + 1].reshape(K, n, -1)
            out[...] = raw
            if a.bounded:
                np.minimum(out, a.high, out=out)
                np.maximum(out, a.low, out=out)
        else:
            params += self.noise[t].reshape(K, n, -1)
            self.act_rows[t + 1].reshape(K, n)[...] = params.argmax(-1)

    def end(self, members: list[int], ppos: list) -> None:
        """The rollout's raw Gaussian samples into each acting member's rollout (its learner's)."""
        if self.raw is not None:
            for k, ppo in zip(members, ppos):
                ppo.rollout.raw.numpy()[...] = self.raw[:, k]
