"""Member rows: one member's envs of a population's storage, as a storage of its own.

A population (``fastvec.train.algo.population``) trains K members on one engine: its
``K * N`` envs, member k's the rows ``k N .. (k + 1) N - 1`` of every ring array.
``MemberRows`` is the ``RolloutStorage`` protocol over those rows (numpy views, no copy:
a step's observation rows of one member are contiguous in the ring; for a Dict/Tuple
observation, ``Leaves`` of each leaf's rows, and the action mask's rows apart), so each
member's ``PPO`` acts into them and learns from them as a run alone does from its engine.

The engine is stepped and reset for all members at once, by the population: ``step``
is not a member's to call, and ``reset`` records the member's seeds until every member
has given its own (``MemberEnvs.reset_all``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .sources import seeds_for

__all__ = ["MemberEnvs", "MemberRows"]


class MemberRows:
    """Member ``k``'s rows of ``envs.storage`` (``MemberEnvs``)."""

    active: np.ndarray | None = None  # every env acts at every step (agent rows are refused)

    def __init__(self, envs: MemberEnvs, k: int):
        base, n = envs.storage, envs.per_member
        self.envs, self.k = envs, k
        rows = slice(k * n, (k + 1) * n)
        # (Leaves: every leaf's rows, views of its ring array)
        self.obs, self.final_obs, self.act = base.obs[:, rows], base.final_obs[:, rows], base.act[:, rows]
        self.rewards, self.terminated, self.truncated = (
            base.rewards[:, rows],
            base.terminated[:, rows],
            base.truncated[:, rows],
        )
        mask = getattr(base, "action_mask", None)  # (a masked run's: the actions each env allows)
        self.action_mask = None if mask is None else mask[:, rows]
        self.kind, self.num_workers = base.kind, base.num_workers
        self.num_envs = self.num_seeds = n
        self.single_observation_space = base.single_observation_space
        self.single_action_space = base.single_action_space
        self.groups = [(0, n)]
        self.on_restart: Callable[[], None] | None = None

    @property
    def restarts(self) -> list[dict]:
        return self.envs.storage.restarts

    @property
    def worker_pids(self) -> list[int]:
        return self.envs.storage.worker_pids

    def arrays(self) -> list[np.ndarray]:
        return []  # views: the population's storage pins its own arrays

    def reset(self, seed: int | Sequence[int] | None) -> None:
        """Member k's seeds for the next reset of every member's envs (``reset_all``)."""
        self.envs.seeds[self.k] = seeds_for(seed, self.num_envs)

    def step(self, slot: int) -> None:
        raise RuntimeError("a member's envs step with the population's (MemberEnvs.step)")

    send = recv = step

    def lost_wakeups(self) -> int | None:
        return self.envs.storage.lost_wakeups()

    def transport(self) -> dict:
        return self.envs.storage.transport()

    def close(self) -> None:
        pass  # the population closes its storage once every member is done


class MemberEnvs:
    """A storage of ``K * per_member`` envs split into K members' rows (``rows[k]``).
    ``reset_all`` resets every env with the seeds each member gave its rows; ``step``
    steps them all; ``close`` closes the storage."""

    def __init__(self, storage, members: int):
        if members < 1 or storage.num_envs % members:
            raise ValueError(f"{storage.num_envs} envs do not split into {members} members")
        self.storage, self.per_member = storage, storage.num_envs // members
        self.seeds: list[list[int] | None] = [None] * members
        self.rows = [MemberRows(self, k) for k in range(members)]
        storage.on_restart = self._restarted

    def _restarted(self) -> None:
        for rows in self.rows:
            if rows.on_restart is not None:
                rows.on_restart()

    def reset_all(self) -> None:
        """Reset every env: member k's with the seeds ``rows[k].reset`` gave (a member
        that gave none is reset unseeded); the seeds are used up."""
        if all(s is None for s in self.seeds):
            self.storage.reset(None)
        else:
            n = self.per_member
            flat = [s[i] if s is not None else None for s in self.seeds for i in range(n)]
            if any(x is None for x in flat):
                raise ValueError("every member gives its envs' seeds, or none does")
            self.storage.reset(flat)
        self.seeds = [None] * len(self.rows)

    def step(self, slot: int) -> None:
        self.storage.step(slot)

    def pause(self, k: int) -> None:
        """Member k's envs are no longer stepped (it has finished): where the engine can
        leave them (``Engine.pause``), they cost no worker a step; else they step on."""
        pause = getattr(self.storage, "pause", None)
        if pause is not None:
            pause(k * self.per_member, (k + 1) * self.per_member)

    def close(self) -> None:
        self.storage.close()
