"""Composite actions: a ``Dict`` or ``Tuple`` action space (nested too) of ``Discrete``,
``MultiDiscrete``, ``MultiBinary`` and floating-point ``Box`` leaves, as one flat vector.

The trainer acts with a product distribution, one factor per leaf (a categorical per
discrete choice, a diagonal Gaussian per ``Box``; ``fastvec.train.model.distributions``).
What it writes into the engine's shared action buffer is one ``float32`` vector per env,
the leaves side by side in the space's order (a ``Discrete`` leaf one column holding its
value, a ``MultiDiscrete`` or ``MultiBinary`` leaf one column per component, a ``Box``
leaf its values flattened): ``FlatActions``, a wrapper around each env in its worker,
turns that vector back into the env's own ``Dict``/``Tuple`` action before the env's
``step``. The flat space is a ``FlatActionBox``: a ``Box`` with the leaves' bounds that
remembers the composite space it stands for (``composite``), which is how the trainer
knows to act with the product distribution.

Discrete values travel as float32, exact up to 2**24; a leaf with more choices is refused.
``flat_action`` and ``composite_action`` convert one action either way, for a user
stepping an unwrapped env with ``ActorCritic.predict``'s output.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = [
    "ActionLeaf",
    "FlatActionBox",
    "FlatActions",
    "action_leaves",
    "composite_action",
    "flat_action",
    "flat_actions_factory",
    "is_composite_action",
]

_EXACT = 2**24  # the integers float32 holds exactly


def is_composite_action(space: spaces.Space) -> bool:
    """Whether ``space`` is a ``Dict`` or ``Tuple`` action space."""
    return isinstance(space, spaces.Dict | spaces.Tuple)


@dataclass(frozen=True)
class ActionLeaf:
    """One leaf of a composite action space: where it sits (``path``, its keys and
    indices), its space, and its columns ``start .. start + width`` of the flat vector."""

    path: tuple
    space: spaces.Space
    start: int
    width: int

    @property
    def name(self) -> str:
        return "/".join(str(p) for p in self.path) or "(the action)"


def _leaf_bounds(path: tuple, space: spaces.Space) -> tuple[np.ndarray, np.ndarray]:
    """The flat columns' low and high of one leaf; ValueError (one line) where the
    trainer cannot act on it."""
    name = "/".join(str(p) for p in path)
    if isinstance(space, spaces.Discrete):
        low, high = np.array([space.start]), np.array([space.start + space.n - 1])
    elif isinstance(space, spaces.MultiDiscrete):
        low, high = space.start.reshape(-1), (space.start + space.nvec - 1).reshape(-1)
    elif isinstance(space, spaces.MultiBinary):
        n = int(np.prod(space.shape))
        low, high = np.zeros(n), np.ones(n)
    elif isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.floating):
        low, high = space.low.reshape(-1), space.high.reshape(-1)
    else:
        raise ValueError(
            f"the action leaf {name} is {space}: composite actions take Discrete, MultiDiscrete, "
            "MultiBinary and floating-point Box leaves"
        )
    if not isinstance(space, spaces.Box) and max(abs(low).max(), abs(high).max()) >= _EXACT:
        raise ValueError(
            f"the action leaf {name} has values beyond 2**24, which a float32 column does not hold exactly"
        )
    return low.astype(np.float32), high.astype(np.float32)


def action_leaves(space: spaces.Space) -> list[ActionLeaf]:
    """The leaves of a composite action space in the order the flat vector holds them
    (a ``Dict``'s keys in its own order, a ``Tuple``'s items in theirs, depth first);
    ValueError (one line, naming the leaf) for a leaf the trainer cannot act on."""
    leaves: list[ActionLeaf] = []

    def walk(path: tuple, sub: spaces.Space) -> None:
        if isinstance(sub, spaces.Dict):
            for key, child in sub.spaces.items():
                walk((*path, key), child)
        elif isinstance(sub, spaces.Tuple):
            for i, child in enumerate(sub.spaces):
                walk((*path, i), child)
        else:
            low, _high = _leaf_bounds(path, sub)
            start = leaves[-1].start + leaves[-1].width if leaves else 0
            leaves.append(ActionLeaf(path, sub, start, int(low.size)))

    walk((), space)
    if not leaves:
        raise ValueError(f"the action space {space} has no leaves")
    return leaves


class FlatActionBox(spaces.Box):
    """The flat ``float32`` vector standing for the composite action space
    ``composite`` (its leaves' columns, with their bounds)."""

    def __init__(self, composite: spaces.Space):
        if not is_composite_action(composite):
            raise ValueError(f"FlatActionBox stands for a Dict or Tuple action space, not {composite}")
        bounds = [_leaf_bounds(leaf.path, leaf.space) for leaf in action_leaves(composite)]
        super().__init__(
            np.concatenate([b[0] for b in bounds]), np.concatenate([b[1] for b in bounds]), dtype=np.float32
        )
        self.composite = composite

    def __repr__(self) -> str:
        return f"FlatActionBox({self.composite}, {self.shape[0]} columns)"

    def __eq__(self, other) -> bool:
        return isinstance(other, FlatActionBox) and self.composite == other.composite


def composite_action(space: spaces.Space, flat, leaves: list[ActionLeaf] | None = None) -> dict | tuple:
    """The env's own action (``space``'s ``Dict`` or ``Tuple``) from one flat vector
    (``leaves``: ``action_leaves(space)``, where the caller keeps them)."""
    flat = np.asarray(flat).reshape(-1)
    out: dict = {}
    for leaf in leaves if leaves is not None else action_leaves(space):
        col = flat[leaf.start : leaf.start + leaf.width]
        sub = leaf.space
        if isinstance(sub, spaces.Discrete):
            value = np.int64(np.rint(col[0]))
        elif isinstance(sub, spaces.Box):
            value = col.reshape(sub.shape).astype(sub.dtype)
        else:  # MultiDiscrete, MultiBinary
            value = np.rint(col).reshape(sub.shape).astype(sub.dtype)
        out[leaf.path] = value
    return _nest(space, (), out)


def _nest(space: spaces.Space, path: tuple, values: dict):
    if isinstance(space, spaces.Dict):
        return {k: _nest(s, (*path, k), values) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_nest(s, (*path, i), values) for i, s in enumerate(space.spaces))
    return values[path]


def flat_action(space: spaces.Space, action) -> np.ndarray:
    """One composite action of ``space`` as the flat ``float32`` vector."""
    leaves = action_leaves(space)
    out = np.empty(sum(leaf.width for leaf in leaves), np.float32)
    for leaf in leaves:
        value = action
        for key in leaf.path:
            value = value[key]
        out[leaf.start : leaf.start + leaf.width] = np.asarray(value, np.float64).reshape(-1)
    return out


class FlatActions(gym.ActionWrapper):
    """An env with a composite action space, acted on through the flat vector
    (``FlatActionBox``): each action is turned back into the env's own before its step."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.action_space = FlatActionBox(env.action_space)
        self.leaves = action_leaves(env.action_space)  # (once: every step reads them)

    def action(self, action):
        return composite_action(self.env.action_space, action, self.leaves)


def _with_flat_actions(fn: Callable[[], gym.Env]) -> gym.Env:
    env = fn()
    return FlatActions(env) if is_composite_action(env.action_space) else env


def flat_actions_factory(fn: Callable[[], gym.Env]) -> Callable[[], gym.Env]:
    """``fn``'s envs, those with a composite action space wrapped in ``FlatActions``
    (picklable where ``fn`` is)."""
    return functools.partial(_with_flat_actions, fn)
