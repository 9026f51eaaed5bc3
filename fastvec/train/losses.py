"""The PPO loss of one minibatch and its gradient, by autograd (``fastvec.train.numpy_learner``
is its numpy twin for small MLPs): the clipped policy objective, the (optionally
clipped) value loss with its 0.5 factor (as CleanRL's), the entropy bonus."""

from __future__ import annotations

import torch

__all__ = ["AutogradMinibatch"]


class AutogradMinibatch:
    """``minibatch(...)`` writes one minibatch's gradient into ``flat_grad`` (the policy's
    flattened gradient) and appends its statistics; ``NumpyLearner.minibatch``'s contract."""

    def __init__(self, policy, flat_grad: torch.Tensor, ent_coef: float, vf_coef: float, clip_vf: float | None):
        self.policy, self.flat_grad = policy, flat_grad
        self.ent_coef, self.vf_coef, self.clip_vf = ent_coef, vf_coef, clip_vf

    def minibatch(self, o, a, olp, adv_b, ret, ov, clip, want_stats, target_kl, stats) -> bool:
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
