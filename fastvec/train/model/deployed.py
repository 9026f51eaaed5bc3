"""A trained policy's actor on its own: observations in, actions out, for export.

``DeployedPolicy`` holds a copy of an ``ActorCritic``'s acting half (the observation's
preprocessing with the normaliser's statistics as constants, the actor's encoder, core and
head, the action's choice) and nothing of the critic or the trainer, in operations that
TorchScript and ONNX both express, so that ``fastvec.train.commands.export`` can write it
as a file that runs where fastvec is not installed.

Its forward:

- ``forward(obs) -> action`` for a policy without memory;
- ``forward(obs, state) -> (action, state)`` for a recurrent one (``policy_core=lstm|gru``):
  ``state`` is ``[B, state_size]`` (the actor's core's: an LSTM's ``h`` then ``c``), zeros
  where an episode starts, and the state returned is the one to feed at the next step.

``obs`` is a batch ``[B, *observation shape]`` in the env's own dtype (``uint8`` images,
``float32`` vectors, ``int64`` for a ``Discrete`` observation); ``action`` is ``[B, *action
shape]``: ``int64`` for ``Discrete`` / ``MultiDiscrete`` / ``MultiBinary`` actions, ``float32``
for a ``Box``. Deterministic (the default): a categorical's most likely choice, a
Gaussian's mean clipped to the action bounds, the numbers the trainer's deterministic act
gives (``ActorCritic.predict(obs, deterministic=True)``). ``deterministic=False`` samples as
the trainer does (Gumbel-max; the mean plus ``exp(log_std)`` times a standard normal draw,
then clipped) from the runtime's own random numbers.

The policies take no action mask: where one comes (a policy that masks invalid actions),
it is one more input of this forward, before the state.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from .actor_critic import ActorCritic
from .distributions import GaussianDist, ProductDist

__all__ = ["DeployedPolicy"]


class DeployedPolicy(nn.Module):
    """The acting half of ``policy`` (copied: later changes to ``policy`` do not reach it);
    see the module docstring for its forward."""

    def __init__(self, policy: ActorCritic, deterministic: bool = True):
        super().__init__()
        if policy.masked:
            raise ValueError(
                "a policy trained with action masks is not exported (its actions need the env's mask): "
                "use ActorCritic.predict(obs, mask=...)"
            )
        if isinstance(policy.dist, ProductDist):
            raise ValueError("fastvec export does not export composite-action policies yet (eval runs them)")
        if policy.kind == "multi":
            raise ValueError("fastvec export does not export Dict/Tuple-observation policies yet (eval runs them)")
        self.deterministic = bool(deterministic)
        self.recurrent = bool(policy.recurrent)
        self.state_size = int(policy.acting_state)
        self.image, self.hwc = bool(policy.image), bool(getattr(policy, "hwc", False))
        self.obs_dim = 0 if self.image else int(policy.obs_dim)
        self.one_hot_start = int(policy.obs_start) if not self.image and policy.one_hot else -1
        body = policy.body if policy.image else policy.actor_body
        self.encoder = copy.deepcopy(body.encoder)
        self.core = copy.deepcopy(body.core)
        self.head = copy.deepcopy(policy.actor_head)
        # The observation normaliser's statistics, as constants: clip((x - shift) * scale).
        self.normalise = policy.obs_norm is not None
        shift, scale, clip = (torch.zeros(1), torch.ones(1), 0.0)
        if policy.obs_norm is not None:
            shift, scale, clip = policy.obs_norm.affine()
        self.register_buffer("shift", shift.detach().clone().float())
        self.register_buffer("scale", scale.detach().clone().float())
        self.clip = float(clip)
        self._action_choice(policy.dist)
        self.requires_grad_(False)  # an acting copy: its outputs need no gradient
        self.eval()

    def _action_choice(self, dist: nn.Module) -> None:
        self.gaussian = isinstance(dist, GaussianDist)
        self.action_shape = [int(s) for s in dist.action_shape]
        if self.gaussian:
            self.bounded = bool(dist.bounded)
            self.register_buffer("low", dist.low.detach().clone())
            self.register_buffer("high", dist.high.detach().clone())
            self.register_buffer("std", dist.log_std.detach().exp().clone())
            self.k, self.max_n = 1, 1
            return
        self.bounded = False
        self.k, self.max_n = int(dist.k), int(dist.max_n)
        self.register_buffer("neg_inf", dist.neg_inf.detach().clone())  # -inf on choices a component lacks
        self.register_buffer("start", dist.start.detach().clone())

    def preprocess(self, obs: torch.Tensor) -> torch.Tensor:
        """Observations as the trainer's network reads them (``ActorCritic.preprocess``)."""
        if self.image:
            x = obs.permute(0, 3, 1, 2) if self.hwc else obs
            return x.float() * (1.0 / 255.0) if obs.dtype == torch.uint8 else x.float()
        if self.one_hot_start >= 0:
            return F.one_hot(obs.reshape(-1).long() - self.one_hot_start, self.obs_dim).float()
        x = obs.reshape(obs.shape[0], self.obs_dim).float()
        if self.normalise:
            x = torch.clamp((x - self.shift) * self.scale, -self.clip, self.clip)
        return x

    def choose(self, params: torch.Tensor) -> torch.Tensor:
        """The action from the actor head's output ``[B, n_params]``."""
        b = params.shape[0]
        if self.gaussian:
            a = params if self.deterministic else params + self.std * torch.randn_like(params)
            if self.bounded:
                a = torch.minimum(torch.maximum(a, self.low), self.high)
            return a.reshape([b] + self.action_shape)
        logits = params.reshape(b, self.k, self.max_n) + self.neg_inf
        if not self.deterministic:  # Gumbel-max, as CategoricalDist samples
            exp1 = (-torch.log(torch.rand_like(logits).clamp(min=1e-30))).clamp(min=1e-30)  # Exp(1) draws
            logits = logits - torch.log(exp1)
        idx = logits.argmax(-1) + self.start
        return idx.reshape([b] + self.action_shape)

    def forward(self, obs: torch.Tensor, state: torch.Tensor | None = None):
        h = self.encoder(self.preprocess(obs))
        if not self.recurrent:
            return self.choose(self.head(h))
        if state is None:
            raise ValueError("a recurrent policy acts with its state: forward(obs, state)")
        y, left = self.core.step(h, state)
        return self.choose(self.head(y)), left
