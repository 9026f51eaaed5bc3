"""Dict and Tuple observations: their leaves as the trainer holds them, and the encoder
that turns them into one feature vector.

- ``Leaves``: a composite observation's leaf arrays (numpy or torch) in the space's fixed
  depth-first order (``fastvec._core.segment.leaves_of``, the order the engine's ring
  lays them out in), each with the same leading dimensions; indexing, ``flatten``,
  ``copy_`` and ``to`` apply to every leaf, so a rollout's ``[T + 1, N, ...]`` views,
  their slots and their minibatches are all ``Leaves`` where the space is composite;
- ``input_leaves(space)``: the leaves a policy encodes (None for a plain space), or a
  one-line ``ValueError`` naming the first leaf it cannot encode;
- ``MultiInputEncoder``: one encoder per leaf (the Nature CNN for an image, the running
  normaliser for a vector ``Box``, one-hot for ``Discrete`` and ``MultiDiscrete``,
  ``MultiBinary`` as 0/1 floats), their features concatenated (the design of SB3's
  ``CombinedExtractor``); ``fastvec.train.model.actor_critic`` puts the MLP bodies after it;
- ``is_image_space``, ``flat_obs_dim``: how a plain observation space is read (the Nature
  CNN's image, or the MLP's input size).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from gymnasium import spaces

from ..._core.segment import leaves_of
from ..compute.ranks import SOLO, Ranks
from .encoders import NatureCNN, RunningNorm

__all__ = [
    "Leaves",
    "InputLeaf",
    "input_leaves",
    "is_composite",
    "image_layout",
    "is_image_space",
    "flat_obs_dim",
    "as_torch",
    "leaf_arrays",
    "MultiInputEncoder",
]


class Leaves:
    """A composite observation's leaves (``leaves``: a tuple of arrays, numpy or torch,
    sharing their leading dimensions); what is done to it is done to each leaf, and a
    leaf taken by a basic index stays a view of its array."""

    __slots__ = ("leaves",)

    def __init__(self, leaves):
        self.leaves = tuple(leaves)

    def map(self, fn) -> Leaves:
        return Leaves(fn(x) for x in self.leaves)

    def __getitem__(self, idx) -> Leaves:
        return Leaves(x[idx] for x in self.leaves)

    def flatten(self, start: int, end: int) -> Leaves:
        return Leaves(x.flatten(start, end) for x in self.leaves)

    def unflatten(self, dim: int, sizes) -> Leaves:
        return Leaves(x.unflatten(dim, sizes) for x in self.leaves)

    def to(self, *args, **kwargs) -> Leaves:
        return Leaves(x.to(*args, **kwargs) for x in self.leaves)

    def copy_(self, src: Leaves, non_blocking: bool = False) -> Leaves:
        for dst, s in zip(self.leaves, src.leaves):
            dst.copy_(s, non_blocking=non_blocking)
        return self

    @property
    def device(self):
        return self.leaves[0].device

    def __repr__(self) -> str:
        return f"Leaves({', '.join(f'{tuple(x.shape)} {x.dtype}' for x in self.leaves)})"


def is_composite(space) -> bool:
    """A Dict or Tuple space."""
    return isinstance(space, (spaces.Dict, spaces.Tuple))


def as_torch(x):
    """``torch.from_numpy`` of an array, or of each leaf of ``Leaves`` (views)."""
    return x.map(torch.from_numpy) if isinstance(x, Leaves) else torch.from_numpy(x)


def leaf_arrays(x) -> tuple:
    """The arrays of ``x``: its leaves, or ``x`` alone."""
    return x.leaves if isinstance(x, Leaves) else (x,)


def empty_like_on(x, device):
    """A new, uninitialised array shaped as ``x`` (each leaf of ``Leaves``) on ``device``."""
    if isinstance(x, Leaves):
        return x.map(lambda a: torch.empty(a.shape, dtype=a.dtype, device=device))
    return torch.empty(x.shape, dtype=x.dtype, device=device)


def image_layout(shape):
    """'chw' or 'hwc' (channels first preferred), or None where a rank-3 ``shape`` is not
    an image's (the trainer's rule: at most 16 channels, at least 36x36)."""
    c, h, w = shape
    if c <= 16 and h >= 36 and w >= 36:
        return "chw"
    h, w, c = shape
    if c <= 16 and h >= 36 and w >= 36:
        return "hwc"
    return None


def is_image_space(space: spaces.Space) -> bool:
    """A ``uint8`` Box of rank 3 (``[C, H, W]`` or ``[H, W, C]``), large enough for the
    Nature CNN (at least 36x36)."""
    if not isinstance(space, spaces.Box) or space.dtype != np.uint8 or len(space.shape) != 3:
        return False
    return image_layout(space.shape) is not None


def flat_obs_dim(space: spaces.Space) -> int:
    """The MLP's input size for a plain (non-image) observation space; ValueError for another."""
    if isinstance(space, spaces.Box):
        return int(np.prod(space.shape, dtype=np.int64))
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return int(space.nvec.size)
    if isinstance(space, spaces.MultiBinary):
        return int(np.prod(np.atleast_1d(space.shape)))
    raise ValueError(
        f"the PPO trainer does not support {type(space).__name__} observations; "
        "use a Box, Discrete, MultiDiscrete or MultiBinary observation space "
        "(flatten Dict/Tuple observations with gymnasium.wrappers.FlattenObservation)"
    )


class InputLeaf(NamedTuple):
    """One leaf of an observation as the policy encodes it: its key path, its space and
    its ``kind``: image, box, discrete, multidiscrete or binary."""

    path: tuple
    space: Any
    kind: str


def key_path(path: tuple) -> str:
    """A leaf's key path as the messages show it: ``obs["pos"]``, ``obs[0]["goal"]``."""
    return "obs" + "".join(f"[{k!r}]" for k in path)


def _leaf_kind(path: tuple, space) -> str:
    where = key_path(path)
    if isinstance(space, spaces.Box):
        if len(space.shape) == 3 and image_layout(space.shape) is not None:
            if space.dtype == np.uint8:
                return "image"
            raise ValueError(
                f"the PPO trainer cannot tell whether {where} (a {space.dtype} Box {space.shape}) is an image: "
                "give images as uint8 (a TransformObservation casting it), or flatten it "
                "(FlattenObservation on that leaf) for the MLP"
            )
        return "box"
    kinds = {spaces.Discrete: "discrete", spaces.MultiDiscrete: "multidiscrete", spaces.MultiBinary: "binary"}
    if type(space) in kinds:
        return kinds[type(space)]
    raise ValueError(
        f"the PPO trainer cannot encode {where}, a {type(space).__name__} space: leave it out "
        "(gymnasium.wrappers.FilterObservation) or turn it into a Box "
        "(gymnasium.wrappers.TransformObservation)"
    )


def input_leaves(space) -> list[InputLeaf] | None:
    """The leaves of a Dict/Tuple ``space`` as the policy encodes them (None: not a
    composite space). ValueError, one line, at the first leaf it cannot encode."""
    if not is_composite(space):
        return None
    out = []
    for leaf in leaves_of(space, pickled=True):
        out.append(InputLeaf(leaf.path, leaf.space, _leaf_kind(leaf.path, leaf.space)))
    if not out:
        raise ValueError(f"the observation space {space} holds no leaf to encode")
    return out


def batch_leaves(space, obs) -> Leaves:
    """A batch of composite observations as gymnasium's vector envs give it (nested
    dicts / tuples of batched arrays) -> ``Leaves`` in the space's leaf order."""
    out = []
    for leaf in leaves_of(space, pickled=True):
        x = obs
        for k in leaf.path:
            x = x[k]
        out.append(np.asarray(x))
    return Leaves(out)


class MultiInputEncoder(nn.Module):
    """Each leaf of a composite observation to features, concatenated ``[B, features]``
    (see the module docstring). ``normalize``: a ``RunningNorm`` per vector ``Box`` leaf
    (images are scaled to [0, 1], discrete leaves are not normalised)."""

    def __init__(self, leaves: list[InputLeaf], cnn_features: int = 512, normalize: bool = False):
        super().__init__()
        self.kinds = [leaf.kind for leaf in leaves]
        self.paths = [leaf.path for leaf in leaves]
        self.cnns = nn.ModuleDict()
        self.norms = nn.ModuleDict()
        self.hwc: dict[int, bool] = {}
        self.sizes: list[int] = []
        for i, leaf in enumerate(leaves):
            self.sizes.append(self._leaf_encoder(i, leaf, cnn_features, normalize))
        self.features = sum(self.sizes)

    def _leaf_encoder(self, i: int, leaf: InputLeaf, cnn_features: int, normalize: bool) -> int:
        """Make leaf ``i``'s encoder (where it has one); its features' size."""
        sp = leaf.space
        if leaf.kind == "image":
            self.hwc[i] = image_layout(sp.shape) == "hwc"
            c, h, w = (sp.shape[2], *sp.shape[:2]) if self.hwc[i] else sp.shape
            self.cnns[str(i)] = NatureCNN(c, h, w, cnn_features)
            return cnn_features
        if leaf.kind == "box":
            dim = int(np.prod(sp.shape, dtype=np.int64))
            if normalize:
                self.norms[str(i)] = RunningNorm(dim)
            return dim
        if leaf.kind == "discrete":
            self.register_buffer(f"_start{i}", torch.tensor(int(sp.start)), persistent=False)
            return int(sp.n)
        if leaf.kind == "multidiscrete":
            nvec = torch.as_tensor(sp.nvec.reshape(-1), dtype=torch.int64)
            start = torch.as_tensor(np.broadcast_to(getattr(sp, "start", 0), sp.nvec.shape).flatten())
            offsets = torch.cumsum(nvec, 0) - nvec  # where each sub-space's one-hot begins
            self.register_buffer(f"_offset{i}", offsets - start.to(torch.int64), persistent=False)
            return int(nvec.sum())
        return int(np.prod(np.atleast_1d(sp.shape)))

    def encode(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Leaf ``i``'s batch ``[B, ...]`` (as the env gives it) -> its features ``[B, size]``."""
        kind, n = self.kinds[i], x.shape[0]
        if kind == "image":
            x = x.permute(0, 3, 1, 2) if self.hwc[i] else x
            return self.cnns[str(i)](x.float().mul_(1.0 / 255.0))
        if kind == "discrete":
            return F.one_hot(x.reshape(n).long() - getattr(self, f"_start{i}"), self.sizes[i]).float()
        if kind == "multidiscrete":
            at = x.reshape(n, -1).long() + getattr(self, f"_offset{i}")
            return torch.zeros(n, self.sizes[i], device=x.device).scatter_(1, at, 1.0)
        x = x.reshape(n, self.sizes[i]).float()
        norm = self.norms[str(i)] if str(i) in self.norms else None
        return x if norm is None else norm(x)

    def forward(self, obs: Leaves) -> torch.Tensor:
        return torch.cat([self.encode(i, x) for i, x in enumerate(obs.leaves)], 1)

    def update(self, obs: Leaves, ranks: Ranks = SOLO) -> None:
        """Merge a batch of observations (any leading dims) into each vector ``Box``
        leaf's running statistics."""
        for key, norm in self.norms.items():
            norm.update(obs.leaves[int(key)], ranks)

    def describe(self) -> str:
        return " + ".join(f"{key_path(p)}:{k}" for p, k in zip(self.paths, self.kinds))
