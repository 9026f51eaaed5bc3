"""The learning rate's schedule (``PPOConfig.lr_schedule``): linear, constant or adaptive.

- **linear** (the default): ``lr * max(1 - updates / num_updates, 0)``, to 0 at
  ``lr_horizon`` env steps, which is ``total_steps`` unless set (the expression PPO used
  before the schedules had a name: the same floats, bit for bit). Tied to the budget, the
  same preset learns differently when told 1M or 10M steps (at 1M the first is at rate 0,
  the second at 90%); ``lr_horizon`` ties it to a number of steps instead, so a shorter
  run is exactly the longer run's beginning.
- **constant**: ``lr`` throughout.
- **adaptive**: starts at ``lr``; after each update, the update's approximate KL ``kl``
  moves it (``adapt_lr``): above ``2 * lr_kl_target`` it is divided by ``lr_factor``,
  below ``lr_kl_target / 2`` multiplied by it, in between kept; always within
  ``[lr_min, lr_max]``. The rule is the one rl_games calls "adaptive" (written here from
  its description).

Why once per update, not per epoch or minibatch: the rate stays one number for a whole
update (the one logged as ``losses/learning_rate``), and the KL it reads is the one the
update computes anyway (its last epoch's, logged as ``losses/approx_kl``), so the
adaptive schedule costs nothing extra and the other schedules compute nothing new.
The last epoch's KL is the update's drift from the policy that acted: its minibatches
compare the policy after the earlier epochs with the rollout's log-probs.
"""

from __future__ import annotations

import math

__all__ = ["LRSchedule", "adapt_lr", "mean_kl"]


def adapt_lr(lr: float, kl: float, target: float, factor: float, lr_min: float, lr_max: float) -> float:
    """The adaptive schedule's step: the rate for the next update.

    Args:
        lr: the rate the update used.
        kl: the update's approximate KL (not finite: ``lr`` is kept, clamped).
        target: ``lr_kl_target``; the band ``[target / 2, 2 * target]`` keeps ``lr``.
        factor: ``lr_factor`` (> 1): the rate's change outside the band.
        lr_min, lr_max: the bounds the result is clamped to.

    Returns:
        The new rate.
    """
    if kl > 2.0 * target:
        lr = lr / factor
    elif kl < 0.5 * target:  # False for NaN: a KL that could not be measured moves nothing
        lr = lr * factor
    return min(max(lr, lr_min), lr_max)


def mean_kl(kls: list) -> float:
    """The mean of an update's per-minibatch approximate KLs: torch scalars (the autograd
    learner, one device sync for all of them) or floats (the numpy learner); NaN for none."""
    if not kls:
        return math.nan
    if hasattr(kls[0], "detach"):
        import torch

        return float(torch.stack([k.detach().double() for k in kls]).mean())
    return math.fsum(float(k) for k in kls) / len(kls)


class LRSchedule:
    """The rate of each update (``rate``), and the adaptive schedule's current rate, which
    a resumed run continues from (``state`` / ``load``).

    Args:
        cfg: the run's ``PPOConfig`` (``lr``, ``lr_schedule`` and the ``lr_*`` keys).
        num_updates: the updates in ``lr_horizon`` or ``total_steps`` (the linear schedule's end).
    """

    def __init__(self, cfg, num_updates: int):
        self.kind = cfg.lr_schedule
        self.base = cfg.lr
        self.num_updates = num_updates
        self.target, self.factor = cfg.lr_kl_target, cfg.lr_factor
        self.lr_min, self.lr_max = cfg.lr_min, cfg.lr_max
        self.lr = cfg.lr  # adaptive: the rate of the next update

    @property
    def adaptive(self) -> bool:
        return self.kind == "adaptive"

    def rate(self, updates: int) -> float:
        """The learning rate of the update that follows ``updates`` done."""
        if self.kind == "linear":
            frac = max(1.0 - updates / self.num_updates, 0.0)
            return self.base * frac
        if self.kind == "constant":
            return self.base
        return self.lr

    def observe(self, kl: float) -> None:
        """After an update: its approximate KL sets the adaptive rate (other schedules:
        nothing to do)."""
        if self.adaptive:
            self.lr = adapt_lr(self.lr, kl, self.target, self.factor, self.lr_min, self.lr_max)

    def state(self) -> dict:
        return {"kind": self.kind, "lr": self.lr}

    def load(self, state: dict | None) -> None:
        """Continue from ``state()`` (None, a checkpoint written before the schedules had a
        state: the run was linear or constant, which keep none)."""
        if state is not None and state["kind"] == self.kind:
            self.lr = float(state["lr"])
