"""Rollout storage over PettingZoo copies: N copies of a ``ParallelEnv`` with M agents
trained as N x M rows by one shared policy, zero copy.

Each copy is one engine env (``fastvec.pettingzoo_copies.ParallelCopy``) whose observation is a
``Dict`` of stacked per-agent arrays, so every field has its own array ``[slots, N, M,
...]`` in the engine's ring; the storage's ``obs``, ``act``, ``rewards``,
``terminated``, ``truncated`` and ``active`` are those arrays seen as ``[slots, N * M,
...]`` (copy c's agent j at row ``c * M + j``, as in the doors).

What a step leaves in the ring needs two corrections, made in place after each step:

- a copy that ended (no agent left) was reset in the same step, so its slot holds the
  reset's rows (reward 0, no flags); the step's own rewards and flags are in its final
  observation, and are copied back into the rows;
- an agent that left while its copy goes on reports its last observation in the slot
  itself; it is also its final observation (the bootstrap of a truncation).

A copy whose worker was replaced (``restart_on_error``) ends truncated with the
observation of the step before: its agents that were acting end truncated there too.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from ...pettingzoo_copies import AgentRows, AgentSpec
from .sources import EngineStorage

__all__ = ["AgentStorage"]


class AgentStorage(EngineStorage):
    """``EngineStorage`` whose rows are agents: an engine over ``ParallelCopy`` envs
    (``fastvec.pettingzoo_copies.copy_fns``), ``spec`` the agents and spaces read from copy 0.
    ``active[t, r]``: row r's agent acts on slot t's observation; rows that do not are
    zeros, and ``fastvec.train`` leaves them out of its losses and statistics. ``reset``
    takes one seed per copy (``num_seeds``): a copy's agents share their env's."""

    def __init__(self, engine, spec: AgentSpec):
        self.spec = spec
        self.agent_rows = AgentRows(spec, engine.num_envs)
        super().__init__(engine)

    def _check_spaces(self, eng) -> None:
        if isinstance(self.spec.observation_space, spaces.Dict | spaces.Tuple):
            raise ValueError(
                "agent rows do not carry Dict/Tuple observations yet: flatten each agent's observation "
                "(supersuit.flatten_v0, or gymnasium.spaces.flatten in the env)"
            )
        keys = set(getattr(eng.single_observation_space, "spaces", {}))
        if keys != {"obs", "reward", "terminated", "truncated", "active"}:
            raise ValueError(
                f"AgentStorage needs ParallelCopy envs (fastvec.pettingzoo_copies), not {eng.single_observation_space}"
            )

    def _views(self, eng) -> None:
        self.agent_leaves = list(eng.single_observation_space.spaces)  # the engine's leaves, in the Dict's order
        self.num_envs = self.agent_rows.num_rows
        self.num_seeds = self.agent_rows.num_copies  # reset seeds the copies, one each
        self.single_observation_space = self.spec.observation_space
        self.single_action_space = self.spec.action_space
        v = agent_views(self.agent_leaves, eng.obs_bufs, eng.final_bufs, eng.act_bufs[0], self.num_envs)
        self.obs, self.final_obs, self.act, self.rewards = v["obs"], v["final_obs"], v["act"], v["rewards"]
        self.terminated, self.truncated, self.active = v["terminated"], v["truncated"], v["active"]
        final = dict(zip(self.agent_leaves, eng.final_bufs))
        self._final = {k: _rows(final[k], self.num_envs) for k in ("reward", "terminated", "truncated", "active")}
        self._copy_term, self._copy_trunc = eng.terminated, eng.truncated

    def arrays(self) -> list[np.ndarray]:
        return [self.obs, self.final_obs, self.act, self.rewards, self.terminated, self.truncated, self.active]

    def step(self, slot: int) -> None:
        seen = len(self.engine.restarts)
        super().step(slot)
        self._settle(slot, seen)

    def _settle(self, slot: int, restarts_seen: int) -> None:
        """The corrections of the module's docstring, for the step into ``slot``
        (``restarts_seen``: the engine's restart records before it)."""
        m = self.agent_rows.num_agents
        ended_copies = self._copy_term[slot] | self._copy_trunc[slot]
        left = self.terminated[slot] | self.truncated[slot]  # the rows of copies that go on
        if ended_copies.any():
            lost_copies = np.zeros_like(ended_copies)
            for record in self.engine.restarts[restarts_seen:]:
                lost_copies[record["envs"]] = True
            ended, lost = np.repeat(ended_copies, m), np.repeat(lost_copies, m)
            final = self._final
            np.copyto(self.rewards[slot], final["reward"][slot], where=ended & ~lost)
            np.copyto(self.terminated[slot], final["terminated"][slot], where=ended & ~lost)
            np.copyto(self.truncated[slot], final["truncated"][slot], where=ended & ~lost)
            if lost.any():  # the agents acting at the step before end there, truncated
                self.rewards[slot, lost] = 0.0
                self.terminated[slot, lost] = False
                self.truncated[slot, lost] = final["active"][slot, lost]
            left &= ~ended
        if left.any():
            self.final_obs[slot, left] = self.obs[slot, left]


def agent_views(leaves: list[str], obs_bufs, final_bufs, act_buf, num_rows: int) -> dict:
    """The trainer's arrays over a ring of ``ParallelCopy`` envs (``leaves``: the names
    of its observation leaves, in order): ``obs``, ``final_obs``, ``act``, ``rewards``,
    ``terminated``, ``truncated`` and ``active`` as ``[S, num_rows, ...]`` views. The
    storage's, and the async learner's over the ring it maps."""
    leaf, final = dict(zip(leaves, obs_bufs)), dict(zip(leaves, final_bufs))
    out = {"obs": leaf["obs"], "final_obs": final["obs"], "act": act_buf, "rewards": leaf["reward"]}
    out.update({k: leaf[k] for k in ("terminated", "truncated", "active")})
    return {k: _rows(a, num_rows) for k, a in out.items()}


def _rows(array: np.ndarray, num_rows: int) -> np.ndarray:
    """A ring array ``[S, N, M, ...]`` as ``[S, N * M, ...]``: a view, never a copy."""
    view = array.reshape((array.shape[0], num_rows) + array.shape[3:])
    if not np.shares_memory(view, array):  # (the ring's arrays are contiguous: cannot happen)
        raise RuntimeError("an agent view of the ring would be a copy")
    return view


def check_agent_run(cfg, *, venv=None, mix=None, backend: str = "engine", world: int = 1) -> None:
    """ValueError (before any process starts) where a run on a PettingZoo env cannot do
    what ``cfg`` asks (what is not built for agent rows yet, named)."""
    if venv is not None or mix is not None or backend != "engine":
        other = (
            "a vector env of your own" if venv is not None else "a mix" if mix is not None else f"backend={backend!r}"
        )
        raise ValueError(f"a PettingZoo env trains on fastvec's engine on this machine, not with {other}")
    unsupported = [
        (cfg.env_groups != 1, f"env_groups={cfg.env_groups}"),
        (world != 1, f"{world} ranks"),
    ]
    for asked, what in unsupported:
        if asked:
            raise ValueError(f"{what} is not built for PettingZoo envs yet (their agent rows train on one rank)")
