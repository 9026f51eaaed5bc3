"""The SB3 multi-agent door: ``AgentVecEnv``, N copies of a PettingZoo ``ParallelEnv``
with M agents as Stable-Baselines3's ``VecEnv`` of N x M rows over
``fastvec.SubprocVecEnv``: what SuperSuit's ``pettingzoo_env_to_vec_env_v1`` +
``concat_vec_envs_v1`` give SB3 users, its PPO sharing one policy over every row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..pettingzoo_copies import AgentRows, RowNames, copy_fns
from .sb3 import SubprocVecEnv

if TYPE_CHECKING:
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv as _Base
else:
    try:  # SB3 is optional, as for fastvec.SubprocVecEnv
        from stable_baselines3.common.vec_env.base_vec_env import VecEnv as _Base
    except ImportError:  # pragma: no cover - exercised in environments without SB3
        _Base = object

__all__ = ["AgentVecEnv"]


class AgentVecEnv(RowNames, _Base):
    """N copies of a PettingZoo ``ParallelEnv`` with M agents as an SB3 ``VecEnv`` of
    ``num_envs = N * M`` rows (copy ``c``'s agent ``j`` at row ``c * M + j``), for SB3's
    algorithms with one policy shared by every agent.

    Parameters
    ----------
    env_fns : sequence of callables
        One function per copy, each returning a ``ParallelEnv`` (as ``AgentVectorEnv``'s).
    copy : bool, default True
        False: the observations are read-only views of the shared ring, valid through the
        next step (see ``fastvec.SubprocVecEnv``).
    start_method, num_workers, num_slots, step_timeout, spin_us, main_spin_us, torch_threads, placement, env_costs
        As ``fastvec.SubprocVecEnv``'s, for the copies.

    Notes
    -----
    A row is ``done`` on the step its agent leaves ``env.agents``, with its last
    observation in ``infos[row]["terminal_observation"]``; then, until its copy resets
    (once no agent is left, in the same step), its row carries zeros and reward 0 and its
    actions are ignored (``active`` says which rows are live).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable],
        start_method: str | None = None,
        *,
        copy: bool = True,
        num_workers: int | str | None = None,
        num_slots: int = 2,
        step_timeout: float | None = None,
        spin_us: float | None = None,
        main_spin_us: float | None = None,
        torch_threads: int | str | None = "auto",
        placement: str | Sequence[Sequence[int]] = "contiguous",
        env_costs: Sequence[float] | None = None,
    ):
        self.closed = True
        spec, fns = copy_fns(env_fns)
        self._rows = AgentRows(spec, len(fns))
        self.copy = bool(copy)
        self.copies = SubprocVecEnv(
            fns,
            start_method,
            copy=False,
            num_workers=num_workers,
            num_slots=num_slots,
            step_timeout=step_timeout,
            spin_us=spin_us,
            main_spin_us=main_spin_us,
            torch_threads=torch_threads,
            placement=placement,
            env_costs=env_costs,
        )
        self.num_envs = self._rows.num_rows
        self.observation_space = spec.observation_space
        self.action_space = spec.action_space
        self.reset_infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self.render_mode = self.copies.render_mode
        self.metadata = dict(self.copies.metadata)
        self._actions: Any = None
        self.closed = False

    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        """Seeds for the next ``reset``: copy ``c`` gets ``seed + c``."""
        return self.copies.seed(seed)

    def set_options(self, options: list[dict] | dict | None = None) -> None:
        """Reset options for the next ``reset``: one dict for every copy, or one per copy."""
        self.copies.set_options(options)

    def reset(self):
        obs = self.copies.reset()
        return self._rows.split(obs, self.copy)[0]

    def step_async(self, actions) -> None:
        self._actions = self._rows.copy_actions(actions, self.action_space)

    def step_wait(self):
        if self._actions is None:
            raise RuntimeError("step_wait() without step_async()")
        batch, self._actions = self._actions, None
        obs, _r, ended, copy_infos = self.copies.step(batch)
        observations, rewards, terminated, truncated = self._rows.split(obs, self.copy)
        finals: dict[int, Any] = {}
        for c in np.flatnonzero(ended).tolist():
            finals[c] = copy_infos[c]["terminal_observation"]
            self._rows.put_final(c, finals[c], rewards, terminated, truncated)
        dones = terminated | truncated
        infos: list[dict[str, Any]] = [{"TimeLimit.truncated": t} for t in (truncated & ~terminated).tolist()]
        m = self.num_agents
        for row in np.flatnonzero(dones).tolist():
            c, j = divmod(row, m)
            last = finals[c]["obs"][j] if c in finals else observations[row]
            infos[row]["terminal_observation"] = np.array(last)
        return observations, rewards.astype(np.float32), dones, infos

    # SB3's attribute access, per row: each row answers with its copy's value.
    def _copy_indices(self, indices) -> tuple[list[int], list[int]]:
        rows = range(self.num_envs) if indices is None else np.arange(self.num_envs)[indices].ravel().tolist()
        copies = [int(self._rows.row_copy[r]) for r in rows]
        return copies, sorted(set(copies))

    def _per_row(self, method: Callable, indices, *args, **kwargs) -> list[Any]:
        copies, unique = self._copy_indices(indices)
        values = dict(zip(unique, method(*args, indices=unique, **kwargs)))
        return [values[c] for c in copies]

    def get_attr(self, attr_name: str, indices=None) -> list[Any]:
        return self._per_row(self.copies.get_attr, indices, attr_name)

    def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
        self.copies.set_attr(attr_name, value, indices=self._copy_indices(indices)[1])

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list[Any]:
        return self._per_row(self.copies.env_method, indices, method_name, *method_args, **method_kwargs)

    def env_is_wrapped(self, wrapper_class: type, indices=None) -> list[bool]:
        return self._per_row(self.copies.env_is_wrapped, indices, wrapper_class)

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [None] * self.num_envs

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.copies.close()

    def __repr__(self) -> str:
        return f"fastvec.AgentVecEnv(num_copies={self.num_copies}, num_agents={self.num_agents})"
