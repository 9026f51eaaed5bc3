"""Actor-critic policies for the PPO trainer, chosen from the spaces, in three pieces:
an **encoder** (``fastvec.train.model.encoders``), a **core** (``fastvec.train.model.cores``: none, or
an LSTM or GRU: ``policy_core``) and the **heads** (a linear layer to the action distribution's parameters,
``fastvec.train.model.distributions``, and one to the value).

- Observations: an MLP encoder for vector observations (any non-image ``Box``,
  ``Discrete`` one-hot, ``MultiBinary``/``MultiDiscrete`` as numbers); the Nature CNN for
  images (a ``uint8`` ``Box`` of shape ``[C, H, W]``, e.g. 4 stacked 84x84 Atari frames);
  for a ``Dict`` or ``Tuple`` observation, ``MultiInputActorCritic``: an encoder per leaf,
  concatenated, before the MLP bodies (``fastvec.train.model.observations``).
- Actions: a categorical head for ``Discrete``, ``MultiDiscrete`` and ``MultiBinary``; a
  diagonal Gaussian with a state-independent log std for ``Box``. ``action_masks``: the
  categorical takes action masks (``masked``): every acting call is given the step's mask,
  and ``predict`` needs one.

The MLP policy has two bodies (encoder and core), the actor's and the critic's (as SB3's
default ``MlpPolicy``), of the sizes ``hidden`` (both) or ``hidden`` and
``critic_hidden``; the CNN's one body is shared by both heads (as SB3's ``CnnPolicy`` and
CleanRL). One code path serves both: ``features`` gives the actor's and the critic's
features, the same tensor where the body is shared.

Acting is designed for the trainer's hot loop: ``act_`` samples with noise drawn for a
whole rollout and writes the actions straight into the caller's tensors; an MLP acts
through its ``ActingPath`` (``fastvec.train.model.acting``: functional, or numpy on the CPU).
With separate bodies only the actor runs per step (``values_at_act`` is False): the
trainer computes values and log-probabilities for the whole rollout in one batch
afterwards, which is exact because the policy does not change during a rollout. With a
shared body (CNN) the value and log-probability come from the same forward pass and are
stored per step.

With a recurrent core (``recurrent``) acting steps the actor's core with the state each
env was fed (``act_recurrent``); the critic's core, and every value and old log-prob, come
from one pass over the whole rollout afterwards (``params_and_value`` of ``Sequences``),
which also records the states PPO's epochs replay their sequences from.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import torch.nn as nn
from gymnasium import spaces

from ..compute.ranks import SOLO, Ranks
from .acting import ActingPath, build_acting_path, vector_input
from .cores import make_core
from .distributions import GaussianDist, ProductDist, make_dist
from .encoders import ACTIVATIONS, NatureCNN, RunningNorm, mlp_encoder, orthogonal
from .observations import (
    Leaves,
    MultiInputEncoder,
    batch_leaves,
    flat_obs_dim,
    image_layout,
    input_leaves,
    is_image_space,
)

__all__ = [
    "ActorCritic",
    "MultiInputActorCritic",
    "Body",
    "Sequences",
    "make_policy",
    "describe_policy",
    "ACTIVATIONS",
]


class Sequences(NamedTuple):
    """``B`` sequences of ``L`` steps for a recurrent policy's batched passes: the
    observations ``[L, B, ...]``, the state fed at step 0 ``[B, state_size]`` and where
    episodes start ``[L, B]`` (bool). Results over them are flat, step-major: row
    ``t * B + b`` is step ``t`` of sequence ``b``. ``keep``: the rows that count in a
    loss (``params_and_value`` returns those only: agents' rows that acted); None: all."""

    obs: torch.Tensor
    state: torch.Tensor
    starts: torch.Tensor
    keep: torch.Tensor | None = None


class Body(nn.Module):
    """An encoder, then a core: observations (as the network reads them) -> features."""

    def __init__(self, encoder: nn.Module, core: nn.Module):
        super().__init__()
        self.encoder, self.core = encoder, core

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.core(self.encoder(x))


class ActorCritic(nn.Module):
    """Policy and value function for one pair of spaces (see the module docstring).

    ``act_(obs, noise, act_out, raw_out, logp_out, value_out)`` samples for one step;
    ``evaluate(obs, actions)`` gives (log_prob, entropy, value) for training;
    ``value(obs)``, ``params_and_value(obs)`` and ``log_prob(obs, actions)`` are used on
    whole rollouts.
    """

    def __init__(
        self,
        obs_space: spaces.Space,
        act_space: spaces.Space,
        *,
        hidden=(64, 64),
        critic_hidden=None,
        activation: str = "tanh",
        ortho_init: bool = True,
        log_std_init: float = 0.0,
        normalize_obs: bool = False,
        cnn_features: int = 512,
        core: str = "none",
        core_size: int = 128,
        action_masks: bool = False,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.obs_space, self.act_space = obs_space, act_space
        self.dist = make_dist(act_space, log_std_init, masked=action_masks)
        self.masked = bool(action_masks)
        self.image = is_image_space(obs_space)
        self.kind = "cnn" if self.image else "mlp"
        self.obs_norm = None
        self.one_hot = False
        self.core_kind, self.core_size = core, int(core_size)
        self.recurrent = core != "none"
        # The pieces are made (and their random initial weights drawn) in the order they
        # are registered: the actor's body and head, then the critic's.
        if self.image:
            self._shared_body(obs_space, cnn_features)
        else:
            self.obs_dim, own_norm = self._input_size(obs_space, cnn_features, normalize_obs)
            self._separate_bodies(hidden, critic_hidden, activation, ortho_init)
            if own_norm:
                self.obs_norm = RunningNorm(self.obs_dim)
        self.values_at_act = self.image and not self.recurrent
        sizes = [m.core.state_size for m in self._bodies()]
        self.state_size = sum(sizes)  # recurrent state per env: the actor's core's, then the critic's
        self.acting_state = sizes[0]  # the columns of a state row acting computes: the actor's core's
        # Small float-convertible vector observations can be packed with the other
        # per-sample training data (one gather per epoch; see fastvec.train.algo.update).
        self.packable_obs = (
            not self.image and not self.one_hot and isinstance(obs_space, spaces.Box) and self.obs_dim <= 4096
        )
        self._acting: ActingPath | None = None  # made on first use (acting_path)

    def _shared_body(self, obs_space, features: int) -> None:
        self.hwc = image_layout(obs_space.shape) == "hwc"
        c, h, w = obs_space.shape if not self.hwc else (obs_space.shape[2], *obs_space.shape[:2])
        self.body = Body(NatureCNN(c, h, w, features), make_core(self.core_kind, features, self.core_size))
        out = self.core_size if self.recurrent else features
        self.actor_head = orthogonal(nn.Linear(out, self.dist.n_params), 0.01)
        self.critic_head = orthogonal(nn.Linear(out, 1), 1.0)

    def _input_size(self, obs_space, cnn_features: int, normalize: bool) -> tuple[int, bool]:
        """The MLP bodies' input size for ``obs_space``, and whether a ``RunningNorm``
        of that size normalises it (``MultiInputActorCritic``: its encoder's)."""
        self.one_hot = isinstance(obs_space, spaces.Discrete)
        if self.one_hot:
            self.obs_start = int(obs_space.start)
        return flat_obs_dim(obs_space), normalize and not self.one_hot

    def _separate_bodies(self, hidden, critic_hidden, activation: str, ortho: bool) -> None:
        sizes = [self.obs_dim, *[int(h) for h in hidden]]
        critic_sizes = sizes if critic_hidden is None else [self.obs_dim, *[int(h) for h in critic_hidden]]
        for side, sz, out, gain in (("actor", sizes, self.dist.n_params, 0.01), ("critic", critic_sizes, 1, 1.0)):
            core = make_core(self.core_kind, sz[-1], self.core_size)
            setattr(self, f"{side}_body", Body(mlp_encoder(sz, activation, ortho), core))
            head = nn.Linear(self.core_size if self.recurrent else sz[-1], out)
            setattr(self, f"{side}_head", orthogonal(head, gain) if ortho else head)

    def _bodies(self) -> list[Body]:
        return [self.body] if self.image else [self.actor_body, self.critic_body]

    def stack(self, side: str) -> list[nn.Module]:
        """An MLP side's modules in the order they compute (``side``: actor or critic):
        its encoder's layers and activations, then its head (the core is the identity).
        What the numpy paths (acting, the learner) take apart."""
        body = getattr(self, f"{side}_body")
        return [*body.encoder, getattr(self, f"{side}_head")]

    # -------------------------------------------------------------- preprocessing
    def preprocess(self, obs: torch.Tensor) -> torch.Tensor:
        """Raw batched observations ``[B, *obs_shape]`` -> float network input."""
        if self.image:
            x = obs
            if self.hwc:
                x = x.permute(0, 3, 1, 2)
            return x.float().mul_(1.0 / 255.0) if x.dtype == torch.uint8 else x.float()
        return vector_input(obs, self.obs_dim, self.obs_start if self.one_hot else None, self.obs_norm)

    def update_obs_norm(self, obs: torch.Tensor, ranks: Ranks = SOLO) -> None:
        if self.obs_norm is not None:
            self.obs_norm.update(obs.reshape(-1, self.obs_dim), ranks)

    # -------------------------------------------------------------- forward pieces
    def features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's and the critic's features of the network input ``x`` (one tensor
        twice where the body is shared)."""
        if self.image:
            h = self.body(x)
            return h, h
        return self.actor_body(x), self.critic_body(x)

    def actor_params(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.preprocess(obs)
        return self.actor_head(self.body(x) if self.image else self.actor_body(x))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.preprocess(obs)
        return self.critic_head(self.body(x) if self.image else self.critic_body(x)).squeeze(-1)

    def params_and_value(self, obs):
        """The distribution's parameters and the values of ``obs``: a batch of
        observations, or ``Sequences`` (a recurrent policy's; flat, step-major)."""
        if isinstance(obs, Sequences):
            params, v, _left = self.sequence_pass(obs)
            return (params, v) if obs.keep is None else (params[obs.keep], v[obs.keep])
        fa, fc = self.features(self.preprocess(obs))
        return self.actor_head(fa), self.critic_head(fc).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor, need_entropy: bool = True):
        params, v = self.params_and_value(obs)
        logp, ent = self.dist.log_prob_entropy(params, actions, need_entropy)
        return logp, ent, v

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.dist.log_prob(self.actor_params(obs), actions)

    # -------------------------------------------------------------- memory
    def sequence_pass(self, seq: Sequences, need=()):
        """A recurrent policy over ``seq``: (parameters ``[L B, P]``, values ``[L B]``,
        ``{t: the states its cores left after step t}`` for ``t`` in ``need``, rows of
        ``state_size``)."""
        L, B = seq.starts.shape
        x = self.preprocess(seq.obs.flatten(0, 1))
        if self.image:
            y, left = self.body.core.sequence(self.body.encoder(x).view(L, B, -1), seq.state, seq.starts, need)
            y = y.reshape(L * B, -1)
            return self.actor_head(y), self.critic_head(y).squeeze(-1), left
        k = self.acting_state
        (ya, la), (yc, lc) = (
            body.core.sequence(body.encoder(x).view(L, B, -1), state, seq.starts, need)
            for body, state in ((self.actor_body, seq.state[:, :k]), (self.critic_body, seq.state[:, k:]))
        )
        params = self.actor_head(ya.reshape(L * B, -1))
        left = {t: torch.cat([la[t], lc[t]], 1) for t in need}
        return params, self.critic_head(yc.reshape(L * B, -1)).squeeze(-1), left

    def value_fed(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """A recurrent policy's values of ``obs`` fed with ``state`` (rows of
        ``state_size``): a truncated episode's final observation, bootstrapped."""
        x = self.preprocess(obs)
        body = self.body if self.image else self.critic_body
        y, _ = body.core.step(body.encoder(x), state if self.image else state[:, self.acting_state :])
        return self.critic_head(y).squeeze(-1)

    def act_recurrent(
        self,
        obs,
        state,
        state_out,
        noise,
        act_out,
        *,
        raw_out=None,
        logp_out=None,
        deterministic: bool = False,
        mask=None,
    ):
        """One acting step of a recurrent policy (under ``torch.inference_mode()``): the
        actor's core fed ``state`` (rows of ``state_size``) writes the state it leaves
        into ``state_out``'s actor columns; actions into ``act_out`` as ``act_`` (among
        those ``mask`` allows), their log-probs into ``logp_out`` where given."""
        x = self.preprocess(obs)
        body, k = (self.body if self.image else self.actor_body), self.acting_state
        y, left = body.core.step(body.encoder(x), state[:, :k])
        state_out[:, :k].copy_(left)
        params = self.actor_head(y)
        raw = self.dist.act_(params, noise, act_out, raw_out, deterministic, mask)
        if logp_out is not None:
            logp_out.copy_(self.dist.log_prob(params, raw, mask=mask))

    def _apply(self, fn, *args, **kwargs):
        self._acting = None  # parameters may be replaced (.to(device), ...)
        return super()._apply(fn, *args, **kwargs)

    def acting_path(self) -> ActingPath:
        """The MLP actor's acting forward (``fastvec.train.model.acting``), made again when the
        weights' storage moved (``flatten_parameters``, ``.to``). Not for image policies."""
        path = self._acting
        if path is None or not path.current():
            path = self._acting = build_acting_path(
                self.stack("actor"),
                self.dist,
                gaussian=isinstance(self.dist, GaussianDist),
                obs_dim=self.obs_dim,
                one_hot_start=self.obs_start if self.one_hot else None,
                obs_norm=self.obs_norm,
            )
        return path

    def actor_params_fast(self, obs: torch.Tensor) -> torch.Tensor:
        """``actor_params`` without module dispatch for MLPs (the same numbers)."""
        return self.actor_params(obs) if self.image else self.acting_path().params(obs)

    def act_(
        self,
        obs,
        noise,
        act_out,
        raw_out=None,
        logp_out=None,
        value_out=None,
        *,
        deterministic: bool = False,
        mask=None,
    ):
        """One acting step (call under ``torch.inference_mode()``). Writes actions into
        ``act_out`` (among those ``mask``, ``[B, actions]`` bool, allows; None: all); for a
        shared body also the log-prob and value into ``logp_out`` / ``value_out`` when given."""
        if not self.image:
            self.acting_path().act(obs, noise, act_out, raw_out, deterministic, mask)
            return
        if logp_out is None and value_out is None:
            self.dist.act_(self.actor_params(obs), noise, act_out, raw_out, deterministic, mask)
            return
        params, v = self.params_and_value(obs)
        raw = self.dist.act_(params, noise, act_out, raw_out, deterministic, mask)
        if value_out is not None:
            value_out.copy_(v)
        if logp_out is not None:
            logp_out.copy_(self.dist.log_prob(params, raw, mask=mask))

    def predict(
        self,
        obs: np.ndarray,
        deterministic: bool = True,
        state: torch.Tensor | None = None,
        mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Convenience for evaluation: batched numpy observations -> numpy actions. A
        recurrent policy needs ``state`` (``[n, state_size]``, zeros at an episode's
        start), which it advances in place. ``mask``: the actions each env allows
        (``[n, actions]``, booleans or 0/1; ``fastvec.action_masks``), which a policy
        trained with masks needs."""
        if self.recurrent and state is None:
            raise ValueError("a recurrent policy predicts with its state: pass state=torch.zeros(n, policy.state_size)")
        with torch.inference_mode():
            dev = next(self.parameters()).device
            o = torch.as_tensor(np.asarray(obs), device=dev)
            return self._predict(o, o.shape[0], deterministic, state, mask)

    def _predict(self, o, n: int, deterministic: bool, state, mask) -> np.ndarray:
        """``predict`` of the network input ``o`` (a batch of ``n``, on the policy's device)."""
        dev = next(self.parameters()).device
        m = self._predict_mask(mask, n, dev)
        out = torch.empty(
            (n, *self.dist.action_shape),
            dtype=self.dist.raw_action_dtype or torch.int64,
            device=dev,
        )
        noise = self.dist.sample_noise(torch.empty(self.dist.noise_shape(n), device=dev))
        if self.recurrent:
            self.act_recurrent(o, state, state, noise, out, deterministic=deterministic, mask=m)
        else:
            self.dist.act_(self.actor_params(o), noise, out, None, deterministic, m)
        return out.cpu().numpy()

    def _predict_mask(self, mask, n: int, dev) -> torch.Tensor | None:
        """``predict``'s mask as ``[n, actions]`` bool on ``dev``; ValueError on bad input."""
        if mask is None:
            if self.masked:
                raise ValueError("this policy was trained with action masks: pass predict(obs, mask=...)")
            return None
        size = getattr(self.dist, "mask_size", None)
        arr = np.asarray(mask)
        if size is None:
            raise ValueError("action masks need a Discrete or MultiDiscrete action space")
        if arr.shape != (n, size) or not (arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"mask must be booleans of shape ({n}, {size}), got {arr.dtype} {arr.shape}")
        m = torch.as_tensor(arr.astype(bool), device=dev)
        ok = self.dist.valid(m).any(-1).all(-1)
        if not bool(ok.all()):
            raise ValueError(f"the mask allows no action for env {int((~ok).nonzero()[0, 0])}")
        return m


class MultiInputActorCritic(ActorCritic):
    """An ``ActorCritic`` over a Dict or Tuple observation (nested too): a
    ``MultiInputEncoder`` (``fastvec.train.model.observations``: an encoder per leaf, their
    features concatenated, shared by the actor and the critic) before the two MLP bodies.
    Its observations are ``Leaves``; ``predict`` takes them as gymnasium's vector envs
    give them (nested dicts / tuples of batched arrays). Acts through the modules (no
    ``ActingPath``), and trains with autograd (not the numpy learner)."""

    def _input_size(self, obs_space, cnn_features: int, normalize: bool) -> tuple[int, bool]:
        leaves = input_leaves(obs_space)
        assert leaves is not None
        self.kind, self.one_hot = "multi", False
        self.extractor = MultiInputEncoder(leaves, cnn_features, normalize)
        self.obs_norm = self.extractor if len(self.extractor.norms) else None
        return self.extractor.features, False

    def preprocess(self, obs: Leaves) -> torch.Tensor:  # type: ignore[override]
        return self.extractor(obs)

    def update_obs_norm(self, obs: Leaves, ranks: Ranks = SOLO) -> None:  # type: ignore[override]
        self.extractor.update(obs, ranks)

    def acting_path(self) -> ActingPath:
        raise ValueError("a Dict/Tuple-observation policy acts through its modules (it has no ActingPath)")

    def actor_params_fast(self, obs) -> torch.Tensor:
        return self.actor_params(obs)

    def act_(
        self,
        obs,
        noise,
        act_out,
        raw_out=None,
        logp_out=None,
        value_out=None,
        *,
        deterministic: bool = False,
        mask=None,
    ):
        self.dist.act_(self.actor_params(obs), noise, act_out, raw_out, deterministic, mask)

    def predict(
        self,
        obs,
        deterministic: bool = True,
        state: torch.Tensor | None = None,
        mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """``ActorCritic.predict`` of a batch of composite observations: as gymnasium's
        vector envs give them (nested dicts / tuples of batched arrays), or ``Leaves``."""
        if self.recurrent and state is None:
            raise ValueError("a recurrent policy predicts with its state: pass state=torch.zeros(n, policy.state_size)")
        with torch.inference_mode():
            dev = next(self.parameters()).device
            o = obs if isinstance(obs, Leaves) else batch_leaves(self.obs_space, obs)
            o = o.map(lambda x: torch.as_tensor(x, device=dev))
            return self._predict(o, o.leaves[0].shape[0], deterministic, state, mask)


def make_policy(
    obs_space,
    act_space,
    *,
    hidden=(64, 64),
    critic_hidden=None,
    activation="tanh",
    ortho_init=True,
    log_std_init=0.0,
    normalize_obs=False,
    core="none",
    core_size=128,
    action_masks=False,
) -> ActorCritic:
    """The policy for these spaces (see the module docstring for the rules): a
    ``MultiInputActorCritic`` for a Dict or Tuple observation."""
    kind = MultiInputActorCritic if isinstance(obs_space, (spaces.Dict, spaces.Tuple)) else ActorCritic
    return kind(
        obs_space,
        act_space,
        hidden=hidden,
        critic_hidden=critic_hidden,
        activation=activation,
        ortho_init=ortho_init,
        log_std_init=log_std_init,
        normalize_obs=normalize_obs,
        core=core,
        core_size=core_size,
        action_masks=action_masks,
    )


def describe_policy(policy: ActorCritic) -> str:
    dist = {GaussianDist: "gaussian", ProductDist: "product"}.get(type(policy.dist), "categorical")
    n = sum(p.numel() for p in policy.parameters())
    core = f"+{policy.core_kind}" if policy.recurrent else ""
    masked = "+masked" if policy.masked else ""
    return f"{policy.kind}{core}+{dist}{masked} ({n} parameters)"
