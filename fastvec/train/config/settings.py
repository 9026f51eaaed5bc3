"""The trainer's configuration: ``PPOConfig`` and its ``TransportConfig``.

``PPOConfig`` holds the hyperparameters and the run's settings; how the envs run and
talk to the trainer (the engine's workers, start method, spins, batch groups,
placement, what a failing worker costs) is a ``TransportConfig`` of its own,
``PPOConfig.transport``: nothing of it changes what is learned (batch groups only up to
floating-point rounding), so a resumed run may change all of it. Its keys stay one
namespace with the rest for ``--set`` (``fastvec.train.config.overrides``), ``to_dict()`` (flat:
checkpoints read and write as before the split) and ``PPOConfig(context=...)``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import multiprocessing as mp
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from .rules import (
    ACTIVATION_NAMES,
    ConfigError,
    check_core,
    check_pipeline,
    check_schedule,
    check_schedule_pair,
    positive_int,
)

__all__ = [
    "PPOConfig",
    "TransportConfig",
    "TRANSPORT_KEYS",
    "FLAT_KEYS",
    "SET_FIELDS",
    "SIZES",
    "ConfigError",
    "check_schedule_pair",
]


PLACEMENTS = (None, "contiguous", "balanced")


@dataclass
class TransportConfig:
    """How the envs run and talk to the trainer (``--set key=value`` as any other key):
    nothing here changes what is learned."""

    num_workers: int | None = field(default=None, metadata={"listed_after": "num_envs"})
    """Engine worker processes; None: ``min(num_envs, cores)``."""
    context: str = "fork"
    """Start method of the engine's workers (fork starts in milliseconds; see the CLI)."""
    spin_us: float | None = None
    """How long an idle worker busy-waits before sleeping, in microseconds (None: the engine's default)."""
    main_spin_us: float | None = None
    """How long the trainer busy-waits for the workers' step before sleeping, in microseconds
    (None: 0 when the workers fill every core in lock-step, else the engine's learned waits)."""
    env_groups: int = 1
    """Groups of envs stepping in turn: while one group steps in its workers, the policy
    acts on another (1: every env in lock-step). Must divide ``num_envs``; each group gets
    whole workers (``num_workers`` a multiple of it); the engine backend only."""
    placement: str | None = None
    """Which envs each of the engine's workers runs: contiguous (runs in env order) or
    balanced (by cost, probed on throwaway instances at start-up: ``fastvec.Engine``'s
    ``placement``); none: balanced for a mix of envs (``--mix``), contiguous otherwise.
    Env i's trajectory is the same in either; the engine backend, lock-step only."""
    restart_on_error: bool = field(default=True, metadata={"listed_after": "keep_checkpoints"})
    """Replace a worker whose env raised or died and go on (its envs' episodes end truncated)."""
    step_timeout: float | None = field(default=300.0, metadata={"listed_after": "restart_window"})
    """Seconds a worker may take to step or reset its envs before it counts as hung: it is
    replaced like a dead one (``restart_on_error``), else the run ends with an error; none:
    wait forever. Applies to fastvec's own envs (engine and Ray), not to a vector env passed in."""

    def validate(self, num_envs: int) -> TransportConfig:
        positive_int("env_groups", self.env_groups)
        if self.num_workers is not None:
            positive_int("num_workers", self.num_workers)
            if self.num_workers > num_envs:
                raise ConfigError(f"num_workers={self.num_workers} exceeds num_envs={num_envs}")
        v = self.step_timeout
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise ConfigError(f"step_timeout must be a positive number or none, got {v!r}")
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"placement must be contiguous, balanced or none, got {self.placement!r}")
        if self.placement == "balanced" and self.env_groups > 1:
            raise ConfigError(
                f"placement=balanced needs env_groups=1 (got {self.env_groups}): each batch group "
                "steps on whole workers of its own, in env order"
            )
        if num_envs % self.env_groups:
            raise ConfigError(f"env_groups={self.env_groups} must divide num_envs={num_envs}")
        for name in ("spin_us", "main_spin_us"):
            v = getattr(self, name)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not 0 <= v < 1e6
            ):
                raise ConfigError(f"{name} must be in [0, 1e6) microseconds or none, got {v!r}")
        if self.context not in mp.get_all_start_methods():
            raise ConfigError(f"context must be one of {mp.get_all_start_methods()}, got {self.context!r}")
        return self


TRANSPORT_KEYS = tuple(f.name for f in dataclasses.fields(TransportConfig))


T = TypeVar("T")


class _InTransport(Generic[T]):
    """A transport key read and written on the config itself (``cfg.context`` is
    ``cfg.transport.context``)."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None) -> T:
        return getattr(obj.transport, self.name)

    def __set__(self, obj, value: T) -> None:
        setattr(obj.transport, self.name, value)


def _flat_transport_keys(cls):
    """``PPOConfig(context=...)`` as before the transport settings moved into
    ``cfg.transport`` (``cfg.context`` etc. are properties). Each config owns its transport
    (a copy of one given, and in ``copy.copy`` / ``dataclasses.replace``), so setting a
    key on one config never changes another, as with flat fields. ``anneal_lr`` (a
    property over ``lr_schedule`` since the schedules had a name) is accepted too."""
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        flat = {k: kwargs.pop(k) for k in TRANSPORT_KEYS if k in kwargs}
        alias = {k: kwargs.pop(k) for k in ("anneal_lr",) if k in kwargs}
        init(self, *args, **kwargs)
        self.transport = dataclasses.replace(self.transport, **flat)
        if alias:
            if "lr_schedule" in kwargs:
                check_schedule_pair(alias["anneal_lr"], kwargs["lr_schedule"])
            self.anneal_lr = alias["anneal_lr"]

    sig = inspect.signature(init)
    flat_params = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
        for f in dataclasses.fields(TransportConfig)
    ]
    flat_params.append(inspect.Parameter("anneal_lr", inspect.Parameter.KEYWORD_ONLY, default=True, annotation=bool))
    # help() and the docs show the flat keys too; functions take a __signature__ at run time
    __init__.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *flat_params])  # type: ignore[attr-defined]
    __init__.__doc__, __init__.__qualname__ = init.__doc__, init.__qualname__
    cls.__init__ = __init__
    cls.__copy__ = lambda self: dataclasses.replace(self)
    return cls


@_flat_transport_keys
@dataclass
class PPOConfig:
    """Every hyperparameter of the trainer, and the transport settings in ``transport``;
    ``fastvec train --set key=value`` sets any (``fastvec train ENV --list-keys`` lists
    them with the env's preset values)."""

    # ---- environment and rollout
    num_envs: int = 8
    """Envs stepped in parallel."""
    n_steps: int = 128
    """T: steps per env per rollout (the engine's ring holds ``T + 1`` slots)."""
    total_steps: int = 1_000_000
    """Env steps (over all envs) to train for."""
    transport: TransportConfig = field(default_factory=TransportConfig)
    """``num_workers``, ``context``, ``spin_us``, ``main_spin_us``, ``env_groups``,
    ``placement``, ``restart_on_error``, ``step_timeout`` (also readable, settable and
    accepted by the constructor as flat keys)."""
    # ---- optimisation
    lr: float = 3e-4
    """Adam's learning rate (adaptive schedule: the first update's)."""
    lr_schedule: str = "linear"
    """How the learning rate moves: linear (decays to 0 over ``lr_horizon``), constant, or
    adaptive (after each update, divided by ``lr_factor`` when the update's approximate KL
    exceeds 2 x ``lr_kl_target``, multiplied by it when the KL is below half of that, within
    [``lr_min``, ``lr_max``]). ``anneal_lr`` is its older spelling."""
    lr_horizon: int | None = None
    """Env steps over which the linear schedule (and ``anneal_clip``) decays to 0 (None:
    ``total_steps``). Set, a run learns the same whatever its budget: a shorter run is the
    longer run's beginning, step for step."""
    lr_kl_target: float = 0.008
    """The adaptive schedule's target approximate KL per update (rl_games' default)."""
    lr_factor: float = 1.5
    """The adaptive schedule's step: the rate is multiplied or divided by this (> 1)."""
    lr_min: float = 1e-6
    """The adaptive schedule's lowest learning rate."""
    lr_max: float = 1e-2
    """The adaptive schedule's highest learning rate."""
    n_epochs: int = 4
    """Passes over each rollout."""
    minibatch_size: int = 256
    """Samples per gradient step."""
    max_grad_norm: float = 0.5
    """Clip the gradient's global norm to this."""
    adam_eps: float = 1e-5
    """Adam's epsilon."""
    target_kl: float | None = None
    """Stop a rollout's epochs early once the approximate KL exceeds 1.5 x this (None: never)."""
    # ---- the PPO objective
    gamma: float = 0.99
    """Discount."""
    gae_lambda: float = 0.95
    """GAE's lambda."""
    clip_coef: float = 0.2
    """The policy ratio's clipping range."""
    anneal_clip: bool = False
    """Decay ``clip_coef`` linearly as ``lr``."""
    clip_vf: float | None = None
    """Value clipping range (None: no value clipping)."""
    ent_coef: float = 0.0
    """Entropy bonus."""
    vf_coef: float = 0.5
    """Weight of the value loss (which carries a factor 0.5, as CleanRL's)."""
    norm_adv: bool = True
    """Normalise advantages over each rollout."""
    # ---- the policy
    hidden: tuple = (64, 64)
    """Hidden layer sizes of the MLPs (the actor's, and the critic's unless ``critic_hidden``)."""
    critic_hidden: tuple | None = None
    """Hidden layer sizes of the critic's MLP when they differ from the actor's (None: ``hidden``)."""
    activation: str = "tanh"
    """Activation of the MLPs (tanh, relu, elu, gelu, silu)."""
    ortho_init: bool = True
    """Orthogonal initialisation (SB3's and CleanRL's gains)."""
    log_std_init: float = 0.0
    """Initial log standard deviation of Gaussian actions."""
    normalize_obs: bool = False
    """Running mean/std normalisation of observations (inside the policy)."""
    policy_core: str = "none"
    """Memory between the encoder and the heads: none, lstm or gru (``fastvec.train.model.cores``;
    the MLP's actor and critic each get one, the CNN's shared body one)."""
    core_size: int = 128
    """Units of the recurrent core (policy_core lstm or gru)."""
    action_mask: str = "none"
    """Where the env's action masks come from (``fastvec.action_masks``): none, info
    (``info["action_mask"]``), method (the env's ``action_masks()``), dict (the
    ``action_mask`` key of a Dict observation, which the policy then does not see) or auto
    (whichever it gives, settled at the start); masked actions are never sampled."""
    bptt: int | None = None
    """With a recurrent core: the steps of the sequences PPO's epochs replay (truncated
    backpropagation through time), each env's rollout cut into ``n_steps / bptt`` of them,
    each from the state recorded at its start; None: ``n_steps`` (whole rollouts)."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return (as SB3's VecNormalize)."""
    # ---- the pipeline (fastvec.train.pipelines.collector)
    pipeline: str = "lockstep"
    """lockstep (collect a rollout, then learn on it) or async (a learner process learns on
    one rollout while the envs fill the next: see the training guide's "Async pipeline")."""
    max_policy_lag: int = 1
    """async: the most updates the policy acting may be behind the learner's; the collector
    waits rather than run further ahead (0: every rollout acted by the newest policy, the
    lock-step run exactly)."""
    rollout_buffers: int = 2
    """async: K, the rollouts the engine's ring holds (one fills while the learner reads
    another); at least 2; the collector runs at most K - 1 rollouts ahead."""
    targets: str = "gae"
    """async: the advantages and value targets, gae (on the values of the policy that acted),
    vtrace (importance-clipped to the learner's policy; ``fastvec.vtrace``) or auto: gae
    where the learner's own weights acted the whole rollout (so lock-step's), vtrace where
    older weights acted some of it. HalfCheetah-v5's preset takes auto (300k steps, 6
    seeds: gae ended below vtrace on every seed); the short races solve faster with gae."""
    values_of: str = "learner"
    """async: the values GAE (or V-trace) starts from where the weights that acted are older
    than the learner's: learner (the learner's current weights: a critic trained on more
    data; IMPALA's choice) or acting (theirs, as if recorded while acting)."""
    proximal_policy: str = "learner"
    """async: what PPO's clip is centred on where the weights that acted are older than the
    learner's: learner (decoupled PPO, Hilton et al. 2021: the ratio to the learner's weights
    at the update's start is clipped, and each sample is weighted by those weights' importance
    ratio to the ones that acted, capped at ``vtrace_rho_bar``) or acting (the ratio to the
    weights that acted is clipped). Measured on HalfCheetah-v5 (300k steps, 3 seeds), acting
    learned less than lock-step on every seed, learner as well as it."""
    vtrace_rho_bar: float = 1.0
    """The clip on importance weights: in V-trace's TD errors (targets=vtrace) and on the
    samples' weights (proximal_policy=learner)."""
    vtrace_c_bar: float = 1.0
    """targets=vtrace: the clip on the importance weights in the traces."""
    # ---- the run
    seed: int = 0
    """Seeds torch, numpy and the envs: env i's seed is drawn from its own stream
    (``fastvec.train.config.seeding``: ``SeedSequence(seed, spawn_key=(0, i))``)."""
    device: str = "auto"
    """auto, cpu, cuda or cuda:N (auto: cuda when available)."""
    torch_threads: int | None = None
    """Threads while acting; None: 1 for MLPs, all cores for CNNs."""
    learn_threads: int | None = None
    """Threads while learning; None: as ``torch_threads``."""
    learner: str = "auto"
    """The minibatch gradient: numpy (small MLPs on the CPU with one learner thread: less than
    half of autograd's time here), torch (autograd), or auto (numpy where it applies)."""
    stop_at_return: float | None = None
    """Stop once the mean return of the last ``return_window`` episodes reaches this."""
    max_seconds: float | None = None
    """Stop at the first safe point after this many seconds of the run's wall time (counted
    over resumes, as ``wall_seconds``); the schedules do not depend on it: a run stopped by
    time is the beginning of the same run told more time."""
    solve_return: float | None = None
    """The return reported as "solved" (default: the preset's, else the env spec's)."""
    return_window: int = 20
    """Episodes in the mean return."""
    log_every_s: float = 1.0
    """Seconds between logging points."""
    # ---- long runs
    checkpoint_every: int = 100_000
    """Env steps between periodic checkpoints in the run directory (0: only at the end)."""
    keep_checkpoints: int = 3
    """Periodic checkpoints kept (the oldest are deleted)."""
    max_restarts: int = 20
    """More than this many worker restarts within ``restart_window`` env steps ends the run."""
    restart_window: int = 50_000
    """Env steps over which ``max_restarts`` counts."""
    video_every: int = 0
    """Env steps between videos of one deterministic evaluation episode, filmed in a process
    of its own into the run directory's ``videos/`` (``fastvec train --video-every``; 0: none)."""
    video_settings: str = ""
    """Settings for the filmed env only, ``KEY=VALUE,...`` as ``--env-kwargs`` reads them: a
    frame's ``width`` and ``height``, a camera (MuJoCo's ``camera_name``, or
    ``default_camera_config={"type": 2, "trackbodyid": 1}`` to follow a body); and the
    film's own, ``seconds`` of each episode filmed (default 10; 0: all of it) and ``look``
    (default ``draft``: MuJoCo without shadows, reflections and anti-aliasing; ``full``)."""

    # ---- the transport's keys, flat as before the split (not fields: ``transport`` holds them)
    num_workers = _InTransport[int | None]()
    context = _InTransport[str]()
    spin_us = _InTransport[float | None]()
    main_spin_us = _InTransport[float | None]()
    env_groups = _InTransport[int]()
    placement = _InTransport[str | None]()
    restart_on_error = _InTransport[bool]()
    step_timeout = _InTransport[float | None]()

    # ---- lr_schedule's older spelling (a --set key, a constructor keyword, in to_dict)
    @property
    def anneal_lr(self) -> bool:
        """Decay the learning rate linearly to 0 over ``total_steps``: ``lr_schedule`` is
        linear. Setting it true makes the schedule linear; false makes a linear one
        constant and keeps constant or adaptive."""
        return self.lr_schedule == "linear"

    @anneal_lr.setter
    def anneal_lr(self, v: bool) -> None:
        if not isinstance(v, (bool, np.bool_)):
            raise ConfigError(f"anneal_lr must be true or false, got {v!r}")
        if v:
            self.lr_schedule = "linear"
        elif self.lr_schedule == "linear":
            self.lr_schedule = "constant"

    def validate(self) -> PPOConfig:
        for name in (
            "num_envs",
            "n_steps",
            "total_steps",
            "n_epochs",
            "minibatch_size",
            "return_window",
            "keep_checkpoints",
            "max_restarts",
            "restart_window",
        ):
            positive_int(name, getattr(self, name))
        self.transport.validate(self.num_envs)
        for name in ("torch_threads", "learn_threads", "lr_horizon"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
        for name, unit in (
            ("checkpoint_every", " (env steps; 0: only at the end)"),
            ("video_every", " (env steps; 0: no videos)"),
            ("seed", ""),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ConfigError(f"{name} must be a non-negative integer{unit}, got {v!r}")
        for name in ("gamma", "gae_lambda"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {v!r}")
        for name in ("lr", "clip_coef", "max_grad_norm", "adam_eps", "log_every_s"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"{name} must be a positive number, got {v!r}")
        check_schedule(self)
        check_pipeline(self)
        check_core(self)
        for name in ("ent_coef", "vf_coef"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ConfigError(f"{name} must be a non-negative number, got {v!r}")
        for name in ("target_kl", "clip_vf", "max_seconds"):
            v = getattr(self, name)
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"{name} must be a positive number or none, got {v!r}")
        for name in ("hidden", "critic_hidden"):
            v = getattr(self, name)
            if v is None and name == "critic_hidden":
                continue
            if not isinstance(v, (tuple, list)) or not all(
                isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in v
            ):
                raise ConfigError(f"{name} must be positive layer sizes like 64,64, got {v!r}")
        if self.activation not in ACTIVATION_NAMES:
            raise ConfigError(f"activation must be one of {sorted(ACTIVATION_NAMES)}, got {self.activation!r}")
        if self.learner not in ("auto", "numpy", "torch"):
            raise ConfigError(f"learner must be auto, numpy or torch, got {self.learner!r}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"device must be auto, cpu or cuda, got {self.device!r}")
        return self

    def to_dict(self) -> dict:
        """Every ``--set`` key and its value, flat (the transport's keys where they were
        before the split): what a checkpoint keeps as its config."""
        return {k: _listed(getattr(self, k)) if k in SIZES else getattr(self, k) for k in FLAT_KEYS}

    @classmethod
    def from_dict(cls, d: dict) -> PPOConfig:
        """The inverse of ``to_dict`` (a checkpoint's config; a nested ``"transport"``
        dict is read too); ConfigError on keys this version does not know. Keys added
        since the dict was written keep their defaults."""
        d = dict(d)
        nested = d.pop("transport", None) or {}
        unknown = sorted((set(d) - set(FLAT_KEYS)) | (set(nested) - set(TRANSPORT_KEYS)))
        if unknown:
            raise ConfigError(f"unknown config keys {unknown} (written by another fastvec version?)")
        for k in SIZES:
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        return cls(**{**nested, **d})  # a flat key over a nested one: flat is what this version writes


SIZES = ("hidden", "critic_hidden")  # tuples, kept as lists in a checkpoint's config


def _listed(v):
    return None if v is None else list(v)


def _set_fields() -> list[dataclasses.Field]:
    """The fields ``--set`` reaches, in ``PPOConfig``'s order with the transport's inline;
    a transport key that was a key of ``PPOConfig`` once keeps its place there
    (``listed_after``), so that configs list (and checkpoints write) their keys as before."""
    transport = dataclasses.fields(TransportConfig)
    placed = [t for t in transport if "listed_after" in t.metadata]
    out: list[dataclasses.Field] = []
    for f in dataclasses.fields(PPOConfig):
        out.extend([t for t in transport if t not in placed] if f.name == "transport" else [f])
        out.extend(t for t in placed if t.metadata["listed_after"] == f.name)
    return out


SET_FIELDS = _set_fields()
# Every flat key, in order; anneal_lr (a property now) keeps its place before lr_schedule.
FLAT_KEYS = tuple(k for f in SET_FIELDS for k in (("anneal_lr",) if f.name == "lr_schedule" else ()) + (f.name,))
