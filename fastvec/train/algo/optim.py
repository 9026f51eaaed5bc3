"""The optimiser's side of the policy: its parameters as one flat tensor, and Adam on it.

For a tiny MLP the Python machinery around an optimiser step costs more than the
arithmetic: one flat parameter (and gradient) tensor makes Adam six in-place ops and the
gradient clip one norm (``fastvec.train.algo.update`` uses both).

The learning rate's schedule (``PPOConfig.lr_schedule``): linear, constant or adaptive.

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

import torch
import torch.nn as nn

__all__ = ["FlatAdam", "flatten_parameters", "LRSchedule", "adapt_lr", "mean_kl"]


def flatten_parameters(module: nn.Module):
    """Make every trainable parameter of ``module`` (and its gradient) a view into one
    flat tensor; returns ``(flat_param, flat_grad)``. The optimiser then steps one
    tensor and gradient clipping is one norm: for tiny MLPs that is a third of the cost
    of an update step. Autograd accumulates into the existing ``.grad`` views in place;
    zero ``flat_grad`` (never set grads to None) between steps."""
    params = [p for p in module.parameters() if p.requires_grad]
    total = sum(p.numel() for p in params)
    flat = torch.zeros(total, dtype=params[0].dtype, device=params[0].device)
    grad = torch.zeros_like(flat)
    off = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat[off : off + n].copy_(p.reshape(-1))
            p.data = flat[off : off + n].view_as(p)
            p.grad = grad[off : off + n].view_as(p)
            off += n
    flat_param = nn.Parameter(flat)
    flat_param.grad = grad
    return flat_param, grad


class FlatAdam:
    """Adam (Kingma & Ba; torch.optim.Adam's arithmetic, no AMSGrad, no weight decay)
    for one flat parameter: six in-place ops per step instead of torch.optim's
    per-step Python machinery (which costs more than a tiny MLP's backward pass)."""

    def __init__(self, param: torch.Tensor, lr: float, eps: float = 1e-8, betas=(0.9, 0.999)):
        self.param = param
        self.lr, self.eps = lr, eps
        self.b1, self.b2 = betas
        self.m = torch.zeros_like(param)
        self.v = torch.zeros_like(param)
        self.t = 0
        self._denom = torch.empty_like(param)

    def step(self) -> None:
        g = self.param.grad
        self.t += 1
        b1, b2 = self.b1, self.b2
        bc1 = 1.0 - b1**self.t
        bc2 = 1.0 - b2**self.t
        with torch.no_grad():
            self.m.lerp_(g, 1.0 - b1)
            self.v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            torch.sqrt(self.v, out=self._denom).div_(math.sqrt(bc2)).add_(self.eps)
            self.param.addcdiv_(self.m, self._denom, value=-self.lr / bc1)

    def state_dict(self) -> dict:
        return {
            "m": self.m.detach().cpu().clone(),
            "v": self.v.detach().cpu().clone(),
            "t": self.t,
            "lr": self.lr,
            "eps": self.eps,
            "betas": (self.b1, self.b2),
        }

    def load_state_dict(self, state: dict) -> None:
        if state["m"].shape != self.m.shape:
            raise ValueError(f"optimiser state for {state['m'].numel()} parameters, the policy has {self.m.numel()}")
        with torch.no_grad():
            self.m.copy_(state["m"])
            self.v.copy_(state["v"])
        self.t, self.lr, self.eps = int(state["t"]), float(state["lr"]), float(state["eps"])
        self.b1, self.b2 = state["betas"]


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
