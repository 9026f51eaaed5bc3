"""The PPO minibatch gradient of a small MLP policy, in numpy, on the CPU.

A 64x64 actor-critic's update is a few hundred tiny torch ops per minibatch, and on a
small VM each op costs more in dispatch and autograd bookkeeping than in arithmetic
(measured here: 2.9 ms a minibatch of 256 for HalfCheetah's policy, of which halving the
rows saves 11%). The same forward and backward pass written out in numpy, about sixty
calls, costs less than half of that; ``PPO.update`` uses it for the policies it covers
(``NumpyLearner.why_not``) and keeps torch's autograd for every other one (CNNs, other
activations or action spaces, CUDA, more than one learner thread).

What it computes is exactly the torch path's loss (``PPO.update``): the clipped policy
objective, the (optionally clipped) value loss with its 0.5 factor, the entropy bonus.
Where torch's ``minimum``/``maximum`` meet a tie they split the gradient in halves, and
``clamp`` passes it at its bounds; the derivatives below do the same, so the two agree up
to float rounding (``tests/test_train_numpy_learner.py`` checks them against autograd in float64).
The gradient is written into the policy's flat gradient (``flatten_parameters``), so
clipping and the optimiser step stay ``PPO.update``'s own.

Parameters are read through numpy views of the flat parameter tensor: the optimiser's
in-place step is what the next minibatch sees.

The PPO loss of one minibatch and its gradient, by autograd (``fastvec.train.algo.minibatch``
is its numpy twin for small MLPs): the clipped policy objective, the (optionally
clipped) value loss with its 0.5 factor (as CleanRL's), the entropy bonus.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
import torch.nn as nn

from ..model.actor_critic import ActorCritic
from ..model.distributions import CategoricalDist, GaussianDist

__all__ = ["NumpyLearner", "AutogradMinibatch"]

_ACTIVATIONS = (nn.Tanh, nn.ReLU)


def _linear_layers(modules):
    return [m for m in modules if isinstance(m, nn.Linear)]


def _blas_controller():
    """What keeps numpy's BLAS on one thread while learning (a 256x64x64 product is
    above OpenBLAS's threading threshold: a second thread was slower here, and its
    spinning afterwards takes a core from the env workers); None without threadpoolctl."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - a dependency of the train extra
        return None
    return ThreadpoolController()


class NumpyLearner:
    """Loss, statistics and gradient of one PPO minibatch for ``policy`` (an MLP
    ``ActorCritic``), written into ``flat_grad``."""

    @staticmethod
    def why_not(policy: ActorCritic, device: torch.device, learn_threads: int) -> str | None:
        """None when this learner computes ``policy``'s update; else why it cannot."""
        if policy.recurrent:
            return f"it has no recurrent core (policy_core is {policy.core_kind})"
        if policy.kind != "mlp" or not policy.packable_obs:
            return "it needs an MLP policy over a Box observation"
        for side in ("actor", "critic"):
            acts = {type(m) for m in policy.stack(side) if not isinstance(m, nn.Linear)}
            if len(acts) > 1 or not acts <= set(_ACTIVATIONS):
                names = ", ".join(sorted(a.__name__ for a in acts))
                return f"it knows tanh and relu activations (not {names})"
        dist = policy.dist
        if dist.masked:
            return "it does not take action masks"
        if isinstance(dist, CategoricalDist) and not (dist.k == 1 and not dist.has_mask and not dist.has_start):
            return "it knows Box and Discrete actions (starting at 0)"
        if not isinstance(dist, (CategoricalDist, GaussianDist)):
            return f"it does not know {type(dist).__name__}"
        if device.type != "cpu":
            return f"it runs on the CPU (the device is {device})"
        if learn_threads != 1:
            return f"it runs on one thread (learn_threads is {learn_threads})"
        return None

    def __init__(
        self, policy: ActorCritic, flat_grad: torch.Tensor, ent_coef: float, vf_coef: float, clip_vf: float | None
    ):
        self.gaussian = isinstance(policy.dist, GaussianDist)
        self.relu = any(isinstance(m, nn.ReLU) for m in policy.stack("actor"))
        self.ent_coef, self.vf_coef, self.clip_vf = float(ent_coef), float(vf_coef), clip_vf
        flat = flat_grad.numpy()
        base = flat_grad.data_ptr()
        covered = 0

        def view(p: nn.Parameter):
            """(parameter, its gradient) as numpy views into the flat tensors."""
            nonlocal covered
            g = p.grad
            off = -1 if g is None else (g.data_ptr() - base) // g.element_size()
            if off < 0 or off + p.numel() > flat.size or not g.is_contiguous():
                raise ValueError("the policy's parameters are not flattened (flatten_parameters)")
            covered += p.numel()
            return p.detach().numpy(), flat[off : off + p.numel()].reshape(tuple(p.shape))

        self.actor = [(view(m.weight), view(m.bias)) for m in _linear_layers(policy.stack("actor"))]
        self.critic = [(view(m.weight), view(m.bias)) for m in _linear_layers(policy.stack("critic"))]
        self.log_std = view(policy.dist.log_std) if self.gaussian else None
        if covered != flat.size:
            raise ValueError("the policy has parameters this learner does not know")
        self._log2pi_half = 0.5 * math.log(2 * math.pi)
        self._blas = _blas_controller()

    def one_blas_thread(self):
        """A context for a whole update (see ``_blas_controller``); a no-op without threadpoolctl."""
        if self._blas is None:
            return contextlib.nullcontext()
        return self._blas.limit(limits=1, user_api="blas")

    # ------------------------------------------------------------------ passes
    def _forward(self, layers, x):
        """Hidden activations (inputs of each layer) and the output of an MLP."""
        hs = [x]
        h = x
        for (w, _gw), (b, _gb) in layers[:-1]:
            h = h @ w.T
            h += b
            if self.relu:
                np.maximum(h, 0.0, out=h)
            else:
                np.tanh(h, out=h)
            hs.append(h)
        (w, _gw), (b, _gb) = layers[-1]
        out = h @ w.T
        out += b
        return hs, out

    def _backward(self, layers, hs, g) -> None:
        """Gradients of every layer from ``g`` = dLoss/dOutput, into the flat gradient."""
        for i in range(len(layers) - 1, -1, -1):
            (w, gw), (_b, gb) = layers[i]
            h = hs[i]
            np.matmul(g.T, h, out=gw)
            g.sum(0, out=gb)
            if i:
                g = g @ w
                if self.relu:
                    g *= h > 0
                else:
                    g *= 1.0 - h * h

    def minibatch(
        self, x, actions, old_logp, adv, ret, old_v, *, clip: float, want_stats: bool, target_kl: float | None, stats
    ) -> bool:
        """One minibatch: ``x`` the (normalised) observations ``[n, D]`` float32,
        ``actions`` the raw Gaussian samples ``[n, dim]`` or Discrete actions ``[n]``, the
        other columns ``[n]``. Appends the statistics to ``stats`` when ``want_stats``;
        returns True, with no gradient written, when the approximate KL stops the epochs
        (``target_kl``), as ``fastvec.train.algo.update`` does."""
        n = x.shape[0]
        ha, params = self._forward(self.actor, x)
        hc, v = self._forward(self.critic, x)
        v = v[:, 0]
        logp, ent, dist = self._log_probs(params, actions, bool(self.ent_coef) or want_stats)
        logratio = logp - old_logp
        ratio = np.exp(logratio)
        lo, hi = 1.0 - clip, 1.0 + clip
        clipped = np.clip(ratio, lo, hi)
        s1 = adv * ratio
        s2 = adv * clipped
        if want_stats or target_kl is not None:
            kl = float(((ratio - 1.0) - logratio).mean())
            if target_kl is not None and kl > 1.5 * target_kl:
                stats["kl"].append(kl)
                return True
        v_loss, g_v = self._value_loss(v, ret, old_v, n)
        if want_stats:
            stats["kl"].append(kl)
            stats["cf"].append(float((np.abs(ratio - 1.0) > clip).mean()))
            stats["pg"].append(-float(np.minimum(s1, s2).mean()))
            stats["v"].append(0.5 * v_loss)
            if self.gaussian:
                ls = self.log_std[0]
                stats["ent"].append(float(ls.sum() + (0.5 + self._log2pi_half) * ls.size))
            else:
                stats["ent"].append(float(ent.mean()))
        # d(-mean(min(s1, s2)))/d ratio: the unclipped side carries it where it is the
        # smaller; inside the clip range both sides are equal and clamp passes it too.
        g_logp = (ratio >= lo) & (ratio <= hi)
        g_logp |= s1 < s2
        g_logp = g_logp * adv
        g_logp *= ratio
        g_logp *= -1.0 / n
        g_params = self._params_grad(g_logp, ent, dist, n)
        self._backward(self.actor, ha, g_params.astype(np.float32, copy=False))
        self._backward(self.critic, hc, g_v[:, None].astype(np.float32, copy=False))
        return False

    def _log_probs(self, params, actions, need_entropy: bool):
        """``(log-probs, entropies or None, what the gradient needs of the distribution)``."""
        if self.gaussian:
            ls = self.log_std[0]
            inv = np.exp(-ls)
            z = actions - params
            z *= inv
            zz = z * z
            logp = zz.sum(1)
            logp *= -0.5
            logp -= ls.sum() + self._log2pi_half * ls.size
            return logp, None, (z, zz, inv)
        m = params.max(1, keepdims=True)
        logp_all = params - m
        e = np.exp(logp_all)
        s = e.sum(1, keepdims=True)
        logp_all -= np.log(s)
        p = e
        p /= s
        idx = actions.astype(np.intp, copy=False)
        rows = np.arange(params.shape[0])
        logp = logp_all[rows, idx]
        ent = -(p * logp_all).sum(1) if need_entropy else None
        return logp, ent, (p, logp_all, rows, idx)

    def _value_loss(self, v, ret, old_v, n: int):
        """The value loss (before its 0.5) and its gradient with respect to ``v``."""
        d = v - ret
        if self.clip_vf is not None:
            dv = v - old_v
            inside_v = (dv >= -self.clip_vf) & (dv <= self.clip_vf)
            dc = old_v + np.clip(dv, -self.clip_vf, self.clip_vf) - ret
            d2, dc2 = d * d, dc * dc
            v_loss = float(np.maximum(d2, dc2).mean())
            # torch.maximum: the larger side takes the gradient, a tie half each
            share = np.where(d2 > dc2, 1.0, np.where(d2 == dc2, 0.5, 0.0)).astype(np.float32)
            g_v = share * 2.0 * d + (1.0 - share) * 2.0 * dc * inside_v
        else:
            v_loss = float((d * d).mean())
            g_v = 2.0 * d
        g_v *= 0.5 * self.vf_coef / n
        return v_loss, g_v

    def _params_grad(self, g_logp, ent, dist, n: int):
        """The gradient with respect to the actor's output (and, Gaussian, into log std's)
        from ``g_logp`` = dLoss/dlogp, with the entropy bonus's."""
        ent_coef = self.ent_coef
        if self.gaussian:
            z, zz, inv = dist
            gls = self.log_std[1]
            g_params = z * inv
            g_params *= g_logp[:, None]
            zz -= 1.0  # d logp / d log_std = z^2 - 1
            np.matmul(g_logp, zz, out=gls)
            if ent_coef:
                gls -= ent_coef
            return g_params
        p, logp_all, rows, idx = dist
        g_params = -p * g_logp[:, None]
        g_params[rows, idx] += g_logp
        if ent_coef:  # d(-ent_coef * mean(H))/d logits = ent_coef/n * p * (log p + H)
            g_params += (ent_coef / n) * p * (logp_all + ent[:, None])
        return g_params


class AutogradMinibatch:
    """``minibatch(...)`` writes one minibatch's gradient into ``flat_grad`` (the policy's
    flattened gradient) and appends its statistics; ``NumpyLearner.minibatch``'s contract."""

    def __init__(self, policy, flat_grad: torch.Tensor, ent_coef: float, vf_coef: float, clip_vf: float | None):
        self.policy, self.flat_grad = policy, flat_grad
        self.ent_coef, self.vf_coef, self.clip_vf = ent_coef, vf_coef, clip_vf

    def minibatch(self, o, a, olp, adv_b, ret, ov, *, clip, want_stats, target_kl, stats) -> bool:
        """True, with no gradient, when the approximate KL stops the epochs (``target_kl``)."""
        pol, clip_vf, ent_coef = self.policy, self.clip_vf, self.ent_coef
        params, v = pol.params_and_value(o)
        logp, ent = pol.dist.log_prob_entropy(params, a, need_entropy=bool(ent_coef) or want_stats)
        logratio = logp - olp
        ratio = logratio.exp()
        pg_loss = -torch.min(adv_b * ratio, adv_b * ratio.clamp(1.0 - clip, 1.0 + clip)).mean()
        if clip_vf is not None:
            v_clipped = ov + (v - ov).clamp(-clip_vf, clip_vf)
            v_loss = torch.max((v - ret).square(), (v_clipped - ret).square()).mean()
        else:
            v_loss = (v - ret).square().mean()
        loss = pg_loss + (0.5 * self.vf_coef) * v_loss
        if ent_coef:
            loss = loss - ent_coef * ent.mean()
        if want_stats:
            with torch.no_grad():
                approx_kl = ((ratio - 1.0) - logratio).mean()
                stats["kl"].append(approx_kl)
                if target_kl is not None and approx_kl.item() > 1.5 * target_kl:
                    return True
                stats["cf"].append(((ratio - 1.0).abs() > clip).float().mean())
                stats["pg"].append(pg_loss.detach())
                stats["v"].append(0.5 * v_loss.detach())
                stats["ent"].append(ent.detach().mean())
        self.flat_grad.zero_()
        loss.backward()
        return False
