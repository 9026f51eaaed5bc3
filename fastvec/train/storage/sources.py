"""Rollout storage: where the trainer's rollouts live, one protocol for every source.

``RolloutStorage`` declares everything the loop and ``PPO`` use of a storage: the spaces,
``num_envs``, the ``[T + 1, N, ...]`` arrays ``obs``, ``final_obs``, ``act``, ``rewards``,
``terminated`` and ``truncated``; ``reset(seeds)`` writes the first observations into slot
0 (one seed per env, or an int: env i gets ``seed + i``), ``step(t)`` steps every env on the actions in ``act[t]`` and writes step t's results
into slot ``t`` (``final_obs`` where an episode ended), ``send``/``recv`` do the same per
batch group, ``arrays()`` lists what to page-lock for CUDA, and ``close()``. ``active``
and ``action_mask``: which rows act, which actions each env allows (None: all of them).

- ``EngineStorage``: the engine's own shared memory, zero copy (``RayEngineStorage``: a
  ``fastvec.ray.RayEngine``'s, whose workers are on other nodes);
- ``fastvec.train.storage.vector_copies``: own arrays of the same layout, filled from a
  vector env the caller owns (how the benchmarks compare the transports).

``HostPin`` (page-locking for asynchronous copies to a GPU) lives in ``fastvec.train.compute.pinned``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from gymnasium.spaces import Dict, Tuple

from ..._core.base import IN_SLOT
from ...action_masks import check_actable, split_masked_space
from ..compute.pinned import HostPin
from ..config.seeding import seeds_for
from ..model.observations import Leaves, input_leaves, leaf_arrays

__all__ = [
    "RolloutStorage",
    "EngineStorage",
    "RayEngineStorage",
    "single_leaf",
    "HostPin",
]


@runtime_checkable
class RolloutStorage(Protocol):
    """What ``fastvec.train.loop.train`` and ``fastvec.train.algo.ppo.PPO`` use of a storage."""

    kind: str
    """The backend's name in the result (``backend``): fastvec, fastvec-ray, gymnasium, subproc."""
    num_envs: int
    num_seeds: int
    """How many seeds ``reset`` takes: one per env it resets (``num_envs``; an agent
    storage's copies). A storage without it takes ``num_envs``."""
    num_workers: int | None
    """Worker processes stepping the envs (None: unknown); acting leaves their cores free."""
    single_observation_space: Any
    single_action_space: Any
    obs: Any
    """``[T + 1, N, *obs_shape]``; for a Dict/Tuple space ``Leaves`` of such arrays, one per
    leaf (``fastvec.train.model.observations``)."""
    final_obs: Any
    act: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    on_restart: Callable[[], None] | None
    """Called after a step in which a worker was replaced (the loop limits restarts)."""
    active: np.ndarray | None
    """``[T + 1, N]`` bool: whether row n acts on the observation in slot t (a
    multi-agent env's agent that left its episode does not); None: every row, always."""
    action_mask: np.ndarray | None
    """``[T + 1, N, M]`` bool: the actions env n allows in slot t (``fastvec.action_masks``)."""

    @property
    def groups(self) -> list[tuple[int, int]]:
        """The batch groups' env ranges ``(a, b)``; ``[(0, num_envs)]`` in lock-step."""
        ...

    @property
    def restarts(self) -> list[dict]:
        """One record per worker replaced so far (``restart_on_error``)."""
        ...

    @property
    def worker_pids(self) -> list[int]:
        """Pids of the local worker processes to watch (health metrics); [] for none."""
        ...

    def arrays(self) -> list[np.ndarray]:
        """The arrays to page-lock for CUDA ([]: none, or already pinned)."""
        ...

    def reset(self, seed: int | Sequence[int] | None) -> None:
        """Reset every env into slot 0: env i with ``seed[i]`` (one seed per env, the
        trainer's: ``fastvec.train.config.seeding``), or ``seed + i`` for an int; None: unseeded."""
        ...

    def step(self, slot: int) -> None:
        """Step every env on the actions in ``act[slot]``; the results land in ``slot``."""
        ...

    def send(self, g: int, slot: int) -> None:
        """Start group g's step on ``act[slot, a:b]`` and return at once."""
        ...

    def recv(self, g: int, slot: int) -> None:
        """Wait for group g's step started by ``send(g, slot)``."""
        ...

    def lost_wakeups(self) -> int | None:
        """Sleeps no doorbell ended so far (``Engine.wait_counts``); None off the engine."""
        ...

    def transport(self) -> dict:
        """How the envs were reached, for the result: ``num_workers``, ``main_spin_us``,
        ``env_groups``, ``backend``, ``placement`` (each worker's envs and measured share
        of a step; None where the storage does not place envs)."""
        ...

    def close(self) -> None:
        """Release what the storage owns (an engine it was given; never a caller's venv)."""
        ...


def single_leaf(space, what: str, where: str = ""):
    if isinstance(space, Dict | Tuple) and what == "action":  # (an env id's are flattened in its workers)
        raise ValueError(
            f"the PPO trainer takes {type(space).__name__} actions from envs it builds by id, or from envs "
            f"wrapped in fastvec.composite_actions.FlatActions{where}; got {space}"
        )
    if isinstance(space, Dict | Tuple):
        raise ValueError(
            f"the PPO trainer needs a single (non Dict/Tuple) {what} space{where}, got {space}; "
            "flatten it with a gymnasium wrapper"
        )


class EngineStorage:
    """Rollout storage = an engine's shared memory (zero copy): a ``fastvec.engine.Engine``
    (``RayEngineStorage`` for a ``fastvec.ray.RayEngine``) started with ``num_slots =
    n_steps + 1`` and ``autoreset_mode="same_step"``. Closing the storage closes the
    engine (it also does when the spaces do not suit the trainer). ``kind`` names the
    backend in the result; ``groups``: the batch groups (``TransportConfig.env_groups``).

    ``masked``: the envs are ``fastvec.action_masks.ActionMaskObservation``'s, ``(obs,
    mask)``: ``action_mask`` views the mask's leaf as bool (zero copy); each reset and step
    checks every env's mask allows an action (ValueError naming the env)."""

    active: np.ndarray | None = None  # every env acts at every step
    action_mask: np.ndarray | None = None

    def __init__(self, engine, kind: str = "fastvec", groups: int = 1, masked: bool = False):
        self.kind, self.masked = kind, masked
        self.engine = eng = engine
        try:
            self._check_spaces(eng)
            if eng.autoreset_mode != "same_step":
                raise ValueError(
                    f"the PPO trainer needs an engine with autoreset_mode='same_step', got {eng.autoreset_mode!r}"
                )
            self.groups, self._group_workers = self._batch_groups(groups)
        except ValueError:
            eng.close()
            raise
        self.num_workers = eng.num_workers
        self._views(eng)
        self._step_async = eng.step_async
        self._step_wait = eng.step_wait
        self.on_restart: Callable[[], None] | None = None  # called after a step in which the engine replaced a worker
        self._restarts_seen = 0
        self._placement: dict | None = None

    def _check_spaces(self, eng) -> None:
        obs_space = eng.single_observation_space
        if self.masked:  # (obs, mask): the env's own observation, and the mask's branches
            obs_space, self._branches = split_masked_space(obs_space, eng.single_action_space)
        input_leaves(obs_space)  # a Dict/Tuple's leaves: each one the policy can encode
        single_leaf(eng.single_action_space, "action")

    def _views(self, eng) -> None:
        """The protocol's arrays: the engine's own (one env, one row)."""
        self.num_envs = self.num_seeds = eng.num_envs
        obs_space = eng.single_observation_space  # masked: (obs, mask), the mask's 0/1 int8 read as bool
        self.single_observation_space = obs_space[0] if self.masked else obs_space
        self.action_mask = eng.obs_bufs[-1].view(np.bool_) if self.masked else None
        self.single_action_space = eng.single_action_space
        leaves = len(eng.obs_bufs) - self.masked  # masked: the mask is the last leaf, not the policy's
        obs, final = eng.obs_bufs[:leaves], eng.final_bufs[:leaves]
        composite = leaves > 1 or isinstance(self.single_observation_space, Dict | Tuple)
        self.obs = Leaves(obs) if composite else obs[0]  # a Dict/Tuple: each leaf its ring array
        self.final_obs = Leaves(final) if composite else final[0]
        self.act = eng.act_bufs[0]
        self.rewards = eng.rewards
        self.terminated = eng.terminated
        self.truncated = eng.truncated

    @property
    def restarts(self) -> list[dict]:
        """One record per worker the engine replaced (``restart_on_error``)."""
        return self.engine.restarts

    @property
    def worker_pids(self) -> list[int]:
        return self.engine.worker_pids

    def arrays(self) -> list[np.ndarray]:
        masks = [self.action_mask] * (self.action_mask is not None)
        return [
            *leaf_arrays(self.obs),
            *leaf_arrays(self.final_obs),
            self.act,
            self.rewards,
            self.terminated,
            self.truncated,
            *masks,
        ]

    def reset(self, seed: int | Sequence[int] | None, slot: int = 0) -> None:
        seeds = seeds_for(seed, self.num_seeds)
        self.engine.reset(slot, {i: ({} if seeds is None else {"seed": seeds[i]}) for i in range(self.num_seeds)})
        self._check_masks(slot, 0)

    def step(self, slot: int) -> None:
        self._step_async(IN_SLOT, slot)  # the policy wrote the actions into the slot
        self._step_wait()
        self._after_step()
        self._check_masks(slot, 0)

    def _check_masks(self, slot: int, first: int, last: int | None = None) -> None:
        if self.action_mask is not None:  # (ValueError: an env whose mask allows nothing)
            check_actable(self.action_mask[slot, first:last], self._branches, first, f"slot {slot}")

    def _after_step(self) -> None:
        if len(self.engine.restarts) != self._restarts_seen:
            self._restarts_seen = len(self.engine.restarts)
            if self.on_restart is not None:
                self.on_restart()

    # Batch groups (``TransportConfig.env_groups``): ``groups`` lists each group's envs
    # ``(a, b)``; ``send(g, slot)`` starts group g's step on the actions the policy wrote
    # into ``act[slot, a:b]`` and returns at once, ``recv(g, slot)`` waits for it. The
    # results land in the same ``[T + 1, N]`` arrays as a lock-step ``step(slot)``'s.
    def _batch_groups(self, groups: int):
        n = self.engine.num_envs
        if groups == 1:
            return [(0, n)], None
        if not hasattr(self.engine, "group_send"):
            raise ValueError(
                f"env_groups={groups} needs the engine backend ({type(self.engine).__name__} "
                "steps every env in lock-step)"
            )
        if n % groups:
            raise ValueError(f"env_groups={groups} must divide num_envs={n}")
        size = n // groups
        envs = [(a, a + size) for a in range(0, n, size)]
        return envs, [self.engine.workers_of(a, b) for a, b in envs]

    def send(self, g: int, slot: int) -> None:
        self.engine.group_send(self._group_workers[g], self.groups[g], IN_SLOT, None, slot)

    def recv(self, g: int, slot: int) -> None:
        self.engine.group_recv(self._group_workers[g], slot, slot - 1)
        self._after_step()
        self._check_masks(slot, *self.groups[g])

    def pause(self, first: int, last: int) -> None:
        """Leave envs ``first .. last - 1`` unstepped from the next step on
        (``Engine.pause``), where the engine can (else they go on stepping)."""
        if hasattr(self.engine, "pause"):
            self.engine.pause(range(first, last))

    def lost_wakeups(self) -> int | None:
        counts = self.engine.wait_counts()
        return counts["parent"]["lost"] + sum(w["lost"] for w in counts["workers"])

    def transport(self) -> dict:
        return {
            "num_workers": self.num_workers,
            "main_spin_us": self.engine.main_spin_us,
            "env_groups": len(self.groups),
            "backend": self.kind,
            "placement": self.placement(),
        }

    def placement(self) -> dict | None:
        """Each worker's envs and measured share of a step (``Engine.placement_report``),
        as of the close once closed; None for an engine without the report (Ray)."""
        if self._placement is None and hasattr(self.engine, "placement_report") and not self.engine.closed:
            return _placement_dict(self.engine.placement_report())
        return self._placement

    def close(self) -> None:
        if self._placement is None:
            try:
                self._placement = self.placement()
            except Exception:  # a broken engine: nothing measured to keep
                pass
        self.engine.close()


def _placement_dict(report) -> dict:
    return {
        "mode": report.mode,
        "workers": [list(envs) for envs in report.workers],
        "share_us": [round(x, 1) for x in report.share_us],
        "balance": round(report.balance, 3) if report.balance == report.balance else None,  # nan: not measured
    }


class RayEngineStorage(EngineStorage):
    """``EngineStorage`` over a ``fastvec.ray.RayEngine``: its workers are actors on their
    own nodes (their pids mean nothing to this machine's psutil), it keeps no wait counts
    and its actors' engines choose their own waits (``main_spin_us`` None); lock-step only."""

    def __init__(self, engine, masked: bool = False):
        super().__init__(engine, kind="fastvec-ray", masked=masked)

    @property
    def worker_pids(self) -> list[int]:
        return []

    def lost_wakeups(self) -> None:
        return None

    def transport(self) -> dict:
        return {
            "num_workers": self.num_workers,
            "main_spin_us": None,
            "env_groups": len(self.groups),
            "backend": self.kind,
            "placement": None,
        }


if TYPE_CHECKING:  # each storage implements the protocol (a type checker verifies it here)

    def _implements(s: EngineStorage | RayEngineStorage) -> RolloutStorage:
        return s
