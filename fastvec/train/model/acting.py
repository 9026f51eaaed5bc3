"""Acting: an MLP policy's per-step forward, as the trainer's hot loop runs it.

``ActingPath`` is the actor network taken apart once: its ``Linear`` weights, the
activation between them, the observation preprocessing and the action distribution.
``act`` runs it functionally (no module dispatch: about half the per-step cost of a
tiny net) and samples with noise drawn beforehand for the whole rollout. Where the
policy is a small MLP on the CPU, ``numpy`` holds the same arithmetic on numpy views of
the parameters (``NumpyActor``): a torch op costs 5-30 us of dispatch on a small VM, so
a 64x64 actor's dozen ops cost ~250 us a step for any batch size, the numpy ones ~110 us.
The views share the parameters' memory (the optimiser steps in place): a path is only
valid while the weights stay where they were (``current``); ``ActorCritic.acting_path``
makes a new one when they move (``flatten_parameters``, ``.to``).

Both forwards compute the same numbers as the module forward (``ActorCritic.actor_params``)
up to float rounding (numpy's matmul is not torch's); the torch one bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .distributions import CategoricalDist

__all__ = ["ActingPath", "NumpyActor", "vector_input", "build_acting_path"]

# The functional forms of the activation modules (the modules call these, with their
# defaults): the same numbers without a module call per layer.
_TORCH_ACTIVATIONS = {nn.Tanh: torch.tanh, nn.ReLU: torch.relu, nn.ELU: F.elu, nn.GELU: F.gelu, nn.SiLU: F.silu}


def _np_relu(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0, out=out)


_NUMPY_ACTIVATIONS = {nn.Tanh: np.tanh, nn.ReLU: _np_relu}


def vector_input(obs: torch.Tensor, obs_dim: int, one_hot_start: int | None, obs_norm) -> torch.Tensor:
    """Batched vector observations ``[B, ...]`` -> the MLP's float input ``[B, obs_dim]``
    (one-hot for ``Discrete`` observations, normalised when ``obs_norm`` is given)."""
    if one_hot_start is not None:
        return F.one_hot(obs.reshape(-1).long() - one_hot_start, obs_dim).float()
    x = obs.reshape(obs.shape[0], obs_dim)
    if x.dtype != torch.float32:
        x = x.float()
    if obs_norm is not None:
        x = obs_norm(x)
    return x


@dataclass(eq=False)
class NumpyActor:
    """The actor's arithmetic on numpy views of its parameters (CPU tensors only).

    ``gaussian``: a diagonal Gaussian (``log_std``; clipped to ``low``/``high`` where
    ``bounded``); otherwise one categorical over the last layer's outputs (Gumbel-max)."""

    layers: list[tuple[np.ndarray, np.ndarray]]
    activation: Any  # between layers (a ufunc-like function); None with a single layer
    obs_dim: int
    norm: tuple[np.ndarray, np.ndarray, float] | None  # the observation normaliser's (shift, scale, clip)
    gaussian: bool
    log_std: np.ndarray | None = None
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    bounded: bool = False

    def act(self, obs: torch.Tensor, noise: torch.Tensor, act_out: torch.Tensor, raw_out, mask=None) -> None:
        """``mask``: ``[n, actions]`` bool (a categorical's valid actions), or None."""
        n = obs.shape[0]
        x = obs.numpy().reshape(n, self.obs_dim)
        if self.norm is not None:  # in place where it can be: each numpy call costs a few us here
            shift, scale, clip = self.norm
            x = np.subtract(x, shift, dtype=np.float32)
            x *= scale
            np.minimum(x, clip, out=x)
            np.maximum(x, -clip, out=x)
        elif x.dtype != np.float32:
            x = x.astype(np.float32)
        layers, activation = self.layers, self.activation
        for w, b in layers[:-1]:
            x = x @ w.T
            x += b
            activation(x, out=x)
        w, b = layers[-1]
        params = x @ w.T
        params += b
        if self.gaussian:
            raw = raw_out.numpy() if raw_out is not None else np.empty_like(params)
            np.multiply(np.exp(self.log_std), noise.numpy(), out=raw)
            raw += params
            out = act_out.numpy().reshape(n, -1)
            out[...] = raw
            if self.bounded:
                np.minimum(out, self.high, out=out)
                np.maximum(out, self.low, out=out)
        else:  # Gumbel-max, as CategoricalDist.act_
            if mask is not None:
                np.copyto(params, -np.inf, where=~mask.numpy())
            params += noise.numpy().reshape(n, -1)
            act_out.numpy().reshape(n)[...] = params.argmax(-1)


@dataclass(eq=False)
class ActingPath:
    """An MLP actor's acting forward (build it with ``ActorCritic.acting_path()``).

    ``layers`` are the actor's ``Linear`` (weight, bias) parameters in order, with
    ``activation`` between them; the input is ``vector_input(obs, obs_dim,
    one_hot_start, obs_norm)``; ``dist`` samples from the last layer's output.
    ``numpy`` is the same forward in numpy, or None where it does not apply (another
    activation, one-hot input, a masked or offset categorical, weights off the CPU);
    ``weights_at`` the weights' data pointers when it was built."""

    layers: Sequence[tuple[torch.Tensor, torch.Tensor]]
    activation: Any  # between layers (a function); None with a single layer
    dist: Any  # the policy's CategoricalDist or GaussianDist
    obs_dim: int
    one_hot_start: int | None
    obs_norm: nn.Module | None
    numpy: NumpyActor | None
    weights_at: tuple[int, ...]

    def current(self) -> bool:
        """Whether the weights are still where the path (and its numpy views) point."""
        return self.weights_at == tuple(w.data_ptr() for w, _b in self.layers)

    def params(self, obs: torch.Tensor) -> torch.Tensor:
        """The actor's output (the distribution's parameters) for ``obs``, in torch."""
        x = vector_input(obs, self.obs_dim, self.one_hot_start, self.obs_norm)
        layers, activation = self.layers, self.activation
        for w, b in layers[:-1]:
            x = activation(F.linear(x, w, b))
        w, b = layers[-1]
        return F.linear(x, w, b)

    def act(self, obs, noise, act_out, raw_out=None, deterministic: bool = False, mask=None) -> None:
        """Sample actions for ``obs`` into ``act_out`` (and the Gaussian's raw sample into
        ``raw_out``), with ``noise`` from ``dist.sample_noise`` (call under
        ``torch.inference_mode()``), among the actions ``mask`` allows (None: all). Numpy
        where it applies and the tensors are on the CPU."""
        np_actor = self.numpy
        if np_actor is not None and not deterministic and obs.device.type == "cpu" and act_out.device.type == "cpu":
            np_actor.act(obs, noise, act_out, raw_out, mask)
        else:
            self.dist.act_(self.params(obs), noise, act_out, raw_out, deterministic, mask)


def build_acting_path(
    actor: Sequence[nn.Module], dist: Any, *, gaussian: bool, obs_dim: int, one_hot_start: int | None, obs_norm
) -> ActingPath:
    """Take ``actor`` (its modules in order: ``Linear`` layers with one kind of activation
    module between them) apart into an ``ActingPath`` over ``dist``."""
    layers = [(m.weight, m.bias) for m in actor if isinstance(m, nn.Linear)]
    kinds = [type(m) for m in actor if not isinstance(m, nn.Linear)]
    kind = kinds[0] if kinds else None
    activation = None if kind is None else _TORCH_ACTIVATIONS.get(kind) or kind()
    weights = [w for w, _b in layers]
    np_actor = None
    if (
        one_hot_start is None
        and weights[0].device.type == "cpu"
        and (kind is None or kind in _NUMPY_ACTIVATIONS)
        and (
            gaussian or (isinstance(dist, CategoricalDist) and dist.k == 1 and not dist.has_mask and not dist.has_start)
        )
    ):
        norm = None
        if obs_norm is not None:
            shift, scale, clip = obs_norm.affine()
            norm = (shift.numpy(), scale.numpy(), clip)
        np_actor = NumpyActor(
            [(w.detach().numpy(), b.detach().numpy()) for w, b in layers],
            None if kind is None else _NUMPY_ACTIVATIONS[kind],
            obs_dim,
            norm,
            gaussian,
        )
        if gaussian:
            np_actor.log_std = dist.log_std.detach().numpy()
            np_actor.low, np_actor.high, np_actor.bounded = dist.low.numpy(), dist.high.numpy(), dist.bounded
    return ActingPath(
        layers, activation, dist, obs_dim, one_hot_start, obs_norm, np_actor, tuple(w.data_ptr() for w in weights)
    )
