"""The action distributions of the trainer's policies, chosen from the action space.

- ``CategoricalDist``: independent categoricals for ``Discrete``, ``MultiDiscrete`` (one
  per component) and ``MultiBinary`` (two-way) actions;
- ``GaussianDist``: a diagonal Gaussian with a state-independent log std for ``Box``;
- ``ProductDist``: one of those per leaf of a ``Dict``/``Tuple`` action space
  (``fastvec.composite_actions``), the log-probabilities and entropies summed.

A categorical built with ``masked=True`` takes action masks (``fastvec.action_masks``):
one boolean per choice, the components' masks concatenated (``[B, sum(nvec)]``); masked
choices get a -inf logit, so they are never sampled and the log-probabilities and the
entropy are over the valid choices only (sb3-contrib's ``MaskablePPO`` semantics). Its
learner's actions carry their masks beside them (``join``: ``[B, k + sum(nvec)]``), so
every pass over a rollout's actions honours the masks acting saw.

Both sample with noise drawn for a whole rollout at once (``sample_noise``: Gumbel-max
for categoricals, ``mean + std * eps`` for Gaussians) and write the actions straight into
the caller's tensors (``act_``): the engine's shared action buffers, in the trainer's
hot loop.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
from gymnasium import spaces

from ...composite_actions import FlatActionBox, action_leaves, is_composite_action

__all__ = ["CategoricalDist", "GaussianDist", "ProductDist", "make_dist"]


class CategoricalDist(nn.Module):
    """Independent categoricals over ``k`` components with ``nvec`` choices each,
    laid out as ``[B, k, max_n]`` logits; missing choices are masked to -inf.
    ``Discrete`` is ``k = 1`` (actions of shape ``[B]``); ``MultiBinary`` is
    ``nvec = 2``."""

    def __init__(self, nvec, start=None, action_shape=(), squeeze=True, masked=False):
        super().__init__()
        nvec = np.asarray(nvec, dtype=np.int64).reshape(-1)
        self.k, self.max_n = int(nvec.size), int(nvec.max())
        self.masked, self.mask_size = bool(masked), int(nvec.sum())
        # where choice j of component i is in a mask row (mask_size: a padding choice, never valid)
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
        at = np.where(np.arange(self.max_n)[None, :] < nvec[:, None], offsets[:, None] + np.arange(self.max_n), -1)
        self.register_buffer("mask_at", torch.as_tensor(np.where(at < 0, self.mask_size, at)), persistent=False)
        self.n_params = self.k * self.max_n
        self.action_shape = tuple(action_shape)
        self.squeeze = squeeze
        mask = np.arange(self.max_n)[None, :] >= nvec[:, None]  # True where invalid
        self.has_mask = bool(mask.any())
        self.register_buffer("invalid", torch.as_tensor(mask))
        self.register_buffer("neg_inf", torch.as_tensor(np.where(mask, -np.inf, 0.0), dtype=torch.float32))
        start = np.zeros(self.k, np.int64) if start is None else np.asarray(start, np.int64).reshape(-1)
        self.has_start = bool(np.any(start != 0))
        self.register_buffer("start", torch.as_tensor(start))
        self.raw_action_dtype = None  # actions are stored in the env's own buffer

    def noise_shape(self, n_envs: int):
        return (n_envs, self.k, self.max_n)

    def sample_noise(self, out: torch.Tensor) -> torch.Tensor:
        """Gumbel noise, in place: -log(Exp(1)) (an exact 0 draw is clamped: +inf noise
        on a masked -inf logit would give NaN)."""
        return out.exponential_().clamp_(min=1e-30).log_().neg_()

    def valid(self, mask: torch.Tensor) -> torch.Tensor:
        """Action masks ``[B, sum(nvec)]`` (bool) as ``[B, k, max_n]``: the valid choices."""
        if self.k == 1:
            return mask.view(mask.shape[0], 1, self.max_n)
        return torch.cat([mask, mask.new_zeros(mask.shape[0], 1)], 1)[:, self.mask_at]

    def join(self, actions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Actions ``[B, ...]`` and their masks ``[B, sum(nvec)]`` as one int64 tensor
        ``[B, k + sum(nvec)]`` (what a masked categorical's ``log_prob`` takes)."""
        return torch.cat([actions.reshape(actions.shape[0], self.k).long(), mask.long()], 1)

    def _split(self, actions: torch.Tensor, mask):
        if self.masked and mask is None:  # joined: the masks acting saw
            return actions[:, : self.k], actions[:, self.k :].bool()
        return actions, mask

    def _logits(self, params: torch.Tensor, mask=None) -> torch.Tensor:
        logits = params.reshape(params.shape[0], self.k, self.max_n)
        if self.has_mask:
            logits = logits + self.neg_inf
        if mask is not None:
            logits = logits.masked_fill(~self.valid(mask), -math.inf)
        return logits

    def act_(self, params, noise, act_out, raw_out=None, deterministic=False, mask=None):
        """Sample (Gumbel-max) into ``act_out`` (shape ``[B, *action_shape]``) among the
        choices ``mask`` allows (None: all); returns the sampled actions (for ``log_prob``)."""
        logits = self._logits(params, mask)
        if not deterministic:
            logits = logits + noise
        b = logits.shape[0]
        if (
            not self.has_start
            and act_out.dtype == torch.int64
            and act_out.device == logits.device
            and act_out.is_contiguous()
        ):
            out = act_out.view(b, self.k)
            torch.argmax(logits, -1, out=out)
            return out
        idx = logits.argmax(-1)
        if self.has_start:
            idx = idx + self.start
        act_out.copy_(idx.reshape(act_out.shape))
        return idx

    def _index(self, actions: torch.Tensor) -> torch.Tensor:
        a = actions.reshape(actions.shape[0], self.k)
        if a.dtype != torch.int64:
            a = a.long()
        if self.has_start:
            a = a - self.start
        return a

    def log_prob_entropy(self, params, actions, need_entropy=True, mask=None):
        """Log-probabilities of ``actions`` and the entropies, over the choices ``mask``
        allows (a masked categorical's actions without a mask: ``join``'s)."""
        actions, mask = self._split(actions, mask)
        if self.k == 1 and not self.has_mask and not self.has_start and mask is None:
            # Discrete: no reshapes (each view is an autograd node in the update).
            logp_all = torch.log_softmax(params, -1)
            a = actions if actions.dtype == torch.int64 else actions.long()
            logp = logp_all.gather(1, a.view(-1, 1)).view(-1)
            if not need_entropy:
                return logp, None
            return logp, -(logp_all.exp() * logp_all).sum(-1)
        logits = self._logits(params, mask)
        logp_all = torch.log_softmax(logits, -1)
        idx = self._index(actions)
        logp = logp_all.gather(-1, idx.unsqueeze(-1)).squeeze(-1).sum(-1)
        if not need_entropy:
            return logp, None
        p = logp_all.exp()
        if mask is not None:  # the invalid choices' terms are 0 * -inf: left out
            logp_all = logp_all.masked_fill(~self.valid(mask), 0.0)
        elif self.has_mask:
            logp_all = logp_all.masked_fill(self.invalid, 0.0)
        ent = -(p * logp_all).sum(-1).sum(-1)
        return logp, ent

    def log_prob(self, params, actions, mask=None):
        return self.log_prob_entropy(params, actions, need_entropy=False, mask=mask)[0]


class GaussianDist(nn.Module):
    """Diagonal Gaussian with a learned, state-independent log std. The sampled
    (unclipped) action is kept for the log-probability; the env gets it clipped to the
    Box bounds (as SB3 does)."""

    def __init__(self, space: spaces.Box, log_std_init: float = 0.0):
        super().__init__()
        self.action_shape = tuple(space.shape)
        self.dim = int(np.prod(space.shape, dtype=np.int64))
        self.n_params = self.dim
        self.log_std = nn.Parameter(torch.full((self.dim,), float(log_std_init)))
        low = np.broadcast_to(np.asarray(space.low, np.float32), space.shape).reshape(-1)
        high = np.broadcast_to(np.asarray(space.high, np.float32), space.shape).reshape(-1)
        self.register_buffer("low", torch.as_tensor(low.copy()))
        self.register_buffer("high", torch.as_tensor(high.copy()))
        self.bounded = bool(np.isfinite(low).any() or np.isfinite(high).any())
        self.raw_action_dtype = torch.float32

    def noise_shape(self, n_envs: int):
        return (n_envs, self.dim)

    def sample_noise(self, out: torch.Tensor) -> torch.Tensor:
        return out.normal_()

    masked = False

    def act_(self, params, noise, act_out, raw_out=None, deterministic=False, mask=None):
        """Sample into ``raw_out`` (``[B, dim]``, float32) and write the clipped
        action into ``act_out`` (``[B, *action_shape]``, the env's dtype)."""
        if deterministic:
            raw = params
        elif raw_out is not None:
            raw = torch.addcmul(params, self.log_std.exp(), noise, out=raw_out)
        else:
            raw = torch.addcmul(params, self.log_std.exp(), noise)
        flat_out = act_out.reshape(act_out.shape[0], self.dim)
        if self.bounded:
            if flat_out.dtype == torch.float32 and flat_out.device == raw.device and flat_out.is_contiguous():
                torch.clamp(raw, self.low, self.high, out=flat_out)
            else:
                flat_out.copy_(torch.clamp(raw, self.low, self.high))
        else:
            flat_out.copy_(raw)
        return raw

    def log_prob_entropy(self, params, raw_actions, need_entropy=True, mask=None):
        """(``mask``: always None here; a Gaussian takes no action masks.)"""
        log_std = self.log_std
        z = (raw_actions.reshape(params.shape) - params) * torch.exp(-log_std)
        logp = (-0.5 * z.square() - log_std).sum(-1) - 0.5 * math.log(2 * math.pi) * self.dim
        if not need_entropy:
            return logp, None
        ent = (log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum().expand(params.shape[0])
        return logp, ent

    def log_prob(self, params, raw_actions, mask=None):
        return self.log_prob_entropy(params, raw_actions, need_entropy=False)[0]


class ProductDist(nn.Module):
    """A composite (``Dict``/``Tuple``) action space's distribution: one factor per leaf
    (``make_dist``'s for the leaf's space), independent, so the log-probability and the
    entropy are the factors' sums. Its actions are the flat ``float32`` vectors of
    ``fastvec.composite_actions`` (what the env's ``FlatActions`` takes); its raw actions,
    which ``log_prob`` takes, the same vectors with each Gaussian leaf's sample unclipped."""

    masked = False

    def __init__(self, flat: FlatActionBox, log_std_init: float = 0.0):
        super().__init__()
        self.leaves = action_leaves(flat.composite)
        self.parts = nn.ModuleList(make_dist(leaf.space, log_std_init) for leaf in self.leaves)
        self.dim = int(flat.shape[0])
        self.action_shape = (self.dim,)
        self.raw_action_dtype = torch.float32
        self.n_params = sum(p.n_params for p in self.parts)
        self.param_cols = _columns([p.n_params for p in self.parts])
        self.noise_cols = _columns([math.prod(p.noise_shape(1)[1:]) for p in self.parts])
        self.action_cols = [(leaf.start, leaf.start + leaf.width) for leaf in self.leaves]

    def noise_shape(self, n_envs: int):
        return (n_envs, self.noise_cols[-1][1])

    def sample_noise(self, out: torch.Tensor) -> torch.Tensor:
        """Each factor's noise into its columns of ``out`` (``[..., noise columns]``)."""
        for part, (a, b) in zip(self.parts, self.noise_cols):
            part.sample_noise(out[..., a:b])
        return out

    def _factors(self, params: torch.Tensor, other: torch.Tensor, noise: bool):
        """Each factor with its columns of ``params`` and of ``other`` (the noise, shaped
        as the factor draws it, or the actions)."""
        b = params.shape[0]
        for part, (pa, pb), (oa, ob) in zip(
            self.parts, self.param_cols, self.noise_cols if noise else self.action_cols
        ):
            piece = other[:, oa:ob]
            yield part, params[:, pa:pb], piece.reshape(b, *part.noise_shape(b)[1:]) if noise else piece

    def act_(self, params, noise, act_out, raw_out=None, deterministic=False, mask=None):
        """Sample each factor; the env's flat actions into ``act_out`` (``[B, dim]``) and
        the raw ones into ``raw_out`` (where given); returns the raw ones."""
        b = params.shape[0]
        acts, raws = [], []
        for part, p, z in self._factors(params, noise, noise=True):
            if isinstance(part, GaussianDist):
                act = torch.empty((b, part.dim), device=params.device)
                raw = part.act_(p, z, act, None, deterministic)
            else:
                idx = torch.empty((b, part.k), dtype=torch.int64, device=params.device)
                act = raw = part.act_(p, z, idx, None, deterministic).reshape(b, part.k).float()
            acts.append(act)
            raws.append(raw)
        raw = torch.cat(raws, 1)
        act_out.reshape(b, self.dim).copy_(torch.cat(acts, 1))
        if raw_out is not None:
            raw_out.copy_(raw)
        return raw

    def log_prob_entropy(self, params, raw_actions, need_entropy=True, mask=None):
        """The factors' log-probabilities and entropies, summed (``mask``: always None)."""
        logp = ent = None
        for part, p, a in self._factors(params, raw_actions.reshape(params.shape[0], self.dim), noise=False):
            lp, e = part.log_prob_entropy(p, a, need_entropy)
            logp = lp if logp is None else logp + lp
            ent = e if ent is None else ent + e
        return logp, ent

    def log_prob(self, params, raw_actions, mask=None):
        return self.log_prob_entropy(params, raw_actions, need_entropy=False)[0]


def _columns(widths) -> list[tuple[int, int]]:
    ends = np.cumsum(widths).tolist()
    return [(int(e - w), int(e)) for w, e in zip(widths, ends)]


def make_dist(act_space: spaces.Space, log_std_init: float = 0.0, masked: bool = False) -> nn.Module:
    """The distribution for ``act_space``; ``masked``: one that takes action masks
    (``Discrete`` and ``MultiDiscrete`` only)."""
    if isinstance(act_space, FlatActionBox):
        if masked:
            raise ValueError("action masks serve Discrete and MultiDiscrete actions, not composite ones")
        return ProductDist(act_space, log_std_init)
    if isinstance(act_space, spaces.Discrete):
        return CategoricalDist([act_space.n], [act_space.start], action_shape=(), masked=masked)
    if isinstance(act_space, spaces.MultiDiscrete):
        return CategoricalDist(
            act_space.nvec.reshape(-1), act_space.start.reshape(-1), action_shape=act_space.nvec.shape, masked=masked
        )
    if masked:
        raise ValueError(f"action masks need a Discrete or MultiDiscrete action space, not {act_space}")
    if isinstance(act_space, spaces.MultiBinary):
        shape = tuple(np.atleast_1d(act_space.shape))
        k = int(np.prod(shape))
        return CategoricalDist([2] * k, None, action_shape=shape)
    if isinstance(act_space, spaces.Box):
        if not np.issubdtype(act_space.dtype, np.floating):
            raise ValueError(f"the PPO trainer needs a floating-point Box for continuous actions, got {act_space}")
        return GaussianDist(act_space, log_std_init)
    if is_composite_action(act_space):  # (a vector env of the user's own: its envs not wrapped)
        raise ValueError(
            f"the PPO trainer takes {type(act_space).__name__} actions from envs it builds by id, or from "
            "envs wrapped in fastvec.composite_actions.FlatActions"
        )
    raise ValueError(
        f"the PPO trainer does not support {type(act_space).__name__} actions; "
        "use Discrete, MultiDiscrete, MultiBinary, Box, or a Dict/Tuple of them"
    )
