"""``Rollout``: the learner's tensors over a storage's ``[T + 1, N, ...]`` arrays."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..compute.pinned import alloc
from ..model.actor_critic import ActorCritic
from ..model.observations import as_torch, empty_like_on

__all__ = ["Rollout", "StepSlots"]


class StepSlots(NamedTuple):
    """What acting reads and writes at one step ``t`` of a rollout (views made once: no
    indexing in the hot loop). With zero copy ``obs is obs_host`` and ``act is act_host``."""

    obs: torch.Tensor  # observation slot t, where the policy reads it
    obs_host: torch.Tensor  # observation slot t, where the env wrote it
    noise: torch.Tensor  # the sampling noise of step t
    act: torch.Tensor  # action slot t + 1, where the policy writes it
    act_host: torch.Tensor  # action slot t + 1, where the env reads it
    raw: torch.Tensor | None  # the raw sample log_prob takes (a Gaussian's unclipped; None: categorical)
    logp: torch.Tensor | None  # log-prob and value, where the policy gives them while
    value: torch.Tensor | None  # acting (a shared trunk); None: computed per rollout
    mask: torch.Tensor | None = None  # action mask slot t, where the policy reads it (None: unmasked)
    mask_host: torch.Tensor | None = None  # action mask slot t, where the env wrote it

    def rows(self, a: int, b: int) -> StepSlots:
        """The same slots, for envs ``a`` to ``b`` (a batch group)."""
        return StepSlots(*(None if x is None else x[a:b] for x in self))


class Rollout:
    """Tensors over the storage's ``[T+1, N, ...]`` buffers plus the learner's own
    ``[T, N]`` arrays (values, log-probs, advantages, returns).

    Zero copy (on the CPU): ``obs``, ``actions``, ``rewards``, ``terminated``,
    ``truncated`` and ``final_obs`` are ``torch.from_numpy`` views of the storage's
    buffers (for the engine: its shared memory), and the learner's tensors are its
    numpy arrays. With separate device buffers (``copies``: on a GPU, and on the CPU
    when asked, which is how the tests run this path without one) ``obs_dev`` is a
    buffer of its own filled slot by slot as the policy acts, the actions are sampled
    there and copied to the env's slot, and values, advantages and returns are copied
    between the device and the host arrays ``fastvec.gae`` works on.

    ``copies``: None for "exactly when ``device`` is not the CPU"; ``pin``: page-lock
    the host arrays (None: exactly on CUDA). ``shared``: numpy arrays that hold what acting
    records, ``raw`` ``[T, N, dim]``, ``logp`` ``[T, N]`` and ``values`` ``[T + 1, N]``
    (the async pipeline's shared memory, where its learner reads them; zero copy only).

    A masked run's ``mask`` ``[T + 1, N, M]`` (bool) views the storage's ``action_mask``
    (``mask_dev``: its device buffer with copies, filled slot by slot as the policy acts):
    the mask in slot t is the one acting honoured at step t, and ``batch_actions`` gives the
    learner each action joined with its mask (``CategoricalDist.join``).

    A recurrent policy's rows (``memory``): ``states`` ``[T + 1, N, state_size]``, the
    state each env was fed at each step (``fastvec.train.model.cores``), and ``starts``
    ``[T + 1, N]``, where an episode starts (the previous step ended one); the last
    rollout's slot T is the next one's slot 0, as for the observations (in ``shared``
    too with the async pipeline, where the collector records them).
    """

    def __init__(
        self,
        storage,
        policy: ActorCritic,
        T: int,
        device: torch.device,
        *,
        copies: bool | None = None,
        pin: bool | None = None,
        shared: dict | None = None,
    ):
        self.storage, self.T, self.N, self.device = storage, T, storage.num_envs, device
        if device.type != "cpu" and copies is False:
            raise ValueError(f"zero copy needs the learner on the CPU, not {device}")
        self.copies = device.type != "cpu" if copies is None else bool(copies)
        self.obs = as_torch(storage.obs)  # [T+1, N, *obs_shape] (``Leaves`` of them: a Dict/Tuple space)
        self.final_obs = as_torch(storage.final_obs)
        self.act = torch.from_numpy(storage.act)  # [T+1, N, *act_shape], what the env gets
        self.rewards = torch.from_numpy(storage.rewards)
        self.terminated = torch.from_numpy(storage.terminated)
        self.truncated = torch.from_numpy(storage.truncated)
        active = getattr(storage, "active", None)  # [T+1, N]: the rows that act (agents); None: all
        self.active = None if active is None else torch.from_numpy(active)
        dist = self.dist = policy.dist
        self.keeps_raw = dist.raw_action_dtype is not None  # (a Gaussian's unclipped samples, a ProductDist's)
        self.shared = shared
        self._learner_arrays(device.type == "cuda" if pin is None else pin)
        self._acting_arrays(dist)
        self._mask_arrays(storage, policy)
        at_act = self.at_act = policy.values_at_act
        self.steps = [
            StepSlots(
                self.obs_dev[t],
                self.obs[t],
                self.noise[t],
                self.act_dev[t + 1],
                self.act[t + 1],
                self.raw[t] if self.keeps_raw else None,
                self.logp[t] if at_act else None,
                self.values[t] if at_act else None,
                None if self.mask is None else self.mask_dev[t],
                None if self.mask is None else self.mask[t],
            )
            for t in range(T)
        ]
        self._by_group: list | None = None
        self.memory = policy.recurrent
        if self.memory:  # (slot 0 is set before each rollout: ``begin_sequences``)
            if self.shared is not None and not self.copies:  # the other process may be writing them: no writes here
                self.states, self.starts = torch.from_numpy(shared["states"]), torch.from_numpy(shared["starts"])
            else:
                self.states = torch.zeros((T + 1, self.N, policy.state_size), device=device)
                self.starts = torch.ones((T + 1, self.N), dtype=torch.bool, device=device)

    def _learner_arrays(self, pin: bool) -> None:
        """Values, advantages and returns: host arrays (numpy, for ``fastvec.gae``) and,
        with copies, their device buffers; the observations' and actions' device buffers."""
        T, N, dev = self.T, self.N, self.device
        zero_copy_shared = self.shared is not None and not self.copies
        self.values_np = self.shared["values"] if zero_copy_shared else alloc((T + 1, N), np.float32, pin)
        self.next_values_np = alloc((T, N), np.float32, pin)
        self.adv_np = alloc((T, N), np.float32, pin)
        self.ret_np = alloc((T, N), np.float32, pin)
        self.values_host = torch.from_numpy(self.values_np)
        self.next_values_host = torch.from_numpy(self.next_values_np)
        if self.copies:
            self.obs_dev = empty_like_on(self.obs, dev)
            act_dtype = torch.float32 if self.keeps_raw else torch.int64
            self.act_dev = torch.empty(self.act.shape, dtype=act_dtype, device=dev)
            self.values = torch.empty((T + 1, N), device=dev)
            self.adv = torch.empty((T, N), device=dev)
            self.ret = torch.empty((T, N), device=dev)
        else:
            self.obs_dev = self.obs
            self.act_dev = self.act
            self.values = self.values_host
            self.adv = torch.from_numpy(self.adv_np)
            self.ret = torch.from_numpy(self.ret_np)

    def _acting_arrays(self, dist) -> None:
        """What acting records beside the storage: log-probs, the Gaussian's raw samples
        (the async pipeline's shared memory where given), the rollout's sampling noise."""
        T, N, dev = self.T, self.N, self.device
        if self.shared is not None and not self.copies:
            self.logp = torch.from_numpy(self.shared["logp"])
            self.raw = torch.from_numpy(self.shared["raw"]) if self.keeps_raw else None
        else:
            self.logp = torch.empty((T, N), device=dev)
            self.raw = torch.empty((T, N, dist.dim), device=dev) if self.keeps_raw else None
        self.noise = torch.empty((T, *dist.noise_shape(N)), device=dev)

    def _mask_arrays(self, storage, policy) -> None:
        """The action masks' views (``mask``, ``mask_dev``; None: an unmasked run)."""
        masks = getattr(storage, "action_mask", None)
        if (masks is not None) != policy.masked:
            raise ValueError(
                "the policy takes action masks but the envs give none"
                if policy.masked
                else "the envs give action masks but the policy does not take them"
            )
        self.mask = None if masks is None else torch.from_numpy(masks)
        self.mask_dev = self.mask
        if self.mask is not None and self.copies:
            self.mask_dev = torch.empty(self.mask.shape, dtype=torch.bool, device=self.device)

    def steps_by_group(self) -> list[list[StepSlots]] | None:
        """Per batch group of the storage (``groups``), per step t: that group's rows of
        ``steps[t]`` (made once: no slicing in the hot loop); None with one group."""
        groups = self.storage.groups
        if len(groups) < 2:
            return None
        if self._by_group is None:
            self._by_group = [[slots.rows(a, b) for slots in self.steps] for a, b in groups]
        return self._by_group

    def acted_mask(self) -> torch.Tensor | None:
        """``[T N]``: whether sample ``t * N + n``'s row acted, on the device; None where
        every one did. A multi-agent env's agent that left its episode is a row that does
        not act (``storage.active``) until its copy resets: no sample to learn from there."""
        if self.active is None:
            return None
        mask = self.active[: self.T].reshape(-1)
        return None if bool(mask.all()) else mask.to(self.device)

    def acted(self) -> torch.Tensor | None:
        """``acted_mask`` as the indices of the samples that acted (None: all did)."""
        mask = self.acted_mask()
        return None if mask is None else mask.nonzero().squeeze(1)

    def acted_obs(self, first: int = 0) -> torch.Tensor:
        """The observations of slots ``first..T`` that a row acted on (all of them
        without ``storage.active``): what the observation normaliser takes in."""
        obs = self.obs_dev[first:]
        if self.active is None:
            return obs
        return obs[self.active[first:].to(obs.device)]

    # A recurrent policy's states (no-ops without one).
    def begin_sequences(self, last: Rollout | None) -> None:
        """Before a rollout: slot 0's states and starts are slot T's of ``last``, the
        rollout collected before (this one in lock-step, the ring's previous section in
        async); None: every env starts an episode here (the envs were just reset)."""
        if last is None:
            self.states[0].zero_()
            self.starts[0].fill_(True)
        else:
            self.states[0].copy_(last.states[self.T])
            self.starts[0].copy_(last.starts[self.T])

    def mark_starts(self, t: int) -> None:
        """After the envs' step into slot ``t``: where it ended an episode, the state fed
        at ``t`` is zero; so is it where a row did not act at ``t - 1`` (agents: an
        agent that left starts afresh when its copy resets)."""
        ended = self.terminated[t] | self.truncated[t]
        if self.active is not None:
            ended = ended | ~self.active[t - 1]
        self.starts[t].copy_(ended, non_blocking=True)
        self.states[t].mul_((~self.starts[t]).unsqueeze(-1))

    @property
    def cuda(self) -> bool:
        """The learner's device is a GPU."""
        return self.device.type == "cuda"

    # The copies between the host arrays and separate device buffers (no-ops with zero copy).
    def last_obs_to_device(self) -> None:
        """Observation slot T (where the next rollout starts) to the device."""
        if self.copies:
            self.obs_dev[self.T].copy_(self.obs[self.T], non_blocking=True)
            if self.mask is not None:
                self.mask_dev[self.T].copy_(self.mask[self.T], non_blocking=True)

    def values_to_host(self) -> None:
        """The values to the host array ``fastvec.gae`` reads (synchronous)."""
        if self.copies:
            self.values_host.copy_(self.values)

    def targets_to_device(self) -> None:
        """The advantages and returns ``fastvec.gae`` wrote to the device."""
        if self.copies:
            self.adv.copy_(torch.from_numpy(self.adv_np), non_blocking=True)
            self.ret.copy_(torch.from_numpy(self.ret_np), non_blocking=True)

    def acted_to_device(self) -> None:
        """A rollout acted in another process (the async pipeline's collector: ``shared``
        holds what it recorded) onto the separate device buffers; a no-op with zero copy."""
        if not self.copies:
            return
        T, sh = self.T, self.shared
        self.obs_dev.copy_(self.obs, non_blocking=True)
        if self.keeps_raw:
            self.raw.copy_(torch.from_numpy(sh["raw"]), non_blocking=True)
        else:
            self.act_dev[1:].copy_(self.act[1:], non_blocking=True)
        if self.at_act:
            self.logp.copy_(torch.from_numpy(sh["logp"]), non_blocking=True)
            self.values[:T].copy_(torch.from_numpy(sh["values"][:T]), non_blocking=True)
        if self.memory:  # the states acting fed and the log-probs it recorded
            self.states.copy_(torch.from_numpy(sh["states"]), non_blocking=True)
            self.starts.copy_(torch.from_numpy(sh["starts"]), non_blocking=True)
            self.logp.copy_(torch.from_numpy(sh["logp"]), non_blocking=True)

    # what the learner trains on
    def batch_obs(self) -> torch.Tensor:
        return self.obs_dev[: self.T].flatten(0, 1)

    def batch_actions(self) -> torch.Tensor:
        """The rollout's actions, sample ``t * N + n`` in row ``t * N + n`` (a Gaussian's or a
        composite action's raw samples; a masked run's joined with the masks acting honoured)."""
        if self.keeps_raw:
            return self.raw.reshape(self.T * self.N, -1)
        a = self.act_dev[1:]
        a = a.reshape(self.T * self.N, *a.shape[2:])
        if self.mask is None:
            return a
        return self.dist.join(a, self.mask_dev[: self.T].reshape(self.T * self.N, -1))
