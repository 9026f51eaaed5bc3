"""The optimiser's side of the policy: its parameters as one flat tensor, and Adam on it.

For a tiny MLP the Python machinery around an optimiser step costs more than the
arithmetic: one flat parameter (and gradient) tensor makes Adam six in-place ops and the
gradient clip one norm (``fastvec.train.update`` uses both).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

__all__ = ["FlatAdam", "flatten_parameters"]


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
