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
- ``GymVectorStorage``, ``SB3VecStorage`` (``storage_for(venv)`` picks one): own arrays
  of the same layout, filled from a vector env the caller owns (how the benchmarks
  compare the transports).

``HostPin`` (page-locking for asynchronous copies to a GPU) lives in ``fastvec.train.compute.pinned``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from ..._core.base import IN_SLOT
from ..._core.segment import leaves_of
from ...action_masks import check_actable, split_masked_space
from ..compute.pinned import HostPin, alloc
from ..config.seeding import seeds_for

__all__ = [
    "RolloutStorage",
    "EngineStorage",
    "RayEngineStorage",
    "GymVectorStorage",
    "SB3VecStorage",
    "storage_for",
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
    obs: np.ndarray
    final_obs: np.ndarray
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


def _single_leaf(space, what: str):
    from gymnasium import spaces

    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        raise ValueError(
            f"the PPO trainer needs a single (non Dict/Tuple) {what} space, got {space}; "
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
        _single_leaf(obs_space, "observation")
        _single_leaf(eng.single_action_space, "action")

    def _views(self, eng) -> None:
        """The protocol's arrays: the engine's own (one env, one row)."""
        self.num_envs = self.num_seeds = eng.num_envs
        obs_space = eng.single_observation_space  # masked: (obs, mask), the mask's 0/1 int8 read as bool
        self.single_observation_space = obs_space[0] if self.masked else obs_space
        self.action_mask = eng.obs_bufs[-1].view(np.bool_) if self.masked else None
        self.single_action_space = eng.single_action_space
        self.obs = eng.obs_bufs[0]
        self.final_obs = eng.final_bufs[0]
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
        return [self.obs, self.final_obs, self.act, self.rewards, self.terminated, self.truncated, *masks]

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


class _CopyStorage:
    """Own buffers with the engine's layout, filled from another vector env, which steps
    every env in lock-step: one batch group, no restarts of its own, no wait counts."""

    kind: str
    num_envs: int
    num_workers: int | None
    single_observation_space: Any
    single_action_space: Any
    on_restart: Callable[[], None] | None = None  # never called: the vector env restarts nothing here
    active: np.ndarray | None = None
    action_mask: np.ndarray | None = None  # (a vector env of your own: no masks)

    def _alloc_arrays(self, num_slots: int, pin: bool) -> None:
        _single_leaf(self.single_observation_space, "observation")
        _single_leaf(self.single_action_space, "action")
        (o,), (a,) = leaves_of(self.single_observation_space), leaves_of(self.single_action_space)
        S, N = num_slots, self.num_envs
        self.obs = alloc((S, N, *o.shape), o.dtype, pin)
        self.final_obs = alloc((S, N, *o.shape), o.dtype, pin)
        self.act = alloc((S, N, *a.shape), a.dtype, pin)
        self.rewards = alloc((S, N), np.float64, pin)
        self.terminated = alloc((S, N), np.bool_, pin)
        self.truncated = alloc((S, N), np.bool_, pin)

    worker_pids: list = []

    @property
    def restarts(self) -> list[dict]:  # the caller's vector env does its own fault handling
        return []

    @property
    def groups(self) -> list[tuple[int, int]]:
        return [(0, self.num_envs)]

    step: Callable[[int], None]  # each vector env's own: step it on act[slot], copy its results into slot

    def arrays(self) -> list[np.ndarray]:
        return []  # already pinned at allocation when needed

    def send(self, g: int, slot: int) -> None:
        self.step(slot)  # the only group: the whole step, done when this returns

    def recv(self, g: int, slot: int) -> None:
        pass  # send's step is already done

    def lost_wakeups(self) -> None:
        return None

    def transport(self) -> dict:
        return {
            "num_workers": self.num_workers,
            "main_spin_us": None,
            "env_groups": 1,
            "backend": self.kind,
            "placement": None,
        }

    def close(self) -> None:  # the caller owns the vector env
        pass


class GymVectorStorage(_CopyStorage):
    """A gymnasium ``VectorEnv`` with same-step autoreset (``info["final_obs"]``)."""

    kind = "gymnasium"

    def __init__(self, venv, num_slots: int, pin: bool = False):
        from gymnasium.vector import AutoresetMode

        mode = venv.metadata.get("autoreset_mode", None)
        if mode not in (AutoresetMode.SAME_STEP, "same_step", "SameStep"):
            raise ValueError(
                "the PPO trainer needs a gymnasium VectorEnv with "
                "autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP, got "
                f"{mode!r}"
            )
        self.venv = venv
        self.num_envs = self.num_seeds = venv.num_envs
        self.single_observation_space = venv.single_observation_space
        self.single_action_space = venv.single_action_space
        self.num_workers = getattr(venv, "num_workers", None)
        self._alloc_arrays(num_slots, pin)
        self.worker_pids = [p.pid for p in getattr(venv, "processes", [])]

    def reset(self, seed):
        if seed is not None and not isinstance(seed, (int, np.integer)):  # one per env: a list
            seed = seeds_for(seed, self.num_envs)
        obs, _ = self.venv.reset(seed=seed)
        self.obs[0] = obs

    def step(self, slot):
        obs, rew, term, trunc, info = self.venv.step(self.act[slot])
        self.obs[slot] = obs
        self.rewards[slot] = rew
        self.terminated[slot] = term
        self.truncated[slot] = trunc
        mask = info.get("_final_obs")
        if mask is not None and mask.any():
            fo = info["final_obs"]
            for i in np.flatnonzero(mask):
                self.final_obs[slot, i] = fo[i]


class SB3VecStorage(_CopyStorage):
    """A ``step_async`` / ``step_wait`` vector env: SB3's ``VecEnv`` API (``step`` ->
    obs, rewards, dones, infos, truncation in ``infos[i]["TimeLimit.truncated"]``) or a
    baselines-style ``SubprocVecEnv`` with gymnasium's 5-tuple (``step`` -> obs,
    rewards, terminated, truncated, infos). Either way the final observation of an
    ended episode must be in ``infos[i]["terminal_observation"]`` (or ``"final_obs"``):
    without it a truncated episode cannot be bootstrapped."""

    kind = "subproc"

    def __init__(self, venv, num_slots: int, pin: bool = False):
        self.venv = venv
        self.num_envs = self.num_seeds = venv.num_envs
        self.single_observation_space = venv.observation_space
        self.single_action_space = venv.action_space
        procs = getattr(venv, "processes", None) or getattr(venv, "ps", None) or []
        self.num_workers = len(procs) or None
        self._alloc_arrays(num_slots, pin)
        self.worker_pids = [p.pid for p in procs]

    def reset(self, seed):
        """SB3's ``VecEnv.seed(seed)`` takes one int and seeds env i with ``seed + i``
        (a baselines-style ``reset(seed=...)`` too): given one seed per env, env 0's
        is that int and env i gets it ``+ i``, not its own."""
        import inspect

        seeds = seeds_for(seed, self.num_envs)
        seed = None if seeds is None else seeds[0]
        try:
            takes_seed = "seed" in inspect.signature(self.venv.reset).parameters
        except (TypeError, ValueError):
            takes_seed = False
        if takes_seed:
            out = self.venv.reset(seed=seed)
        else:  # SB3: seed() then reset()
            if seed is not None:
                self.venv.seed(seed)
            out = self.venv.reset()
        self.obs[0] = out[0] if isinstance(out, tuple) else out

    def step(self, slot):
        out = self.venv.step(self.act[slot])
        if len(out) == 5:
            obs, rew, term, trunc, infos = out
            self.terminated[slot] = term
            self.truncated[slot] = trunc
            done = np.logical_or(term, trunc)
        else:
            obs, rew, done, infos = out
            self.terminated[slot] = done
            self.truncated[slot] = False
        self.obs[slot] = obs
        self.rewards[slot] = rew
        if done.any():
            for i in np.flatnonzero(done):
                info = infos[i]
                final = info.get("terminal_observation", info.get("final_obs"))
                if final is None:
                    raise ValueError(
                        f"{type(self.venv).__name__} does not report the final observation of an "
                        "ended episode (infos[i]['terminal_observation']); the trainer needs it"
                    )
                self.final_obs[slot, i] = final
                if len(out) == 4 and info.get("TimeLimit.truncated", False):
                    self.truncated[slot, i] = True
                    self.terminated[slot, i] = False


def storage_for(venv, num_slots: int, pin: bool = False):
    """Wrap a vector env the trainer did not create itself."""
    import gymnasium as gym

    if isinstance(venv, gym.vector.VectorEnv):
        return GymVectorStorage(venv, num_slots, pin)
    if hasattr(venv, "step_async") and hasattr(venv, "step_wait") and hasattr(venv, "num_envs"):
        return SB3VecStorage(venv, num_slots, pin)
    raise ValueError(f"cannot train on {type(venv).__name__}: give a gymnasium VectorEnv or an SB3 VecEnv")


if TYPE_CHECKING:  # each storage implements the protocol (a type checker verifies it here)

    def _implements(s: EngineStorage | RayEngineStorage | GymVectorStorage | SB3VecStorage) -> RolloutStorage:
        return s
