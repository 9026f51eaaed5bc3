"""``Rollout``: the learner's tensors over a storage's ``[T + 1, N, ...]`` arrays."""
from __future__ import annotations

import numpy as np
import torch

from .policies import ActorCritic, GaussianDist
from .storage import alloc

__all__ = ["Rollout"]


class Rollout:
    """Tensors over the storage's ``[T+1, N, ...]`` buffers plus the learner's own
    ``[T, N]`` arrays (values, log-probs, advantages, returns).

    On CPU ``obs``, ``actions``, ``rewards``, ``terminated``, ``truncated`` and
    ``final_obs`` are ``torch.from_numpy`` views of the storage's buffers (for the engine:
    its shared memory). With CUDA, ``obs_dev`` is a device buffer filled slot by slot
    as the policy acts, and the categorical actions are sampled on the device.
    """

    def __init__(self, storage, policy: ActorCritic, T: int, device: torch.device):
        self.storage, self.T, self.N, self.device = storage, T, storage.num_envs, device
        self.cuda = device.type == "cuda"
        self.obs = torch.from_numpy(storage.obs)  # [T+1, N, *obs_shape]
        self.final_obs = torch.from_numpy(storage.final_obs)
        self.act = torch.from_numpy(storage.act)  # [T+1, N, *act_shape], what the env gets
        self.rewards = torch.from_numpy(storage.rewards)
        self.terminated = torch.from_numpy(storage.terminated)
        self.truncated = torch.from_numpy(storage.truncated)
        T, N = self.T, self.N
        dist = policy.dist
        self.gaussian = isinstance(dist, GaussianDist)
        dev = device
        pin = self.cuda
        # Learner-side arrays (numpy views kept for fastvec.gae).
        self.values_np = alloc((T + 1, N), np.float32, pin)
        self.next_values_np = alloc((T, N), np.float32, pin)
        self.adv_np = alloc((T, N), np.float32, pin)
        self.ret_np = alloc((T, N), np.float32, pin)
        self.values_host = torch.from_numpy(self.values_np)
        self.next_values_host = torch.from_numpy(self.next_values_np)
        if self.cuda:
            self.obs_dev = torch.empty(self.obs.shape, dtype=self.obs.dtype, device=dev)
            act_dtype = torch.float32 if self.gaussian else torch.int64
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
        self.logp = torch.empty((T, N), device=dev)
        self.raw = torch.empty((T, N, dist.dim), device=dev) if self.gaussian else None
        self.noise = torch.empty((T, *dist.noise_shape(N)), device=dev)
        # Per-slot views, made once (no per-step indexing in the hot loop).
        self.obs_slots = list(self.obs_dev.unbind(0))
        self.obs_host_slots = list(self.obs.unbind(0))
        self.act_slots = list(self.act_dev.unbind(0))
        self.act_host_slots = list(self.act.unbind(0))
        self.noise_slots = list(self.noise.unbind(0))
        self.raw_slots = list(self.raw.unbind(0)) if self.gaussian else [None] * T
        if policy.values_at_act:
            self.logp_slots = list(self.logp.unbind(0))
            self.value_slots = list(self.values.unbind(0))
        else:
            self.logp_slots = self.value_slots = [None] * T

    # what the learner trains on
    def batch_obs(self) -> torch.Tensor:
        return self.obs_dev[: self.T].reshape(self.T * self.N, *self.obs.shape[2:])

    def batch_actions(self) -> torch.Tensor:
        if self.gaussian:
            return self.raw.reshape(self.T * self.N, -1)
        a = self.act_dev[1:]
        return a.reshape(self.T * self.N, *a.shape[2:])
