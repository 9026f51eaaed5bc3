"""PPO itself: acting into the storage, targets (GAE), the clipped update.

Per-step overhead is kept small: acting runs under ``torch.inference_mode()`` with a
functional forward of the actor only (``fastvec.train.acting``; values and old
log-probs of MLP policies are computed for the whole rollout in one batched pass
afterwards), sampling noise is drawn once per rollout, actions are written in place
into the storage's action slot, and episode statistics are computed per rollout,
vectorised over time. On a GPU (or with ``separate_buffers``) each step's observations
are copied to the device before acting and its actions back after it. The update
uses one flat parameter / gradient tensor (one-tensor Adam and gradient clipping) and
permutes the packed per-sample data once per epoch; small MLP policies on the CPU get
each minibatch's gradient from ``fastvec.train.numpy_learner`` instead of autograd.

Truncation is bootstrapped: ``next_values[t] = V(final_obs[t])`` where an episode was
truncated at step ``t`` (terminated steps do not bootstrap), ``V(obs[t + 1])``
elsewhere; advantages come from :func:`fastvec.gae`.

Threads: ``torch_threads`` defaults to 1 for MLP policies (on 2 cores, 2 threads are
no faster for a 64x64 MLP and fight the env workers for the second core) and to all
cores for CNNs (the env workers sleep while the policy runs: acting is synchronous).
"""

from __future__ import annotations

import collections
import contextlib
import math
import time

import numpy as np
import torch
import torch.nn as nn

from ..gae import gae
from ..options import available_cores
from ..vtrace import vtrace
from .busy import DeviceBusy
from .config import ConfigError, PPOConfig
from .lr_schedule import LRSchedule, mean_kl
from .monitor import thin
from .numpy_learner import NumpyLearner
from .policies import ActorCritic, GaussianDist, is_image_space, make_policy
from .rollout import Rollout
from .statistics import EpisodeTracker, RewardScaler

__all__ = ["PPO", "FlatAdam", "flatten_parameters", "resolve_device", "warm_up_torch", "rng_state", "set_rng_state"]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda requested but CUDA is not available")
    return dev


def flatten_parameters(module: nn.Module):
    """Make every trainable parameter of ``module`` (and its gradient) a view into one
    flat tensor; returns ``(flat_param, flat_grad)``. The optimiser then steps one
    tensor and gradient clipping is one norm: for tiny MLPs that is a third of the cost
    of an update step. Autograd accumulates into the existing ``.grad`` views in place;
    zero ``flat_grad`` (never set grads to None) between steps."""
    params = [p for p in module.parameters() if p.requires_grad]
    total = sum(p.numel() for p in params)
    flat = torch.zeros(total, dtype=params[0].dtype, device=params[0].device)
    grad = torch.zeros_like(flat)
    off = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat[off : off + n].copy_(p.reshape(-1))
            p.data = flat[off : off + n].view_as(p)
            p.grad = grad[off : off + n].view_as(p)
            off += n
    flat_param = nn.Parameter(flat)
    flat_param.grad = grad
    return flat_param, grad


class FlatAdam:
    """Adam (Kingma & Ba; torch.optim.Adam's arithmetic, no AMSGrad, no weight decay)
    for one flat parameter: six in-place ops per step instead of torch.optim's
    per-step Python machinery (which costs more than a tiny MLP's backward pass)."""

    def __init__(self, param: torch.Tensor, lr: float, eps: float = 1e-8, betas=(0.9, 0.999)):
        self.param = param
        self.lr, self.eps = lr, eps
        self.b1, self.b2 = betas
        self.m = torch.zeros_like(param)
        self.v = torch.zeros_like(param)
        self.t = 0
        self._denom = torch.empty_like(param)

    def step(self) -> None:
        g = self.param.grad
        self.t += 1
        b1, b2 = self.b1, self.b2
        bc1 = 1.0 - b1**self.t
        bc2 = 1.0 - b2**self.t
        with torch.no_grad():
            self.m.lerp_(g, 1.0 - b1)
            self.v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            torch.sqrt(self.v, out=self._denom).div_(math.sqrt(bc2)).add_(self.eps)
            self.param.addcdiv_(self.m, self._denom, value=-self.lr / bc1)

    def state_dict(self) -> dict:
        return {
            "m": self.m.detach().cpu().clone(),
            "v": self.v.detach().cpu().clone(),
            "t": self.t,
            "lr": self.lr,
            "eps": self.eps,
            "betas": (self.b1, self.b2),
        }

    def load_state_dict(self, state: dict) -> None:
        if state["m"].shape != self.m.shape:
            raise ValueError(f"optimiser state for {state['m'].numel()} parameters, the policy has {self.m.numel()}")
        with torch.no_grad():
            self.m.copy_(state["m"])
            self.v.copy_(state["v"])
        self.t, self.lr, self.eps = int(state["t"]), float(state["lr"]), float(state["eps"])
        self.b1, self.b2 = state["betas"]


def rng_state() -> dict:
    """torch's and numpy's global RNG states (and CUDA's where initialised)."""
    st = {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    if "cuda" in st and torch.cuda.is_available():
        try:
            torch.cuda.set_rng_state_all(st["cuda"])
        except (RuntimeError, IndexError):  # another device count: CUDA draws differ, the rest holds
            pass


_WARM = False


def warm_up_torch() -> None:
    """First-use costs (autograd engine start-up) before the clock starts. The trainer
    never builds a ``torch.optim`` optimiser, whose first construction imports
    ``torch._dynamo`` (3-6 s here)."""
    global _WARM
    if not _WARM:
        p = nn.Parameter(torch.zeros(2))
        (p * 2).sum().backward()
        _WARM = True


class PPO:
    """The trainer's state: storage, policy, optimiser, rollout, statistics; ``collect``
    runs a rollout, ``prepare`` computes its targets, ``update`` learns from it.

    ``separate_buffers``: the learner's tensors are buffers of their own, filled by
    copies from the storage's (``Rollout.copies``); None: exactly when ``device`` is not
    the CPU. True on the CPU runs the GPU's copy path without one (the tests do)."""

    def __init__(
        self,
        cfg: PPOConfig,
        storage,
        device: torch.device,
        policy: ActorCritic | None = None,
        *,
        separate_buffers: bool | None = None,
    ):
        self.cfg, self.storage, self.device = cfg, storage, device
        obs_space, act_space = storage.single_observation_space, storage.single_action_space
        # Threads first: results (even the initial weights) depend on the thread count.
        cnn = is_image_space(obs_space)
        # Acting overlaps nothing but it runs right before each step: its threads must
        # leave the workers' cores free (they spin a while after each op; see
        # fastvec.doors.threads). Learning has the cores to itself.
        workers = storage.num_workers or 0
        self.act_threads = cfg.torch_threads or (max(1, available_cores() - workers) if cnn else 1)
        self.learn_threads = cfg.learn_threads or cfg.torch_threads or (available_cores() if cnn else 1)
        self._threads = None
        self._set_threads(self.learn_threads)
        self.policy = policy or make_policy(
            obs_space,
            act_space,
            hidden=cfg.hidden,
            critic_hidden=cfg.critic_hidden,
            activation=cfg.activation,
            ortho_init=cfg.ortho_init,
            log_std_init=cfg.log_std_init,
            normalize_obs=cfg.normalize_obs,
        )
        self.policy.to(device)
        self.flat_param, self.flat_grad = flatten_parameters(self.policy)
        self.opt = FlatAdam(self.flat_param, cfg.lr, cfg.adam_eps)
        self.np_learner = self._numpy_learner()
        self.T, self.N = cfg.n_steps, storage.num_envs
        self.rollout = Rollout(storage, self.policy, self.T, device, copies=separate_buffers)
        self._group_views = self._views_by_group()
        self.tracker = EpisodeTracker(self.N, cfg.return_window)
        self.reward_scaler = RewardScaler(self.N, cfg.gamma) if cfg.normalize_reward else None
        self.env_steps = 0
        self.updates = 0
        self.curve: list[tuple[int, float]] = []
        self.stats: dict = {}
        self.grad_steps = 0  # minibatch gradient steps taken, over the whole run
        self.learn_samples = 0  # samples those steps learned from (the learner's speed: per t_learn)
        self.last_stats: tuple | None = None  # the last update's (stats, lr, clip, epochs, early stop)
        self.t_act = self.t_env = self.t_learn = self.t_prep = 0.0
        self.busy = DeviceBusy(device)
        # called with t before acting at each step t (the async pipeline's collector takes up
        # new weights there and records which version acted); None in lock-step
        self.between_steps = None
        # per-sample weights of the advantages (proximal_policy=learner), set by prepare
        self.adv_weights: torch.Tensor | None = None
        self._batch = self.T * self.N
        # the schedules' horizon, in updates (lr_horizon's, else total_steps')
        self.num_updates = max(1, (cfg.lr_horizon or cfg.total_steps) // self._batch)
        self.lr_schedule = LRSchedule(cfg, self.num_updates)

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

    def restart_envs(self, seed: int | None) -> None:
        """Reset every env (``seed + i`` for env i) into slot 0 of a new rollout: the
        episodes in progress are dropped from the statistics and the reward normaliser's
        running returns start again."""
        self.storage.reset(seed)
        self.tracker.restart_envs()
        if self.reward_scaler is not None:
            self.reward_scaler.acc[:] = 0.0

    def _numpy_learner(self) -> NumpyLearner | None:
        """The minibatch gradient in numpy where it covers the policy (``cfg.learner``:
        "auto" takes it there, "numpy" insists, "torch" keeps autograd)."""
        choice = self.cfg.learner
        if choice == "torch":
            return None
        why = NumpyLearner.why_not(self.policy, self.device, self.learn_threads)
        if why is not None:
            if choice == "numpy":
                raise ConfigError(f"learner=numpy does not fit this run: {why}; use learner=auto or torch")
            return None
        cfg = self.cfg
        return NumpyLearner(self.policy, self.flat_grad, cfg.ent_coef, cfg.vf_coef, cfg.clip_vf)

    def _set_threads(self, n: int) -> None:
        if self._threads != n:
            torch.set_num_threads(n)
            self._threads = n

    # ------------------------------------------------------------------ acting
    def collect(self) -> None:
        """One rollout of T steps on every env (see the module docstring)."""
        ro, T = self.rollout, self.T
        self._set_threads(self.act_threads)
        with torch.inference_mode():
            self.policy.dist.sample_noise(ro.noise)
            if self._group_views is not None:
                t_act, t_env = self._collect_groups()
            else:
                t_act, t_env = self._collect_lockstep()
            ro.last_obs_to_device()
        self.t_act += t_act
        self.t_env += t_env
        self.last_env_latency = t_env / T
        self.last_act_latency = t_act / T
        self.env_steps += T * self.N
        b = self.storage
        tr = self.tracker
        n_before = tr.episodes
        tr.update(b.rewards[1:], b.terminated[1:], b.truncated[1:])
        if tr.episodes != n_before:  # for the learning-curve PNG
            self.curve.append((self.env_steps, tr.mean()))
            thin(self.curve)  # bounded, however long the run

    def _collect_lockstep(self) -> tuple[float, float]:
        """The rollout with every env stepping at once: act on step t's observations,
        then step them all. With separate device buffers the observations go to the
        device before acting and the actions come back after it (``busy`` times that
        span on the device)."""
        policy_act, step, copies = self.policy.act_, self.storage.step, self.rollout.copies
        begin, end = self.busy.begin, self.busy.end
        hook = self.between_steps
        perf = time.perf_counter
        t_act = t_env = 0.0
        for t, slots in enumerate(self.rollout.steps):
            obs, obs_h, noise, act, act_h, raw, logp, val = slots
            t0 = perf()
            if hook is not None:
                hook(t)
            if copies:
                span = begin()
                obs.copy_(obs_h, non_blocking=True)
            policy_act(obs, noise, act, raw, logp, val)
            if copies:
                end(span)
                act_h.copy_(act)  # synchronous: the env needs it now
            t1 = perf()
            step(t + 1)
            t_env += perf() - t1
            t_act += t1 - t0
        return t_act, t_env

    def use_rollout(self, storage, rollout: Rollout, group_views) -> None:
        """Act into, or learn from, another rollout of the same shapes (the async pipeline
        keeps K of them in the engine's ring); ``group_views``: ``_views_by_group()``'s for it."""
        self.storage, self.rollout, self._group_views = storage, rollout, group_views

    def _views_by_group(self):
        """Per group, per step t: that group's rows of what acting reads and writes at t
        (``StepSlots``, made once: no slicing in the hot loop); None in lock-step."""
        groups = self.storage.groups
        if len(groups) < 2:
            return None
        return [[slots.rows(a, b) for slots in self.rollout.steps] for a, b in groups]

    def _collect_groups(self) -> tuple[float, float]:
        """The rollout with batch groups: group g's step t is in flight while the
        policy acts on the other groups' observations of step t, so acting and the
        envs overlap. Every env sees the same actions as in lock-step (the noise is
        drawn per rollout): results differ only by floating-point rounding of the
        smaller batches. A failure leaves other groups in flight: the engine's close
        collects them."""
        T, sto = self.T, self.storage
        policy_act, send, recv = self.policy.act_, sto.send, sto.recv
        views, copies = self._group_views, self.rollout.copies
        begin, end = self.busy.begin, self.busy.end
        hook = self.between_steps
        perf = time.perf_counter
        t_act = t_env = 0.0
        for t in range(T):
            if hook is not None:
                hook(t)
            for g, by_step in enumerate(views):
                t0 = perf()
                if t:
                    recv(g, t)
                t1 = perf()
                obs, obs_h, noise, act, act_h, raw, logp, val = by_step[t]
                if copies:
                    span = begin()
                    obs.copy_(obs_h, non_blocking=True)
                policy_act(obs, noise, act, raw, logp, val)
                if copies:
                    end(span)
                    act_h.copy_(act)  # synchronous: the env needs it now
                t2 = perf()
                send(g, t + 1)
                t3 = perf()
                t_env += (t1 - t0) + (t3 - t2)
                t_act += t2 - t1
        t0 = perf()
        for g in range(len(views)):
            recv(g, T)
        t_env += perf() - t0
        return t_act, t_env

    # ------------------------------------------------------------------ targets
    @torch.no_grad()
    def prepare(self, acted_by=None) -> None:
        """Values, old log-probs, truncation bootstrap and the targets for the rollout.

        ``acted_by``: None where the current weights acted (lock-step), else ``(versions,
        weights)``: the weights version that acted at each step (``[T]``) and a mapping from
        version to flat weights. Values, old log-probs and the truncation bootstrap are then
        those of the weights that acted, and with ``targets=vtrace`` (or ``auto``) the targets are
        importance-clipped towards the current weights (``fastvec.vtrace``)."""
        t0 = time.perf_counter()
        span = self.busy.begin()
        cfg, ro, b, T = self.cfg, self.rollout, self.storage, self.T
        pol = self.policy
        self._set_threads(self.learn_threads)
        if pol.obs_norm is not None:
            pol.update_obs_norm(ro.obs_dev[1:])
        term, trunc = b.terminated[1:], b.truncated[1:]
        boot = trunc & ~term
        current_logp = None  # the current weights' log-probs, where a pass computed them
        if acted_by is None:
            boots = [self._behaviour_pass(np.arange(T + 1), boot)]
        else:
            versions, weights = acted_by
            by_step = np.append(versions, versions[-1])  # slot T's value: the last step's weights
            learner_pass = cfg.values_of == "learner" and not pol.values_at_act
            acted = np.unique(by_step)
            current = weights.get(self.updates) if learner_pass else None
            mine = self.updates if current is not None and torch.equal(current, self.flat_param) else -1
            acted = acted[acted != mine]  # the learner's pass below gives the log-probs of the steps it acted
            now = self.flat_param.detach().clone()
            boots = []
            for v in acted:
                self.flat_param.copy_(weights[int(v)])
                rows = np.flatnonzero(by_step == v)
                in_rows = np.zeros_like(boot)
                if not learner_pass:  # else the learner's pass bootstraps every truncation
                    in_rows[rows[rows < T]] = True
                boots.append(self._behaviour_pass(rows, boot & in_rows))
            self.flat_param.copy_(now)
            if learner_pass:
                # the values (and bootstraps) of the learner's current weights; the log-probs stay the acting ones'
                acting_logp = ro.logp.clone()
                boots = [self._behaviour_pass(np.arange(T + 1), boot)]
                current_logp = ro.logp.clone()  # the same pass's: log_rhos need no pass of their own
                by_me = torch.from_numpy(versions == mine).to(self.device).unsqueeze(1)
                ro.logp.copy_(torch.where(by_me, current_logp, acting_logp))
        ro.values_to_host()
        np.copyto(ro.next_values_np, ro.values_np[1:])
        for found in boots:
            if found is not None:
                ts, ns, v_final = found
                ro.next_values_np[ts, ns] = v_final
        rewards = b.rewards[1:]
        if self.reward_scaler is not None:
            rewards = self.reward_scaler(rewards, term | trunc)
        self.adv_weights = None
        log_rhos = None if acted_by is None else self._log_rhos(current_logp)
        if cfg.targets == "vtrace" or (cfg.targets == "auto" and log_rhos is not None):
            vtrace(
                rewards,
                ro.values_np[:T],
                ro.next_values_np,
                term,
                trunc,
                log_rhos if log_rhos is not None else np.zeros_like(ro.adv_np),
                cfg.gamma,
                cfg.gae_lambda,
                cfg.vtrace_rho_bar,
                cfg.vtrace_c_bar,
                advantages="gae",
                out=(ro.adv_np, ro.ret_np),
            )
        else:
            gae(
                rewards,
                ro.values_np[:T],
                ro.next_values_np,
                term,
                trunc,
                cfg.gamma,
                cfg.gae_lambda,
                out=(ro.adv_np, ro.ret_np),
            )
        if log_rhos is not None and cfg.proximal_policy == "learner":
            # decoupled PPO: clip around the current weights, weight by their ratio to the acting ones
            lr_ = torch.from_numpy(log_rhos).to(self.device)
            ro.logp.add_(lr_)  # log pi_prox = log mu + log(pi_prox / mu)
            self.adv_weights = lr_.exp().clamp_(max=cfg.vtrace_rho_bar).reshape(-1)
        ro.targets_to_device()
        self.busy.end(span)
        self.t_prep += time.perf_counter() - t0

    def _behaviour_pass(self, rows: np.ndarray, boot: np.ndarray):
        """Values and log-probs at the steps ``rows`` (of ``0..T``; slot T has no action)
        with the weights in place, and the values of the final observations where ``boot``
        (the truncations among them): ``(ts, ns, values)`` or None."""
        ro, T, N, pol = self.rollout, self.T, self.N, self.policy
        if not pol.values_at_act:
            # One batched pass (the policy did not change while acting).
            if len(rows) == T + 1:
                flat = ro.obs_dev.reshape((T + 1) * N, *ro.obs.shape[2:])
                params, v = pol.params_and_value(flat)
                ro.values.copy_(v.view(T + 1, N))
                ro.logp.copy_(pol.dist.log_prob(params[: T * N], ro.batch_actions()).view(T, N))
            else:
                idx = torch.from_numpy(rows)
                params, v = pol.params_and_value(ro.obs_dev[idx].reshape(len(rows) * N, *ro.obs.shape[2:]))
                ro.values[idx] = v.view(len(rows), N)
                acted = rows[rows < T]
                acts = ro.batch_actions()
                acts = acts.view(T, N, *acts.shape[1:])[torch.from_numpy(acted)].reshape(
                    len(acted) * N, *acts.shape[1:]
                )
                ro.logp[torch.from_numpy(acted)] = pol.dist.log_prob(params[: len(acted) * N], acts).view(len(acted), N)
        elif rows[-1] == T:
            ro.values[T].copy_(pol.value(ro.obs_dev[T]))
        if not boot.any():
            return None
        ts, ns = np.nonzero(boot)
        final = torch.from_numpy(self.storage.final_obs[1:][ts, ns]).to(self.device)
        return ts, ns, pol.value(final).float().cpu().numpy()

    def _log_rhos(self, current: torch.Tensor | None = None) -> np.ndarray:
        """log pi(a|s) - log mu(a|s) over the rollout: the current weights against the
        log-probs of the weights that acted (``rollout.logp``); ``current``: the current
        weights' log-probs where a pass already computed them."""
        ro, T, N, pol = self.rollout, self.T, self.N, self.policy
        if current is None:
            params, _ = pol.params_and_value(ro.batch_obs())
            current = pol.dist.log_prob(params, ro.batch_actions()).view(T, N)
        return (current - ro.logp).cpu().numpy()

    # ------------------------------------------------------------------ learning
    def update(self) -> None:
        """``n_epochs`` passes of minibatch PPO over the rollout.

        Per epoch the per-sample data is permuted with one gather (observations, old
        log-probs, advantages, returns and old values packed in one float tensor when
        the observations are small vectors), so a minibatch is a contiguous slice.
        Advantages are normalised over the whole batch, once. KL and clip-fraction
        statistics are computed in the last epoch only, or in every minibatch when
        ``target_kl`` needs them.
        """
        t0 = time.perf_counter()
        span = self.busy.begin()
        cfg, ro, pol = self.cfg, self.rollout, self.policy
        self._set_threads(self.learn_threads)
        frac = max(1.0 - self.updates / self.num_updates, 0.0)
        self.opt.lr = lr = self.lr_schedule.rate(self.updates)
        clip = max(cfg.clip_coef * frac if cfg.anneal_clip else cfg.clip_coef, 1e-8)
        B = self._batch
        mb = min(cfg.minibatch_size, B)
        obs = ro.batch_obs()
        acts = ro.batch_actions()
        adv = ro.adv.view(B)
        if cfg.norm_adv and B > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        if self.adv_weights is not None:
            adv = adv * self.adv_weights
        cols = [ro.logp.view(B, 1), adv.view(B, 1), ro.ret.view(B, 1), ro.values[: self.T].reshape(B, 1)]
        packed_obs = pol.packable_obs
        npl = self.np_learner
        if packed_obs:
            D = pol.obs_dim
            # the numpy learner gets its inputs normalised once for the whole update
            x = pol.preprocess(obs) if npl is not None else obs.reshape(B, D).float()
            data = torch.cat([x, *cols], 1)
        else:
            D = 0
            data = torch.cat(cols, 1)
        minibatch = npl.minibatch if npl is not None else self._torch_minibatch
        grad, max_norm, target_kl = self.flat_grad, cfg.max_grad_norm, cfg.target_kl
        stats = collections.defaultdict(list)
        stop = False
        epochs_done = kl_from = 0
        n_mb = 0
        with npl.one_blas_thread() if npl is not None else contextlib.nullcontext():
            for epoch in range(cfg.n_epochs):
                want_stats = epoch == cfg.n_epochs - 1 or target_kl is not None
                kl_from = len(stats["kl"])  # where this epoch's KLs start: the adaptive rate reads the last's
                if mb < B:
                    perm = torch.randperm(B, device=self.device)
                    data_e, acts_e = data[perm], acts[perm]
                    obs_e = None if packed_obs else obs[perm]
                else:
                    data_e, acts_e, obs_e = data, acts, (None if packed_obs else obs)
                if npl is not None:
                    data_e, acts_e = data_e.numpy(), acts_e.numpy()
                for start in range(0, B - 1, mb):
                    rows = data_e[start : start + mb]
                    if rows.shape[0] < 2:
                        continue
                    o = rows[:, :D] if packed_obs else obs_e[start : start + mb]
                    if minibatch(
                        o,
                        acts_e[start : start + mb],
                        rows[:, D],
                        rows[:, D + 1],
                        rows[:, D + 2],
                        rows[:, D + 3],
                        clip,
                        want_stats,
                        target_kl,
                        stats,
                    ):
                        stop = True
                        break
                    # clip_grad_norm_ on the one flat gradient
                    grad.mul_((max_norm / (grad.norm() + 1e-6)).clamp_(max=1.0))
                    self.opt.step()
                    n_mb += 1
                epochs_done = epoch + 1
                if stop:
                    break
        self.updates += 1
        if self.lr_schedule.adaptive:
            self.lr_schedule.observe(mean_kl(stats["kl"][kl_from:]))
        self.busy.end(span)
        self.busy.synchronize()  # the update's queued device work counts in t_learn
        self.t_learn += time.perf_counter() - t0
        self.learn_samples += n_mb * mb
        self.grad_steps += n_mb
        self.last_stats = (stats, lr, clip, epochs_done, stop)

    def _torch_minibatch(self, o, a, olp, adv_b, ret, ov, clip, want_stats, target_kl, stats) -> bool:
        """One minibatch's loss and gradient with autograd (``NumpyLearner.minibatch``'s
        contract: True, with no gradient, when the approximate KL stops the epochs)."""
        cfg, pol = self.cfg, self.policy
        clip_vf, ent_coef = cfg.clip_vf, cfg.ent_coef
        params, v = pol.params_and_value(o)
        logp, ent = pol.dist.log_prob_entropy(params, a, need_entropy=bool(ent_coef) or want_stats)
        logratio = logp - olp
        ratio = logratio.exp()
        pg_loss = -torch.min(adv_b * ratio, adv_b * ratio.clamp(1.0 - clip, 1.0 + clip)).mean()
        if clip_vf is not None:
            v_clipped = ov + (v - ov).clamp(-clip_vf, clip_vf)
            v_loss = torch.max((v - ret).square(), (v_clipped - ret).square()).mean()
        else:
            v_loss = (v - ret).square().mean()
        loss = pg_loss + (0.5 * cfg.vf_coef) * v_loss
        if ent_coef:
            loss = loss - ent_coef * ent.mean()
        if want_stats:
            with torch.no_grad():
                approx_kl = ((ratio - 1.0) - logratio).mean()
                stats["kl"].append(approx_kl)
                if target_kl is not None and approx_kl.item() > 1.5 * target_kl:
                    return True
                stats["cf"].append(((ratio - 1.0).abs() > clip).float().mean())
                stats["pg"].append(pg_loss.detach())
                stats["v"].append(0.5 * v_loss.detach())
                stats["ent"].append(ent.detach().mean())
        self.flat_grad.zero_()
        loss.backward()
        return False

    def summarize(self) -> dict:
        """Losses etc. of the last update (reads tensors: call at logging time only)."""
        if self.last_stats is None:
            return {}
        stats, lr, clip, epochs_done, stop = self.last_stats
        ro, T = self.rollout, self.T

        def mean(key):
            xs = stats.get(key)
            return float(np.mean([float(x) for x in xs])) if xs else None

        with torch.no_grad():
            ret = ro.ret.reshape(-1)
            v = ro.values[:T].reshape(-1)
            var_y = ret.var()
            ev = float(1.0 - (ret - v).var() / var_y) if var_y > 0 else float("nan")
        out = {
            "losses/policy": mean("pg"),
            "losses/value": mean("v"),
            "losses/entropy": mean("ent"),
            "losses/approx_kl": mean("kl"),
            "losses/clip_fraction": mean("cf"),
            "losses/explained_variance": ev,
            "losses/learning_rate": lr,
            "losses/clip_coef": clip,
            "losses/epochs": epochs_done,
            "losses/kl_early_stop": int(stop),
        }
        if isinstance(self.policy.dist, GaussianDist):
            out["losses/action_std"] = float(self.policy.dist.log_std.detach().exp().mean())
        return out
