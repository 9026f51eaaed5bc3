"""The gymnasium multi-agent door: ``AgentVectorEnv``, N copies of a PettingZoo
``ParallelEnv`` with M agents as a ``gymnasium.vector.VectorEnv`` of N x M rows, one per
agent, over ``fastvec.AsyncVectorEnv`` (``fastvec.pettingzoo_copies`` holds the per-copy env and
the rows; ``fastvec.doors.sb3_agents`` is the SB3 door).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from ..pettingzoo_copies import AgentRows, RowNames, copy_fns
from .gymnasium import AsyncVectorEnv

__all__ = ["AgentVectorEnv"]

# The modes a copy can reset by, as gymnasium's values or fastvec's names.
_MODES = {
    name: mode
    for mode in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP)
    for name in (mode.value, mode.name.lower())
}


class AgentVectorEnv(RowNames, VectorEnv):
    """N copies of a PettingZoo ``ParallelEnv`` with M agents as a gymnasium vector env
    of ``num_envs = N * M`` rows, copy ``c``'s agent ``j`` (``possible_agents[j]``) at row
    ``c * M + j``.

    Parameters
    ----------
    env_fns : sequence of callables
        One function per copy, each returning a ``ParallelEnv`` whose agents share one
        observation and one action space (Box, Discrete, MultiDiscrete or MultiBinary).
        Copy 0 is built once in this process first, to check it.
    copy : bool, default True
        False: the observations are views of the shared ring (see ``AsyncVectorEnv``).
    autoreset_mode : "next_step" (default) or "same_step"
        When a copy has no agent left it is reset, as ``AsyncVectorEnv`` resets an env:
        on the next step (its rows then report the reset: reward 0, no flags), or in the
        same step, its rows' final observations in ``infos["final_obs"]``.
    num_workers, context, step_timeout, num_slots, spin_us, main_spin_us, torch_threads, placement, env_costs
        As ``fastvec.AsyncVectorEnv``'s, for the copies.

    Notes
    -----
    An agent that leaves ``env.agents`` reports ``terminated``/``truncated`` and its last
    observation on that step; from then until its copy resets its row is inactive
    (``active`` False, observation zeros, reward 0) and its actions are ignored. An agent
    that appears mid-episode raises ``fastvec.WorkerError``. PettingZoo's per-agent infos
    are not carried.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable],
        *,
        copy: bool = True,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        num_workers: int | str | None = None,
        context: str | None = None,
        step_timeout: float | None = None,
        num_slots: int = 2,
        spin_us: float | None = None,
        main_spin_us: float | None = None,
        torch_threads: int | str | None = "auto",
        placement: str | Sequence[Sequence[int]] = "contiguous",
        env_costs: Sequence[float] | None = None,
    ):
        self.closed = True
        mode = _MODES.get(getattr(autoreset_mode, "value", autoreset_mode))
        if mode is None or isinstance(autoreset_mode, bool):
            raise ValueError(f"autoreset_mode must be 'next_step' or 'same_step', got {autoreset_mode!r}")
        spec, fns = copy_fns(env_fns)
        self._rows = AgentRows(spec, len(fns))
        self.copy = bool(copy)
        self.autoreset_mode = mode
        self.copies = AsyncVectorEnv(
            fns,
            copy=False,
            context=context,
            autoreset_mode=mode,
            num_workers=num_workers,
            step_timeout=step_timeout,
            num_slots=num_slots,
            spin_us=spin_us,
            main_spin_us=main_spin_us,
            torch_threads=torch_threads,
            placement=placement,
            env_costs=env_costs,
        )
        self.num_envs = self._rows.num_rows
        self.single_observation_space = spec.observation_space
        self.single_action_space = spec.action_space
        self.observation_space = batch_space(spec.observation_space, self.num_envs)
        self.action_space = batch_space(spec.action_space, self.num_envs)
        self.metadata = dict(self.copies.metadata)
        self.render_mode = self.copies.render_mode
        self.closed = False

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        """Reset every copy (``seed``: an int, copy ``c`` getting ``seed + c``, or one per
        copy); returns the rows' observations and ``{}``."""
        if isinstance(seed, (list, tuple)) and len(seed) != self.num_copies:
            raise ValueError(f"seed as a list needs one seed per copy ({self.num_copies}), got {len(seed)}")
        obs, _infos = self.copies.reset(seed=seed, options=options)
        return self._rows.split(obs, self.copy)[0], {}

    def step(self, actions):
        """One step of every copy on the rows' ``actions`` (``[N * M, ...]``; inactive
        rows' actions are ignored): ``(obs, rewards, terminated, truncated, infos)``."""
        batch = self._rows.copy_actions(actions, self.single_action_space)
        obs, _r, ended_term, ended_trunc, infos = self.copies.step(batch)
        observations, rewards, terminated, truncated = self._rows.split(obs, self.copy)
        out: dict[str, Any] = {}
        if self.autoreset_mode == AutoresetMode.SAME_STEP and (ended := ended_term | ended_trunc).any():
            out = self._finals(np.flatnonzero(ended), infos["final_obs"], rewards, terminated, truncated)
        return observations, rewards, terminated, truncated, out

    def _finals(self, ended, finals, rewards, terminated, truncated) -> dict[str, Any]:
        """same_step: the ended copies' rewards and flags from their final observations;
        ``final_obs`` per row (gymnasium's object array) for the rows that ended."""
        final_obs = np.full(self.num_envs, None, dtype=object)
        for c in ended.tolist():
            rows = self._rows.put_final(c, finals[c], rewards, terminated, truncated)
            for j, row in enumerate(range(rows.start, rows.stop)):
                if terminated[row] or truncated[row]:
                    final_obs[row] = finals[c]["obs"][j].copy()
        mask = np.array([o is not None for o in final_obs], dtype=np.bool_)
        return {"final_obs": final_obs, "_final_obs": mask}

    def close_extras(self, **kwargs: Any) -> None:
        if hasattr(self, "copies"):
            self.copies.close()

    def __del__(self):
        pass  # the copies' engine has its own finalizer

    def __repr__(self) -> str:
        return f"fastvec.AgentVectorEnv(num_copies={self.num_copies}, num_agents={self.num_agents})"
