"""Encoders: what turns an observation into features, the first piece of a policy.

- ``mlp_encoder``: the hidden layers of an MLP over flat vector observations (the
  observation normaliser, ``RunningNorm``, sits before it: part of the policy's input);
- ``NatureCNN``: Mnih et al.'s convolutional trunk over ``[C, H, W]`` images.

A policy (``fastvec.train.model.actor_critic``) puts a core after an encoder and its heads after
the core. Layers are initialised where they are made (``orthogonal``), so the order in
which a policy makes its pieces is the order its random initial weights are drawn in.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ..compute.ranks import SOLO, Ranks, moments
from ..config.rules import ACTIVATION_NAMES

__all__ = ["ACTIVATIONS", "RunningNorm", "NatureCNN", "mlp_encoder", "orthogonal"]

# The names are the config's (``ACTIVATION_NAMES``), in the same order.
ACTIVATIONS = dict(zip(ACTIVATION_NAMES, (nn.Tanh, nn.ReLU, nn.ELU, nn.GELU, nn.SiLU)))


def orthogonal(layer: nn.Module, gain: float) -> nn.Module:
    """Orthogonal weights with ``gain`` and zero biases (SB3's and CleanRL's initialisation)."""
    if isinstance(layer, (nn.Linear, nn.Conv2d)):
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return layer


class RunningNorm(nn.Module):
    """Running mean / variance of observations (Welford over batches, float64), applied
    as ``clip((x - mean) / sqrt(var + eps), -clip, clip)``. Part of the state dict, so a
    checkpoint normalises like the trained policy did."""

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.clip, self.eps = float(clip), float(eps)
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.register_buffer("_shift", torch.zeros(dim))
        self.register_buffer("_scale", torch.ones(dim))

    @torch.no_grad()
    def update(self, x: torch.Tensor, ranks: Ranks = SOLO) -> None:
        """Merge the batch ``x`` (of every rank's, ``ranks``) into the running statistics."""
        x = x.reshape(-1, self.mean.numel()).to(torch.float64)
        if x.shape[0] == 0 and ranks.solo:
            return
        b_mean, b_var, n = moments(x, ranks)
        if n == 0:
            return
        delta = b_mean - self.mean
        tot = self.count + n
        new_mean = self.mean + delta * n / tot
        m2 = self.var * self.count + b_var * n + delta.square() * self.count * n / tot
        self.mean.copy_(new_mean)
        self.var.copy_(m2 / tot)
        self.count.fill_(float(tot))
        self._shift.copy_(self.mean.float())
        self._scale.copy_((self.var + self.eps).rsqrt().float())

    def affine(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """``(shift, scale, clip)``: the normalisation is ``clip((x - shift) * scale)``
        (float32 tensors, updated in place by ``update``)."""
        return self._shift, self._scale, self.clip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self._shift) * self._scale).clamp_(-self.clip, self.clip)


class NatureCNN(nn.Module):
    """Mnih et al. (2015): conv 32x8x8/4, 64x4x4/2, 64x3x3/1, linear 512, ReLU."""

    def __init__(self, in_channels: int, height: int, width: int, features: int = 512):
        super().__init__()
        self.convs = nn.Sequential(
            orthogonal(nn.Conv2d(in_channels, 32, 8, stride=4), math.sqrt(2)),
            nn.ReLU(),
            orthogonal(nn.Conv2d(32, 64, 4, stride=2), math.sqrt(2)),
            nn.ReLU(),
            orthogonal(nn.Conv2d(64, 64, 3, stride=1), math.sqrt(2)),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            n = self.convs(torch.zeros(1, in_channels, height, width)).shape[1]
        self.fc = nn.Sequential(orthogonal(nn.Linear(n, features), math.sqrt(2)), nn.ReLU())
        self.features = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(x))


def mlp_encoder(sizes, activation: str, ortho: bool) -> nn.Sequential:
    """``Linear`` layers of ``sizes`` (the input's, then each hidden layer's), each followed
    by ``activation``; no layer at all for ``sizes`` of one (a linear policy's encoder:
    the features are the input)."""
    layers: list[nn.Module] = []
    act = ACTIVATIONS[activation]
    for a, b in zip(sizes[:-1], sizes[1:]):
        lin = nn.Linear(a, b)
        layers += [orthogonal(lin, math.sqrt(2)) if ortho else lin, act()]
    return nn.Sequential(*layers)
