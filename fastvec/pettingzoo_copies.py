"""PettingZoo ``ParallelEnv`` copies as engine envs: one copy, one gymnasium env.

A copy with M agents runs in a worker as one ``ParallelCopy``, a gymnasium env whose
observation is a ``Dict`` of stacked per-agent arrays: ``obs`` ``(M, *agent shape)``,
``reward`` ``(M,)``, ``terminated``, ``truncated`` and ``active`` ``(M,)``. The engine
lays each of those out as an array ``[slots, copies, M, ...]`` in shared memory, so the
doors (``fastvec.doors.gymnasium_agents``, ``fastvec.doors.sb3_agents``) hand out N x M rows as reshaped views with no engine
change. Its actions are stacked the same way, ``(M, *agent shape)``.

Rows follow ``possible_agents`` in every copy. An agent that leaves ``env.agents``
(PettingZoo's terminated or truncated) reports its flag on that step; from the next
step its row is inactive (zeros, reward 0) until the copy resets, which the door's
autoreset does once no agent is left.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

__all__ = ["AgentSpec", "ParallelCopy", "AgentRows", "RowNames", "inspect_env_fns", "copy_fns"]

_LEAVES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def _parallel_env_class():
    try:
        from pettingzoo.utils.env import AECEnv, ParallelEnv
    except ImportError:
        raise ImportError("fastvec's multi-agent doors need PettingZoo: pip install pettingzoo") from None
    return ParallelEnv, AECEnv


@dataclass(frozen=True)
class AgentSpec:
    """What every copy must share: the agents in row order and one agent's spaces."""

    agents: tuple
    observation_space: spaces.Space
    action_space: spaces.Space

    @property
    def num_agents(self) -> int:
        return len(self.agents)


def _same_space(env, agents: tuple, which: str) -> spaces.Space:
    """The one space every agent has (``which``: observation or action), else ValueError."""
    get = getattr(env, f"{which}_space")
    first = get(agents[0])
    for agent in agents[1:]:
        space = get(agent)
        if space != first:
            raise ValueError(
                f"the agents' {which} spaces differ ({agents[0]!r}: {first}, {agent!r}: {space}); "
                "one policy over every agent's row needs one space (pad them to one first)"
            )
    if not isinstance(first, _LEAVES):
        raise ValueError(
            f"the agents' {which} space is {type(first).__name__}; fastvec's multi-agent doors take "
            "Box, Discrete, MultiDiscrete or MultiBinary per agent"
        )
    return first


def check_parallel_env(env) -> AgentSpec:
    """The spec of a PettingZoo ParallelEnv, or ValueError saying what is wrong with it."""
    parallel, aec = _parallel_env_class()
    if isinstance(env, aec):
        raise ValueError(
            f"{type(env).__name__} is a PettingZoo AECEnv (agents act in turn); wrap it with "
            "pettingzoo.utils.conversions.aec_to_parallel (or use the env's parallel_env())"
        )
    if not isinstance(env, parallel):
        raise ValueError(f"env_fns must return PettingZoo ParallelEnvs, got {type(env).__name__}")
    agents = tuple(getattr(env, "possible_agents", None) or ())
    if not agents:
        raise ValueError(f"{type(env).__name__} has no possible_agents")
    if len(set(agents)) != len(agents):
        raise ValueError(f"possible_agents has duplicates: {list(agents)}")
    return AgentSpec(agents, _same_space(env, agents, "observation"), _same_space(env, agents, "action"))


def inspect_env_fns(env_fns: Sequence[Callable]) -> AgentSpec:
    """Check ``env_fns`` and build copy 0 here, in the caller's process, to read its
    agents and spaces before any worker starts (closed again at once)."""
    if isinstance(env_fns, (str, bytes)) or not isinstance(env_fns, Sequence) or not env_fns:
        raise ValueError(f"env_fns must be a non-empty sequence of callables, got {env_fns!r}")
    for i, fn in enumerate(env_fns):
        if not callable(fn):
            raise ValueError(f"env_fns[{i}] is not callable (pass a function returning a ParallelEnv): {fn!r}")
    env = env_fns[0]()
    try:
        return check_parallel_env(env)
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()


class ParallelCopy(gymnasium.Env):
    """One ParallelEnv copy as a gymnasium env over stacked per-agent arrays (built in a
    worker; ``spec`` is what the parent read from copy 0, checked again here)."""

    def __init__(self, env_fn: Callable, spec: AgentSpec):
        self.env = env_fn()
        own = check_parallel_env(self.env)
        if own != spec:
            raise ValueError(f"every copy needs the same agents and spaces: {own} differs from copy 0's {spec}")
        m = spec.num_agents
        self.agents, self.index = spec.agents, {a: j for j, a in enumerate(spec.agents)}
        self._discrete = isinstance(spec.action_space, spaces.Discrete)
        obs = batch_space(spec.observation_space, m)
        self._obs_shape: tuple[int, ...] = tuple(obs.shape or ())
        self._obs_dtype = np.dtype(obs.dtype)
        flag = spaces.Box(0, 1, (m,), np.bool_)  # type: ignore[arg-type]  # its stubs name float dtypes only
        reward = spaces.Box(-np.inf, np.inf, (m,), np.float64)
        self.observation_space = spaces.Dict(
            {"obs": obs, "reward": reward, "terminated": flag, "truncated": flag, "active": flag}
        )
        self.action_space = batch_space(spec.action_space, m)
        self.metadata = dict(getattr(self.env, "metadata", None) or {})
        self.render_mode = getattr(self.env, "render_mode", None)
        self._alive: list = []

    def _check_known(self, keys, what: str) -> None:
        for agent in keys:
            if agent not in self.index:
                raise ValueError(f"{what} names agent {agent!r}, which is not in possible_agents {list(self.agents)}")

    def _pack(self, obs: dict, rewards: dict, terms: dict, truncs: dict, acted: list) -> dict[str, Any]:
        """The stacked arrays: the agents that acted (or were reset) fill their rows;
        every other row stays zero."""
        m = len(self.agents)
        out = np.zeros(self._obs_shape, self._obs_dtype)
        reward = np.zeros(m, np.float64)
        terminated = np.zeros(m, np.bool_)
        truncated = np.zeros(m, np.bool_)
        for agent in acted:
            j = self.index[agent]
            if agent in obs:
                out[j] = obs[agent]
            reward[j] = rewards.get(agent, 0.0)
            terminated[j] = terms.get(agent, False)
            truncated[j] = truncs.get(agent, False)
        active = np.zeros(m, np.bool_)
        active[[self.index[a] for a in self._alive]] = True
        return {"obs": out, "reward": reward, "terminated": terminated, "truncated": truncated, "active": active}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, _infos = self.env.reset(seed=seed, options=options)
        self._check_known(self.env.agents, "reset's env.agents")
        self._alive = list(self.env.agents)
        return self._pack(obs, {}, {}, {}, self._alive), {}

    def step(self, action):
        acted = self._alive
        if self._discrete:  # PettingZoo's Discrete envs take plain ints
            acts = {a: int(action[self.index[a]]) for a in acted}
        else:
            acts = {a: action[self.index[a]] for a in acted}
        obs, rewards, terms, truncs, _infos = self.env.step(acts)
        now = list(self.env.agents)
        self._check_known(now, "env.agents")
        before = set(acted)
        for agent in now:
            if agent not in before:  # a row cannot come back to life before its copy resets
                raise ValueError(
                    f"agent {agent!r} appeared mid-episode (not alive after the last reset or step); "
                    "fastvec's multi-agent doors need every agent present from the reset on"
                )
        self._alive = now
        packed = self._pack(obs, rewards, terms, truncs, acted)
        ended = not now  # the copy is over once no agent is left
        terminated = ended and bool(packed["terminated"].any())
        return packed, float(packed["reward"].sum()), terminated, ended and not terminated, {}

    def render(self):
        return self.env.render()

    def close(self):
        self.env.close()


class AgentRows:
    """N copies' stacked arrays as N x M rows: copy ``c``'s agent ``j`` is row ``c * M + j``."""

    def __init__(self, spec: AgentSpec, num_copies: int):
        m = spec.num_agents
        self.spec, self.num_copies, self.num_agents = spec, num_copies, m
        self.num_rows = num_copies * m
        self.row_agents = spec.agents * num_copies
        self.row_copy = np.repeat(np.arange(num_copies), m)
        self.row_agent_index = np.tile(np.arange(m), num_copies)
        self.active = np.zeros(self.num_rows, np.bool_)

    def rows(self, array: np.ndarray) -> np.ndarray:
        """``[N, M, ...]`` as ``[N * M, ...]`` (a view of a contiguous array)."""
        return array.reshape((self.num_rows,) + array.shape[2:])

    def copy_actions(self, actions, space: spaces.Space) -> np.ndarray:
        """A batch of row actions ``[N * M, ...]`` as the copies' ``[N, M, ...]``."""
        array = np.asarray(actions)
        want = (self.num_rows,) + tuple(space.shape or ())
        if array.shape != want:
            raise ValueError(f"actions must have shape {want} (one row per agent of every copy), got {array.shape}")
        return array.reshape((self.num_copies, self.num_agents) + array.shape[1:])

    def split(self, obs: dict, copy: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(observations, rewards, terminated, truncated) of every row from the copies'
        stacked arrays; updates ``active``. Flags and rewards are fresh arrays."""
        rows = self.rows(obs["obs"])
        self.active = self.rows(obs["active"]).copy()
        return (
            rows.copy() if copy else rows,
            self.rows(obs["reward"]).copy(),
            self.rows(obs["terminated"]).copy(),
            self.rows(obs["truncated"]).copy(),
        )

    def put_final(self, c: int, final: dict[str, Any], rewards, terminated, truncated) -> slice:
        """Copy ``c`` ended and was reset in the same step: its rewards and flags are in
        its final observation; returns its rows."""
        rows = slice(c * self.num_agents, (c + 1) * self.num_agents)
        rewards[rows] = final["reward"]
        terminated[rows] = final["terminated"]
        truncated[rows] = final["truncated"]
        return rows


def copy_fns(env_fns: Sequence[Callable]) -> tuple[AgentSpec, list[Callable]]:
    """The spec read from copy 0 (every check before a worker starts) and the engine's env
    functions, one ``ParallelCopy`` each."""
    spec = inspect_env_fns(env_fns)
    return spec, [functools.partial(ParallelCopy, fn, spec) for fn in env_fns]


class RowNames:
    """What both doors name about their rows (``AgentRows`` underneath)."""

    _rows: AgentRows
    close: Callable[..., None]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> Literal[False]:
        self.close()
        return False

    @property
    def possible_agents(self) -> tuple:
        return self._rows.spec.agents

    @property
    def num_copies(self) -> int:
        return self._rows.num_copies

    @property
    def num_agents(self) -> int:
        return self._rows.num_agents

    @property
    def row_agents(self) -> tuple:
        """The agent of each row: ``possible_agents`` repeated for every copy."""
        return self._rows.row_agents

    @property
    def row_copy(self) -> np.ndarray:
        """The copy each row belongs to."""
        return self._rows.row_copy

    @property
    def active(self) -> np.ndarray:
        """Per row, whether its agent is in its copy's ``env.agents`` after the last
        step or reset (the rows whose next action counts); a copy of the mask."""
        return self._rows.active.copy()
