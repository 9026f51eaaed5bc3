"""Action masks: which actions an env allows at each step, read where the env gives them.

A masked env tells the trainer, with every observation, which actions are valid: one
boolean per action of a ``Discrete`` space, one per sub-action of a ``MultiDiscrete``
space (its branches' masks concatenated, ``sum(nvec)`` in all). The sources
(``fastvec train --action-mask SOURCE``, ``PPOConfig.action_mask``):

- ``info``: ``info["action_mask"]`` of every reset and step (gymnasium's convention;
  Taxi-v3 gives it);
- ``method``: the env's ``action_masks()`` method, asked after every reset and step
  (sb3-contrib's convention; found through wrappers with ``get_wrapper_attr``);
- ``auto``: whichever of those the env gives, the method first (decided once, on one env
  built in the trainer's process before any worker starts);
- ``none``: no mask.

Every source takes one path: ``ActionMaskObservation``, a wrapper around each env in its
worker, hands the mask on beside the observation, as the observation ``(obs, mask)``
(``gymnasium.spaces.Tuple`` of the env's space and a ``MultiBinary`` of the mask's size).
The engine then carries it in its shared ring like any observation leaf, the trainer
reads it in place (``fastvec.train.storage.sources.EngineStorage.action_mask``), and no
info dict is pickled for it (the wrapper takes ``action_mask`` out of the info). A
further source (a key of a ``Dict`` observation) is one more branch of
``ActionMaskObservation._read``.

``check_action_mask`` is the check before any worker starts: one env built, reset and
its mask's source, shape, dtype and values checked (ValueError, one line).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = [
    "MASK_SOURCES",
    "ActionMaskObservation",
    "mask_branches",
    "masked_factory",
    "check_action_mask",
    "first_unactable",
    "check_actable",
    "split_masked_space",
]

MASK_SOURCES = ("none", "auto", "info", "method")


def mask_branches(action_space: spaces.Space) -> np.ndarray:
    """The sizes of an action space's mask branches: ``[n]`` for ``Discrete(n)``,
    ``nvec`` (flat) for ``MultiDiscrete``; ValueError for any other space."""
    if isinstance(action_space, spaces.Discrete):
        return np.array([int(action_space.n)], np.int64)
    if isinstance(action_space, spaces.MultiDiscrete):
        return np.asarray(action_space.nvec, np.int64).reshape(-1)
    raise ValueError(
        f"action masks need a Discrete or MultiDiscrete action space, not {type(action_space).__name__}"
        f" ({action_space})"
    )


def first_unactable(mask: np.ndarray, branches: np.ndarray) -> int | None:
    """The first row of ``mask`` (``[N, sum(branches)]`` bool) in which some branch allows
    no action, or None where every row allows one per branch."""
    if branches.size == 1:
        ok = mask.any(1)
    else:
        starts = np.concatenate([[0], np.cumsum(branches)[:-1]])
        ok = np.logical_or.reduceat(mask, starts, axis=1).all(1)
    if ok.all():
        return None
    return int(np.flatnonzero(~ok)[0])


def check_actable(mask: np.ndarray, branches: np.ndarray, first: int = 0, where: str = "") -> None:
    """ValueError naming the env (``first`` + its row) where a row of ``mask`` allows no
    action (in some branch); ``where``: said after it, e.g. the ring's slot."""
    bad = first_unactable(mask, branches)
    if bad is not None:
        raise ValueError(
            f"env {first + bad}'s action mask allows no action"
            + (" in some branch" if branches.size > 1 else "")
            + (f" ({where})" if where else "")
            + ": a masked env must leave at least one action valid"
        )


def split_masked_space(obs_space: spaces.Space, action_space: spaces.Space) -> tuple[spaces.Space, np.ndarray]:
    """An ``ActionMaskObservation``'s observation space ``(obs, mask)`` -> the env's own
    observation space and ``mask_branches(action_space)``; ValueError for another space."""
    if not (
        isinstance(obs_space, spaces.Tuple) and len(obs_space) == 2 and isinstance(obs_space[1], spaces.MultiBinary)
    ):
        raise ValueError(f"a masked env's observations are (obs, mask), not {obs_space}")
    return obs_space[0], mask_branches(action_space)


def _env_method(env: gym.Env) -> Callable | None:
    try:
        fn = env.get_wrapper_attr("action_masks")
    except AttributeError:
        return None
    return fn if callable(fn) else None


class ActionMaskObservation(gym.Wrapper):
    """An env whose observation is ``(obs, mask)``: the env's own observation and its
    action mask from ``source`` (``info`` or ``method``), as ``int8`` zeros and ones of
    ``sum(mask_branches(action_space))`` (a ``MultiBinary``). ``info["action_mask"]`` is
    taken out of the info. A mask of another size is a ValueError at the step it comes."""

    def __init__(self, env: gym.Env, source: str):
        super().__init__(env)
        if source not in ("info", "method"):
            raise ValueError(f"the action mask source must be info or method here, got {source!r}")
        self.source = source
        self.size = int(mask_branches(env.action_space).sum())
        self.observation_space = spaces.Tuple((env.observation_space, spaces.MultiBinary(self.size)))
        self._method = _env_method(env) if source == "method" else None
        if source == "method" and self._method is None:
            raise ValueError(f"{env} has no action_masks() method (action_mask=method)")

    def _read(self, info: dict) -> np.ndarray:
        if self.source == "info":
            if "action_mask" not in info:
                raise ValueError('the env gave no info["action_mask"] (action_mask=info)')
            mask = info.pop("action_mask")
        else:
            mask = self._method()  # type: ignore[misc]
        out = np.asarray(mask)
        if out.shape != (self.size,):
            raise ValueError(f"the env's action mask has shape {out.shape}, not ({self.size},)")
        return out.astype(np.int8, copy=False)

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        return (obs, self._read(info)), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return (obs, self._read(info)), reward, terminated, truncated, info


def _make_masked(fn: Callable[[], gym.Env], source: str) -> gym.Env:
    return ActionMaskObservation(fn(), source)


def masked_factory(fn: Callable[[], gym.Env], source: str) -> Callable[[], gym.Env]:
    """``fn`` (a picklable env factory) with ``ActionMaskObservation(..., source)`` around
    its env; ``fn`` itself for ``source="none"``."""
    if source == "none":
        return fn
    return functools.partial(_make_masked, fn, source)


def _source_of(env: gym.Env, info: dict, source: str) -> str:
    has_method, has_info = _env_method(env) is not None, "action_mask" in info
    if source == "auto":
        if not (has_method or has_info):
            raise ValueError(
                'action_mask=auto: the env gives no action mask (neither an action_masks() method nor info["action_mask"])'
            )
        return "method" if has_method else "info"
    if source == "method" and not has_method:
        raise ValueError("action_mask=method: the env has no action_masks() method")
    if source == "info" and not has_info:
        raise ValueError('action_mask=info: the env\'s reset gives no info["action_mask"]')
    return source


def _check_mask(mask: Any, branches: np.ndarray) -> None:
    arr = np.asarray(mask)
    size = int(branches.sum())
    if not (arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"the env's action mask must hold booleans (or 0/1 integers), not {arr.dtype}")
    if arr.shape != (size,):
        raise ValueError(
            f"the env's action mask has shape {arr.shape}, not ({size},) (one boolean per action"
            + (", the sub-actions' masks concatenated)" if branches.size > 1 else ")")
        )
    if arr.dtype != np.bool_ and not np.isin(arr, (0, 1)).all():
        raise ValueError(f"the env's action mask must hold 0 or 1, got {sorted(set(arr.tolist()))}")
    if first_unactable(arr.astype(bool)[None], branches) is not None:
        raise ValueError(
            "the env's first action mask allows no action" + (" in some branch" if branches.size > 1 else "")
        )


def check_action_mask(fn: Callable[[], gym.Env], source: str, seed: int | None = None) -> str:
    """The mask source ``fn``'s envs give, checked on one env built and reset here
    (``source`` ``auto`` settled to ``info`` or ``method``; ``none`` as it is): ValueError,
    one line, where the action space takes no mask, the env does not give the source, or
    the first reset's mask has the wrong shape, dtype or values."""
    if source not in MASK_SOURCES:
        raise ValueError(f"action_mask must be one of {', '.join(MASK_SOURCES)}, got {source!r}")
    if source == "none":
        return source
    env = fn()
    try:
        branches = mask_branches(env.action_space)
        _obs, info = env.reset(seed=seed)
        source = _source_of(env, info, source)
        _check_mask(info["action_mask"] if source == "info" else _env_method(env)(), branches)  # type: ignore[misc]
    finally:
        env.close()
    return source
