"""Actor-critic policies for the PPO trainer, chosen from the spaces.

- Observations: a flat MLP for vector observations (any non-image ``Box``, ``Discrete``
  one-hot, ``MultiBinary``/``MultiDiscrete`` as numbers); a Nature-style CNN for images
  (a ``uint8`` ``Box`` of shape ``[C, H, W]``, e.g. 4 stacked 84x84 Atari frames).
- Actions: a categorical head for ``Discrete``, ``MultiDiscrete`` (one categorical per
  component) and ``MultiBinary`` (two-way categoricals); a diagonal Gaussian with a
  state-independent log std for ``Box``.

The MLP uses separate actor and critic networks (as SB3's default ``MlpPolicy``), of
the sizes ``hidden`` (both) or ``hidden`` and ``critic_hidden``; the CNN shares its
trunk and has two linear heads (as SB3's ``CnnPolicy`` and CleanRL).

Acting is designed for the trainer's hot loop: ``act_`` samples with noise drawn for a
whole rollout at once (Gumbel-max for categoricals, ``mean + std * eps`` for Gaussians)
and writes the actions straight into the caller's tensors (the engine's shared action
buffers), with no per-step allocation beyond torch's intermediates; an MLP acts through
its ``ActingPath`` (``fastvec.train.acting``: functional, or numpy on the CPU). With separate
networks only the actor runs per step (``values_at_act`` is False): the trainer
computes values and log-probabilities for the whole rollout in one batch afterwards,
which is exact because the policy does not change during a rollout. With a shared
trunk (CNN) the value and log-probability come from the same forward pass and are
stored per step.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
from gymnasium import spaces

from .acting import ActingPath, build_acting_path, vector_input

__all__ = ["ActorCritic", "make_policy", "is_image_space", "describe_policy"]

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU, "silu": nn.SiLU}


def is_image_space(space: spaces.Space) -> bool:
    """A ``uint8`` Box of rank 3 (``[C, H, W]`` or ``[H, W, C]``), large enough for the
    Nature CNN (at least 36x36)."""
    if not isinstance(space, spaces.Box) or space.dtype != np.uint8 or len(space.shape) != 3:
        return False
    return _image_layout(space.shape) is not None


def _image_layout(shape):
    """'chw' or 'hwc' (channels first preferred), or None if not an image."""
    c, h, w = shape
    if c <= 16 and h >= 36 and w >= 36:
        return "chw"
    h, w, c = shape
    if c <= 16 and h >= 36 and w >= 36:
        return "hwc"
    return None


def _flat_obs_dim(space: spaces.Space) -> int:
    if isinstance(space, spaces.Box):
        return int(np.prod(space.shape, dtype=np.int64))
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return int(space.nvec.size)
    if isinstance(space, spaces.MultiBinary):
        return int(np.prod(np.atleast_1d(space.shape)))
    raise ValueError(
        f"the PPO trainer does not support {type(space).__name__} observations; "
        "use a Box, Discrete, MultiDiscrete or MultiBinary observation space "
        "(flatten Dict/Tuple observations with gymnasium.wrappers.FlattenObservation)"
    )


def _ortho(layer: nn.Module, gain: float) -> nn.Module:
    if isinstance(layer, (nn.Linear, nn.Conv2d)):
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return layer


class RunningNorm(nn.Module):
    """Running mean / variance of observations (Welford over batches, float64), applied
    as ``clip((x - mean) / sqrt(var + eps), -clip, clip)``. Part of the state dict, so a
    checkpoint normalises like the trained policy did."""

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.clip, self.eps = float(clip), float(eps)
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.register_buffer("_shift", torch.zeros(dim))
        self.register_buffer("_scale", torch.ones(dim))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, self.mean.numel()).to(torch.float64)
        n = x.shape[0]
        if n == 0:
            return
        b_mean, b_var = x.mean(0), x.var(0, unbiased=False)
        delta = b_mean - self.mean
        tot = self.count + n
        new_mean = self.mean + delta * n / tot
        m2 = self.var * self.count + b_var * n + delta.square() * self.count * n / tot
        self.mean.copy_(new_mean)
        self.var.copy_(m2 / tot)
        self.count.fill_(float(tot))
        self._shift.copy_(self.mean.float())
        self._scale.copy_((self.var + self.eps).rsqrt().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self._shift) * self._scale).clamp_(-self.clip, self.clip)


class NatureCNN(nn.Module):
    """Mnih et al. (2015): conv 32x8x8/4, 64x4x4/2, 64x3x3/1, linear 512, ReLU."""

    def __init__(self, in_channels: int, height: int, width: int, features: int = 512):
        super().__init__()
        self.convs = nn.Sequential(
            _ortho(nn.Conv2d(in_channels, 32, 8, stride=4), math.sqrt(2)),
            nn.ReLU(),
            _ortho(nn.Conv2d(32, 64, 4, stride=2), math.sqrt(2)),
            nn.ReLU(),
            _ortho(nn.Conv2d(64, 64, 3, stride=1), math.sqrt(2)),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            n = self.convs(torch.zeros(1, in_channels, height, width)).shape[1]
        self.fc = nn.Sequential(_ortho(nn.Linear(n, features), math.sqrt(2)), nn.ReLU())
        self.features = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(x))


def _mlp(sizes, activation, out_dim, out_gain, ortho: bool) -> nn.Sequential:
    layers = []
    act = ACTIVATIONS[activation]
    for a, b in zip(sizes[:-1], sizes[1:]):
        lin = nn.Linear(a, b)
        layers += [_ortho(lin, math.sqrt(2)) if ortho else lin, act()]
    head = nn.Linear(sizes[-1], out_dim)
    layers.append(_ortho(head, out_gain) if ortho else head)
    return nn.Sequential(*layers)


# ---------------------------------------------------------------------- distributions
class CategoricalDist(nn.Module):
    """Independent categoricals over ``k`` components with ``nvec`` choices each,
    laid out as ``[B, k, max_n]`` logits; missing choices are masked to -inf.
    ``Discrete`` is ``k = 1`` (actions of shape ``[B]``); ``MultiBinary`` is
    ``nvec = 2``."""

    def __init__(self, nvec, start=None, action_shape=(), squeeze=True):
        super().__init__()
        nvec = np.asarray(nvec, dtype=np.int64).reshape(-1)
        self.k, self.max_n = int(nvec.size), int(nvec.max())
        self.n_params = self.k * self.max_n
        self.action_shape = tuple(action_shape)
        self.squeeze = squeeze
        mask = np.arange(self.max_n)[None, :] >= nvec[:, None]  # True where invalid
        self.has_mask = bool(mask.any())
        self.register_buffer("invalid", torch.as_tensor(mask))
        self.register_buffer("neg_inf", torch.as_tensor(np.where(mask, -np.inf, 0.0), dtype=torch.float32))
        start = np.zeros(self.k, np.int64) if start is None else np.asarray(start, np.int64).reshape(-1)
        self.has_start = bool(np.any(start != 0))
        self.register_buffer("start", torch.as_tensor(start))
        self.raw_action_dtype = None  # actions are stored in the env's own buffer

    def noise_shape(self, n_envs: int):
        return (n_envs, self.k, self.max_n)

    def sample_noise(self, out: torch.Tensor) -> torch.Tensor:
        """Gumbel noise, in place: -log(Exp(1)) (an exact 0 draw is clamped: +inf noise
        on a masked -inf logit would give NaN)."""
        return out.exponential_().clamp_(min=1e-30).log_().neg_()

    def _logits(self, params: torch.Tensor) -> torch.Tensor:
        logits = params.reshape(params.shape[0], self.k, self.max_n)
        if self.has_mask:
            logits = logits + self.neg_inf
        return logits

    def act_(self, params, noise, act_out, raw_out=None, deterministic=False):
        """Sample (Gumbel-max) into ``act_out`` (shape ``[B, *action_shape]``); returns
        the sampled actions (for ``log_prob``)."""
        logits = self._logits(params)
        if not deterministic:
            logits = logits + noise
        b = logits.shape[0]
        if (
            not self.has_start
            and act_out.dtype == torch.int64
            and act_out.device == logits.device
            and act_out.is_contiguous()
        ):
            out = act_out.view(b, self.k)
            torch.argmax(logits, -1, out=out)
            return out
        idx = logits.argmax(-1)
        if self.has_start:
            idx = idx + self.start
        act_out.copy_(idx.reshape(act_out.shape))
        return idx

    def _index(self, actions: torch.Tensor) -> torch.Tensor:
        a = actions.reshape(actions.shape[0], self.k)
        if a.dtype != torch.int64:
            a = a.long()
        if self.has_start:
            a = a - self.start
        return a

    def log_prob_entropy(self, params, actions, need_entropy=True):
        if self.k == 1 and not self.has_mask and not self.has_start:
            # Discrete: no reshapes (each view is an autograd node in the update).
            logp_all = torch.log_softmax(params, -1)
            a = actions if actions.dtype == torch.int64 else actions.long()
            logp = logp_all.gather(1, a.view(-1, 1)).view(-1)
            if not need_entropy:
                return logp, None
            return logp, -(logp_all.exp() * logp_all).sum(-1)
        logits = self._logits(params)
        logp_all = torch.log_softmax(logits, -1)
        idx = self._index(actions)
        logp = logp_all.gather(-1, idx.unsqueeze(-1)).squeeze(-1).sum(-1)
        if not need_entropy:
            return logp, None
        p = logp_all.exp()
        if self.has_mask:
            logp_all = logp_all.masked_fill(self.invalid, 0.0)
        ent = -(p * logp_all).sum(-1).sum(-1)
        return logp, ent

    def log_prob(self, params, actions):
        return self.log_prob_entropy(params, actions, need_entropy=False)[0]


class GaussianDist(nn.Module):
    """Diagonal Gaussian with a learned, state-independent log std. The sampled
    (unclipped) action is kept for the log-probability; the env gets it clipped to the
    Box bounds (as SB3 does)."""

    def __init__(self, space: spaces.Box, log_std_init: float = 0.0):
        super().__init__()
        self.action_shape = tuple(space.shape)
        self.dim = int(np.prod(space.shape, dtype=np.int64))
        self.n_params = self.dim
        self.log_std = nn.Parameter(torch.full((self.dim,), float(log_std_init)))
        low = np.broadcast_to(np.asarray(space.low, np.float32), space.shape).reshape(-1)
        high = np.broadcast_to(np.asarray(space.high, np.float32), space.shape).reshape(-1)
        self.register_buffer("low", torch.as_tensor(low.copy()))
        self.register_buffer("high", torch.as_tensor(high.copy()))
        self.bounded = bool(np.isfinite(low).any() or np.isfinite(high).any())
        self.raw_action_dtype = torch.float32

    def noise_shape(self, n_envs: int):
        return (n_envs, self.dim)

    def sample_noise(self, out: torch.Tensor) -> torch.Tensor:
        return out.normal_()

    def act_(self, params, noise, act_out, raw_out=None, deterministic=False):
        """Sample into ``raw_out`` (``[B, dim]``, float32) and write the clipped
        action into ``act_out`` (``[B, *action_shape]``, the env's dtype)."""
        if deterministic:
            raw = params
        elif raw_out is not None:
            raw = torch.addcmul(params, self.log_std.exp(), noise, out=raw_out)
        else:
            raw = torch.addcmul(params, self.log_std.exp(), noise)
        flat_out = act_out.reshape(act_out.shape[0], self.dim)
        if self.bounded:
            if flat_out.dtype == torch.float32 and flat_out.device == raw.device and flat_out.is_contiguous():
                torch.clamp(raw, self.low, self.high, out=flat_out)
            else:
                flat_out.copy_(torch.clamp(raw, self.low, self.high))
        else:
            flat_out.copy_(raw)
        return raw

    def log_prob_entropy(self, params, raw_actions, need_entropy=True):
        log_std = self.log_std
        z = (raw_actions.reshape(params.shape) - params) * torch.exp(-log_std)
        logp = (-0.5 * z.square() - log_std).sum(-1) - 0.5 * math.log(2 * math.pi) * self.dim
        if not need_entropy:
            return logp, None
        ent = (log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum().expand(params.shape[0])
        return logp, ent

    def log_prob(self, params, raw_actions):
        return self.log_prob_entropy(params, raw_actions, need_entropy=False)[0]


def make_dist(act_space: spaces.Space, log_std_init: float = 0.0) -> nn.Module:
    if isinstance(act_space, spaces.Discrete):
        return CategoricalDist([act_space.n], [act_space.start], action_shape=())
    if isinstance(act_space, spaces.MultiDiscrete):
        return CategoricalDist(
            act_space.nvec.reshape(-1), act_space.start.reshape(-1), action_shape=act_space.nvec.shape
        )
    if isinstance(act_space, spaces.MultiBinary):
        shape = tuple(np.atleast_1d(act_space.shape))
        k = int(np.prod(shape))
        return CategoricalDist([2] * k, None, action_shape=shape)
    if isinstance(act_space, spaces.Box):
        if not np.issubdtype(act_space.dtype, np.floating):
            raise ValueError(f"the PPO trainer needs a floating-point Box for continuous actions, got {act_space}")
        return GaussianDist(act_space, log_std_init)
    raise ValueError(
        f"the PPO trainer does not support {type(act_space).__name__} actions; "
        "use Discrete, MultiDiscrete, MultiBinary or Box"
    )


# ---------------------------------------------------------------------- actor-critic
class ActorCritic(nn.Module):
    """Policy and value function for one pair of spaces.

    ``act_(obs, noise, act_out, raw_out, logp_out, value_out)`` samples for one step;
    ``evaluate(obs, actions)`` gives (log_prob, entropy, value) for training;
    ``value(obs)`` and ``log_prob(obs, actions)`` are used on whole rollouts.
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
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.obs_space, self.act_space = obs_space, act_space
        self.dist = make_dist(act_space, log_std_init)
        self.image = is_image_space(obs_space)
        self.kind = "cnn" if self.image else "mlp"
        self.obs_norm = None
        if self.image:
            layout = _image_layout(obs_space.shape)
            self.hwc = layout == "hwc"
            c, h, w = obs_space.shape if not self.hwc else (obs_space.shape[2], *obs_space.shape[:2])
            self.trunk = NatureCNN(c, h, w, cnn_features)
            self.actor_head = _ortho(nn.Linear(cnn_features, self.dist.n_params), 0.01)
            self.critic_head = _ortho(nn.Linear(cnn_features, 1), 1.0)
            self.values_at_act = True
        else:
            self.obs_dim = _flat_obs_dim(obs_space)
            self.one_hot = isinstance(obs_space, spaces.Discrete)
            if self.one_hot:
                self.obs_start = int(obs_space.start)
            sizes = [self.obs_dim, *[int(h) for h in hidden]]
            critic_sizes = sizes if critic_hidden is None else [self.obs_dim, *[int(h) for h in critic_hidden]]
            self.actor = _mlp(sizes, activation, self.dist.n_params, 0.01, ortho_init)
            self.critic = _mlp(critic_sizes, activation, 1, 1.0, ortho_init)
            if normalize_obs and not self.one_hot:
                self.obs_norm = RunningNorm(self.obs_dim)
            self.values_at_act = False
        # Small float-convertible vector observations can be packed with the other
        # per-sample training data (one gather per epoch; see PPO.update).
        self.packable_obs = (
            not self.image and not self.one_hot and isinstance(obs_space, spaces.Box) and self.obs_dim <= 4096
        )
        self._acting: ActingPath | None = None  # made on first use (acting_path)

    # -------------------------------------------------------------- preprocessing
    def preprocess(self, obs: torch.Tensor) -> torch.Tensor:
        """Raw batched observations ``[B, *obs_shape]`` -> float network input."""
        if self.image:
            x = obs
            if self.hwc:
                x = x.permute(0, 3, 1, 2)
            return x.float().mul_(1.0 / 255.0) if x.dtype == torch.uint8 else x.float()
        return vector_input(obs, self.obs_dim, self.obs_start if self.one_hot else None, self.obs_norm)

    def update_obs_norm(self, obs: torch.Tensor) -> None:
        if self.obs_norm is not None:
            self.obs_norm.update(obs.reshape(-1, self.obs_dim))

    # -------------------------------------------------------------- forward pieces
    def actor_params(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.preprocess(obs)
        if self.image:
            return self.actor_head(self.trunk(x))
        return self.actor(x)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.preprocess(obs)
        if self.image:
            return self.critic_head(self.trunk(x)).squeeze(-1)
        return self.critic(x).squeeze(-1)

    def params_and_value(self, obs: torch.Tensor):
        x = self.preprocess(obs)
        if self.image:
            h = self.trunk(x)
            return self.actor_head(h), self.critic_head(h).squeeze(-1)
        return self.actor(x), self.critic(x).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor, need_entropy: bool = True):
        params, v = self.params_and_value(obs)
        logp, ent = self.dist.log_prob_entropy(params, actions, need_entropy)
        return logp, ent, v

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.dist.log_prob(self.actor_params(obs), actions)

    def _apply(self, fn, *args, **kwargs):
        self._acting = None  # parameters may be replaced (.to(device), ...)
        return super()._apply(fn, *args, **kwargs)

    def acting_path(self) -> ActingPath:
        """The MLP actor's acting forward (``fastvec.train.acting``), made again when the
        weights' storage moved (``flatten_parameters``, ``.to``). Not for image policies."""
        path = self._acting
        if path is None or not path.current():
            path = self._acting = build_acting_path(
                self.actor,
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

    def act_(self, obs, noise, act_out, raw_out=None, logp_out=None, value_out=None, deterministic: bool = False):
        """One acting step (call under ``torch.inference_mode()``). Writes actions into
        ``act_out``; for a shared trunk also the log-prob and value into ``logp_out`` /
        ``value_out`` when given."""
        if not self.image:
            self.acting_path().act(obs, noise, act_out, raw_out, deterministic)
            return
        if logp_out is None and value_out is None:
            self.dist.act_(self.actor_params(obs), noise, act_out, raw_out, deterministic)
            return
        params, v = self.params_and_value(obs)
        raw = self.dist.act_(params, noise, act_out, raw_out, deterministic)
        if value_out is not None:
            value_out.copy_(v)
        if logp_out is not None:
            logp_out.copy_(self.dist.log_prob(params, raw))

    def predict(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        """Convenience for evaluation: batched numpy observations -> numpy actions."""
        with torch.inference_mode():
            dev = next(self.parameters()).device
            o = torch.as_tensor(np.asarray(obs), device=dev)
            n = o.shape[0]
            out = torch.empty(
                (n, *self.dist.action_shape),
                dtype=torch.float32 if isinstance(self.dist, GaussianDist) else torch.int64,
                device=dev,
            )
            noise = self.dist.sample_noise(torch.empty(self.dist.noise_shape(n), device=dev))
            self.dist.act_(self.actor_params(o), noise, out, None, deterministic)
            return out.cpu().numpy()


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
) -> ActorCritic:
    """The policy for these spaces (see the module docstring for the rules)."""
    return ActorCritic(
        obs_space,
        act_space,
        hidden=hidden,
        critic_hidden=critic_hidden,
        activation=activation,
        ortho_init=ortho_init,
        log_std_init=log_std_init,
        normalize_obs=normalize_obs,
    )


def describe_policy(policy: ActorCritic) -> str:
    dist = "gaussian" if isinstance(policy.dist, GaussianDist) else "categorical"
    n = sum(p.numel() for p in policy.parameters())
    return f"{policy.kind}+{dist} ({n} parameters)"
