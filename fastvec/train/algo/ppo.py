"""``PPO``: the trainer's state, made of its pieces.

A policy (``fastvec.train.model.actor_critic``) over a rollout of the storage
(``fastvec.train.storage.rollout``), and the three steps of an iteration, each a piece of its own:

- ``collect`` (``fastvec.train.algo.collect.Collector``): the policy acts into the storage for
  T steps;
- ``prepare`` (``fastvec.train.algo.targets.Targets``): values, old log-probs, truncation
  bootstraps, then GAE or V-trace;
- ``update`` (``fastvec.train.algo.update.Updater``): the epochs of minibatch PPO, the
  optimiser and the learning rate's schedule.

``PPO`` keeps what spans them: the episode statistics and the learning curve, the env
step count, the train state a checkpoint holds. Its counters are its pieces' (``updates``
is the updater's, ``t_act`` the collector's, ...), read and written through it.
"""

from __future__ import annotations

import torch

from ..compute.busy import DeviceBusy
from ..compute.ranks import SOLO, Ranks
from ..compute.torch_state import Threads, rng_state, set_rng_state
from ..config.seeding import OFFSET, SPAWNED, check_scheme
from ..config.settings import PPOConfig
from ..model.actor_critic import ActorCritic, is_image_space, make_policy
from ..storage.rollout import Rollout
from .collect import Collector
from .optim import flatten_parameters
from .statistics import EpisodeTracker, RewardScaler, thin
from .targets import Targets
from .update import Updater

__all__ = ["PPO"]


class _Of:
    """An attribute of one of ``PPO``'s pieces, read and written through ``PPO``."""

    def __init__(self, piece: str):
        self.piece = piece

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(getattr(obj, self.piece), self.name)

    def __set__(self, obj, value) -> None:
        setattr(getattr(obj, self.piece), self.name, value)


class PPO:
    """The trainer's state: storage, policy, rollout, statistics and the pieces;
    ``collect`` runs a rollout, ``prepare`` computes its targets, ``update`` learns from it.

    ``separate_buffers``: the learner's tensors are buffers of their own, filled by
    copies from the storage's (``Rollout.copies``); None: exactly when ``device`` is not
    the CPU. True on the CPU runs the GPU's copy path without one (the tests do)."""

    # the pieces' counters and settings
    t_act = _Of("collector")
    t_env = _Of("collector")
    last_act_latency = _Of("collector")
    last_env_latency = _Of("collector")
    between_steps = _Of("collector")
    t_prep = _Of("targets")
    adv_weights = _Of("targets")
    opt = _Of("updater")
    np_learner = _Of("updater")
    lr_schedule = _Of("updater")
    num_updates = _Of("updater")
    updates = _Of("updater")
    grad_steps = _Of("updater")
    learn_samples = _Of("updater")
    t_learn = _Of("updater")
    last_stats = _Of("updater")

    def __init__(
        self,
        cfg: PPOConfig,
        storage,
        device: torch.device,
        policy: ActorCritic | None = None,
        *,
        separate_buffers: bool | None = None,
        ranks: Ranks = SOLO,
    ):
        self.cfg, self.storage, self.device, self.ranks = cfg, storage, device, ranks
        obs_space, act_space = storage.single_observation_space, storage.single_action_space
        self.threads = Threads(cfg, is_image_space(obs_space), storage.num_workers or 0)
        # Threads first: results (even the initial weights) depend on the thread count.
        self.threads.use(self.threads.learn)
        self.policy = policy or make_policy(
            obs_space,
            act_space,
            hidden=cfg.hidden,
            critic_hidden=cfg.critic_hidden,
            activation=cfg.activation,
            ortho_init=cfg.ortho_init,
            log_std_init=cfg.log_std_init,
            normalize_obs=cfg.normalize_obs,
            core=cfg.policy_core,
            core_size=cfg.core_size,
            action_masks=cfg.action_mask != "none",
        )
        self.policy.to(device)
        self.flat_param, self.flat_grad = flatten_parameters(self.policy)
        if not ranks.solo:  # the replicas start equal (seeded alike; this makes sure)
            ranks.sum_(self.flat_param.data.mul_(float(ranks.rank == 0)))
        self.T, self.N = cfg.n_steps, storage.num_envs
        busy = self._busy = DeviceBusy(device)
        self.updater = Updater(
            cfg,
            self.policy,
            self.flat_param,
            self.flat_grad,
            self.T * self.N,
            busy=busy,
            threads=self.threads,
            ranks=ranks,
        )
        self.rollout = Rollout(storage, self.policy, self.T, device, copies=separate_buffers)
        self.collector = Collector(self.policy, busy, self.threads, ranks)
        self.tracker = EpisodeTracker(self.N, cfg.return_window)
        self.reward_scaler = RewardScaler(self.N, cfg.gamma) if cfg.normalize_reward else None
        self.targets = Targets(
            cfg, self.policy, self.flat_param, self.reward_scaler, busy=busy, threads=self.threads, ranks=ranks
        )
        self.env_steps = 0  # the run's (every rank's)
        # how the run seeds its envs (fastvec.train.config.seeding); a resume keeps its checkpoint's
        self.env_seeding = SPAWNED
        self.curve: list[tuple[int, float]] = []

    @property
    def busy(self) -> DeviceBusy:
        """The device's busy time, which every piece records into (one timer, shared)."""
        return self._busy

    @busy.setter
    def busy(self, busy: DeviceBusy) -> None:
        self._busy = self.collector.busy = self.targets.busy = self.updater.busy = busy

    @property
    def act_threads(self) -> int:
        return self.threads.act

    @property
    def learn_threads(self) -> int:
        return self.threads.learn

    # ------------------------------------------------------------------ the steps
    def collect(self) -> None:
        """One rollout of T steps on every env; its episodes into the statistics."""
        self.collector.run(self.rollout)
        self.count_rollout()

    def count_rollout(self) -> None:
        """A rollout collected into the storage (by ``collect``, or by a population for
        all its members at once): its steps counted, its episodes into the statistics."""
        self.env_steps += self.T * self.N * self.ranks.world
        b, tr = self.storage, self.tracker
        n_before = tr.episodes
        active = getattr(b, "active", None)  # (agents: the rows that acted at each step)
        tr.update(b.rewards[1:], b.terminated[1:], b.truncated[1:], None if active is None else active[:-1])
        if tr.episodes != n_before:  # for the learning-curve PNG
            self.curve.append((self.env_steps, tr.mean()))
            thin(self.curve)  # bounded, however long the run

    def prepare(self, acted_by=None) -> None:
        """The rollout's targets (``fastvec.train.algo.targets.Targets.compute``); ``acted_by``:
        None where the current weights acted it, else ``(versions, weights)``."""
        self.targets.compute(self.rollout, self.updates, acted_by)

    def update(self) -> None:
        """``n_epochs`` passes of minibatch PPO over the rollout (``fastvec.train.algo.update``)."""
        self.updater.run(self.rollout, self.adv_weights)

    def summarize(self) -> dict:
        """Losses etc. of the last update (reads tensors: call at logging time only)."""
        return self.updater.summary(self.rollout)

    def use_rollout(self, storage, rollout: Rollout) -> None:
        """Act into, or learn from, another rollout of the same shapes (the async pipeline
        keeps K of them in the engine's ring)."""
        self.storage, self.rollout = storage, rollout

    # ------------------------------------------------------------------ resuming
    def train_state(self, rng: dict | None = None) -> dict:
        """Everything besides the weights (and the config) that a resumed run needs to
        continue exactly: optimiser, the adaptive learning rate, counters (the linear
        schedules follow ``updates``), episode statistics, reward normaliser, time
        counters, the learning curve and the RNG states (``rng``: a ``rng_state()`` taken
        earlier, default now). The observation normaliser is part of the policy's state dict."""
        return {
            "optimizer": self.opt.state_dict(),
            "lr_schedule": self.lr_schedule.state(),
            "env_steps": self.env_steps,
            "updates": self.updates,
            "grad_steps": self.grad_steps,
            "learn_samples": self.learn_samples,
            "tracker": self.tracker.state(),
            "reward_scaler": None if self.reward_scaler is None else self.reward_scaler.state(),
            "times": {"act": self.t_act, "env": self.t_env, "prepare": self.t_prep, "learn": self.t_learn},
            "curve": list(self.curve),
            "rng": rng if rng is not None else rng_state(),
            "env_seeding": self.env_seeding,
        }

    def load_train_state(self, state: dict) -> None:
        """Continue from ``train_state()`` (weights already loaded into the policy); the
        envs must be reset afterwards (``restart_envs``)."""
        self.opt.load_state_dict(state["optimizer"])
        self.lr_schedule.load(state.get("lr_schedule"))  # absent before the schedules had a state
        self.env_steps, self.updates = int(state["env_steps"]), int(state["updates"])
        self.grad_steps, self.learn_samples = int(state["grad_steps"]), int(state["learn_samples"])
        self.tracker.load(state["tracker"])
        if (state["reward_scaler"] is None) != (self.reward_scaler is None):
            raise ValueError("the checkpoint's normalize_reward differs from the config's")
        if self.reward_scaler is not None:
            self.reward_scaler.load(state["reward_scaler"])
        t = state["times"]
        self.t_act, self.t_env, self.t_prep, self.t_learn = t["act"], t["env"], t["prepare"], t["learn"]
        self.curve = [tuple(p) for p in state["curve"]]
        set_rng_state(state["rng"])
        # a checkpoint that names no env seeding was written before the schemes had names
        self.env_seeding = check_scheme(state.get("env_seeding", OFFSET))

    def restart_envs(self, seed) -> None:
        """Reset every env into slot 0 of a new rollout (``seed``: one seed per env, or an
        int for ``seed + i``): the episodes in progress are dropped from the statistics
        and the reward normaliser's running returns start again."""
        self.storage.reset(seed)
        self.collector.last = None  # a recurrent policy's states start from zero
        self.tracker.restart_envs()
        if self.reward_scaler is not None:
            self.reward_scaler.acc[:] = 0.0
