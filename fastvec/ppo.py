"""PPO on the fastvec engine: rollouts live in the engine's shared memory.

Rollout storage is the engine itself. The engine is started with ``num_slots = T + 1``
and ``autoreset_mode="same_step"``:

- slot 0 holds the first observation of a rollout;
- for ``t`` in ``0..T-1`` the policy reads observation slot ``t``, writes its actions
  straight into ``act_bufs[0][t + 1]``, then ``step_async_written(t + 1)`` and
  ``step_wait()``; the reward / terminated / truncated flags of step ``t`` land in slot
  ``t + 1``, and where an episode ended ``final_bufs[0][t + 1]`` holds its final
  observation (slot ``t + 1`` of ``obs_bufs`` already holds the reset observation);
- after the rollout, slot ``T``'s observation is copied into slot 0 and the next
  rollout starts.

The learner reads the rollout as ``torch.from_numpy`` views of those buffers: no copy on
CPU (``Rollout.obs``, ``Rollout.actions``, ... share memory with the engine). With CUDA
the engine's segment is page-locked (``cudaHostRegister``) so the per-step observation
uploads and action downloads are DMA transfers; observations are uploaded into a device
rollout buffer as they are acted on, and advantages / returns go up once per rollout
(see ``Rollout``).

Truncation is bootstrapped: ``next_values[t] = V(final_obs[t])`` where an episode was
truncated at step ``t`` (terminated steps do not bootstrap), ``V(obs[t + 1])``
elsewhere; advantages come from :func:`fastvec.gae`.

The same trainer runs on a plain gymnasium ``VectorEnv`` (same-step autoreset) or an
SB3-style ``VecEnv`` (``train(venv=...)``), copying their results into buffers of the
same layout: that is how the benchmarks compare the transports.

Start method: the engine is started with ``context="fork"`` by default: a forked
worker inherits the imported modules, so start-up is the envs' own construction
(measured on 2 cores, 8 envs: CartPole 1 worker fork 0.02 s vs forkserver 1.0 s and
spawn 1.05 s; Pong 2 workers fork 0.5 s vs 1.5 s and 1.6 s). For a 1-2 s CartPole run
that second is most of the difference to SB3. Workers never call torch, so forking a
parent whose torch thread pools exist is safe. Use ``--set context=spawn`` where fork
is unavailable (macOS/Windows defaults) or not wanted.

Threads: ``torch_threads`` defaults to 1 for MLP policies (on 2 cores, 2 threads are
no faster for a 64x64 MLP and fight the env workers for the second core) and to all
cores for CNNs (the env workers sleep while the policy runs: acting is synchronous).

Per-step overhead is kept small: acting runs under ``torch.inference_mode()`` with a
functional forward of the actor only (values and old log-probs of MLP policies are
computed for the whole rollout in one batched pass afterwards), sampling noise is
drawn once per rollout, actions are written in place into the engine's action slot,
and episode statistics are computed per rollout, vectorised over time. The update
uses one flat parameter / gradient tensor (one-tensor Adam and gradient clipping) and
permutes the packed per-sample data once per epoch.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import mmap
import os
import sys
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from .policies import ActorCritic, GaussianDist, describe_policy, is_image_space, make_policy

__all__ = [
    "PPOConfig", "ConfigError", "apply_overrides", "train", "Rollout", "EngineBackend",
    "GymVectorBackend", "SB3VecBackend", "make_backend", "save_checkpoint", "load_checkpoint",
    "policy_from_checkpoint", "evaluate", "compute_gae_targets", "time_to_solve",
]

CHECKPOINT_FORMAT = "fastvec-ppo-1"


class ConfigError(ValueError):
    """A bad configuration value or key (reported as a one-line error by the CLI)."""


# ============================================================================ config
@dataclass
class PPOConfig:
    """Every hyperparameter of the trainer; ``fastvec train --set key=value`` sets any."""

    # environment / rollout
    num_envs: int = 8
    num_workers: int | None = None  # None: min(num_envs, cores)
    n_steps: int = 128  # T: steps per env per rollout
    total_steps: int = 1_000_000
    context: str = "fork"  # engine start method
    spin_us: float | None = None  # engine workers' busy-wait before sleeping (None: engine default)
    # optimisation
    lr: float = 3e-4
    anneal_lr: bool = True  # linear decay to 0 over total_steps
    n_epochs: int = 4
    minibatch_size: int = 256
    max_grad_norm: float = 0.5
    adam_eps: float = 1e-5
    target_kl: float | None = None  # stop the epochs early when approx KL > 1.5 * target
    # PPO objective
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    anneal_clip: bool = False
    clip_vf: float | None = None  # value clipping range (None: no value clipping)
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    norm_adv: bool = True
    # policy
    hidden: tuple = (64, 64)
    activation: str = "tanh"
    ortho_init: bool = True
    log_std_init: float = 0.0
    normalize_obs: bool = False
    normalize_reward: bool = False
    # run
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    torch_threads: int | None = None  # acting threads; None: 1 for MLPs, all cores for CNNs
    learn_threads: int | None = None  # update threads; None: as torch_threads
    stop_at_return: float | None = None
    solve_return: float | None = None  # threshold reported as "solved" (default: preset/spec)
    return_window: int = 20
    log_every_s: float = 1.0

    def validate(self) -> "PPOConfig":
        def pos_int(name):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")

        for name in ("num_envs", "n_steps", "total_steps", "n_epochs", "minibatch_size", "return_window"):
            pos_int(name)
        for name in ("num_workers", "torch_threads", "learn_threads"):
            if getattr(self, name) is not None:
                pos_int(name)
        if self.num_workers is not None and self.num_workers > self.num_envs:
            raise ConfigError(f"num_workers={self.num_workers} exceeds num_envs={self.num_envs}")
        for name in ("gamma", "gae_lambda"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {v!r}")
        for name in ("lr", "clip_coef", "max_grad_norm", "adam_eps", "log_every_s"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"{name} must be a positive number, got {v!r}")
        for name in ("ent_coef", "vf_coef"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ConfigError(f"{name} must be a non-negative number, got {v!r}")
        if self.spin_us is not None and not 0 <= self.spin_us < 1e6:
            raise ConfigError(f"spin_us must be in [0, 1e6) microseconds or none, got {self.spin_us!r}")
        for name in ("target_kl", "clip_vf"):
            v = getattr(self, name)
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"{name} must be a positive number or none, got {v!r}")
        if not all(isinstance(h, int) and h > 0 for h in self.hidden):
            raise ConfigError(f"hidden must be positive layer sizes like 64,64, got {self.hidden!r}")
        from .policies import _ACTIVATIONS

        if self.activation not in _ACTIVATIONS:
            raise ConfigError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {self.activation!r}")
        import multiprocessing as mp

        if self.context not in mp.get_all_start_methods():
            raise ConfigError(f"context must be one of {mp.get_all_start_methods()}, got {self.context!r}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"device must be auto, cpu or cuda, got {self.device!r}")
        return self

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["hidden"] = list(self.hidden)
        return d


_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f"}
_NONE = {"none", "null", ""}


def _parse_value(name: str, text: str, kind: str):
    t = text.strip()
    low = t.lower()
    optional = kind.endswith("?")
    base = kind.rstrip("?")
    if optional and low in _NONE:
        return None
    try:
        if base == "int":
            f = float(t)  # accept 1e6 / 100_000
            if not f.is_integer():
                raise ValueError
            return int(f)
        if base == "float":
            v = float(t)
            if math.isnan(v):
                raise ValueError
            return v
        if base == "bool":
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError
        if base == "ints":
            if low in _NONE:
                return ()
            return tuple(int(x) for x in t.replace("x", ",").split(",") if x.strip())
        if base == "str":
            if not t:
                raise ValueError
            return t
    except ValueError:
        pass
    want = {"int": "an integer", "float": "a number", "bool": "true or false",
            "ints": "comma-separated integers like 64,64", "str": "a non-empty string"}[base]
    raise ConfigError(f"bad value for {name}: {text!r} (expected {want}{' or none' if optional else ''})")


def _field_kinds() -> dict[str, str]:
    kinds = {}
    for f in dataclasses.fields(PPOConfig):
        ann = str(f.type).replace(" ", "")
        opt = "None" in ann
        if ann.startswith("tuple"):
            k = "ints"
        elif ann.startswith("bool"):
            k = "bool"
        elif ann.startswith("int"):
            k = "int"
        elif ann.startswith("float"):
            k = "float"
        else:
            k = "str"
        kinds[f.name] = k + ("?" if opt else "")
    return kinds


FIELD_KINDS = _field_kinds()


def apply_overrides(cfg: PPOConfig, items) -> PPOConfig:
    """Apply ``["key=value", ...]`` (or a dict of already-typed values) to ``cfg``."""
    if isinstance(items, dict):
        for k, v in items.items():
            if k not in FIELD_KINDS:
                raise ConfigError(f"unknown config key {k!r}")
            if k == "hidden" and v is not None:
                v = tuple(v)
            setattr(cfg, k, v)
        return cfg
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, text = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if key not in FIELD_KINDS:
            close = [k for k in FIELD_KINDS if key in k or k in key]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"unknown --set key {key!r}{hint}; known keys: {', '.join(sorted(FIELD_KINDS))}")
        setattr(cfg, key, _parse_value(key, text, FIELD_KINDS[key]))
    return cfg


# ============================================================================ backends
def _single_leaf(space, what: str):
    from gymnasium import spaces

    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        raise ValueError(
            f"the PPO trainer needs a single (non Dict/Tuple) {what} space, got {space}; "
            "flatten it with a gymnasium wrapper"
        )


class EngineBackend:
    """Rollout storage = the engine's shared memory (zero copy).

    ``engine``: an already started engine with the same interface and layout (e.g. a
    ``fastvec.ray.RayEngine``, ``kind="fastvec-ray"``) instead of starting one here.
    """

    kind = "fastvec"

    def __init__(self, env_fns, num_slots: int, num_workers=None, context="fork", spin_us=None,
                 engine=None, kind: str | None = None):
        if engine is None:
            from .engine import Engine

            engine = Engine(env_fns, num_workers=num_workers, num_slots=num_slots,
                            autoreset_mode="same_step", context=context, spin_us=spin_us)
        if kind is not None:
            self.kind = kind
        self.engine = engine
        eng = self.engine
        try:
            _single_leaf(eng.single_observation_space, "observation")
            _single_leaf(eng.single_action_space, "action")
        except ValueError:
            eng.close()
            raise
        self.num_envs = eng.num_envs
        self.num_workers = eng.num_workers
        self.single_observation_space = eng.single_observation_space
        self.single_action_space = eng.single_action_space
        self.obs = eng.obs_bufs[0]
        self.final_obs = eng.final_bufs[0]
        self.act = eng.act_bufs[0]
        self.rewards = eng.rewards
        self.terminated = eng.terminated
        self.truncated = eng.truncated
        self._step_async = eng.step_async_written
        self._step_wait = eng.step_wait

    @property
    def worker_pids(self) -> list[int]:
        # Ray actors run on their own nodes: their pids mean nothing to this machine's psutil.
        return self.engine.worker_pids if self.kind == "fastvec" else []

    def arrays(self) -> list[np.ndarray]:
        return [self.obs, self.final_obs, self.act, self.rewards, self.terminated, self.truncated]

    def reset(self, seed: int | None) -> None:
        kw = {i: ({"seed": seed + i} if seed is not None else {}) for i in range(self.num_envs)}
        self.engine.reset(0, kw)

    def step(self, slot: int) -> None:
        self._step_async(slot)
        self._step_wait()

    def close(self) -> None:
        self.engine.close()


def _alloc(shape, dtype, pin: bool) -> np.ndarray:
    if pin:
        t = torch.empty(shape, dtype=torch.from_numpy(np.zeros(0, dtype)).dtype, pin_memory=True)
        return t.numpy()
    return np.zeros(shape, dtype)


class _CopyBackend:
    """Own buffers with the engine's layout, filled from another vector env."""

    def _alloc(self, num_slots: int, pin: bool) -> None:
        from .layout import leaves_of

        _single_leaf(self.single_observation_space, "observation")
        _single_leaf(self.single_action_space, "action")
        (o,), (a,) = leaves_of(self.single_observation_space), leaves_of(self.single_action_space)
        S, N = num_slots, self.num_envs
        self.obs = _alloc((S, N, *o.shape), o.dtype, pin)
        self.final_obs = _alloc((S, N, *o.shape), o.dtype, pin)
        self.act = _alloc((S, N, *a.shape), a.dtype, pin)
        self.rewards = _alloc((S, N), np.float64, pin)
        self.terminated = _alloc((S, N), np.bool_, pin)
        self.truncated = _alloc((S, N), np.bool_, pin)

    worker_pids: list = []

    def arrays(self) -> list[np.ndarray]:
        return []  # already pinned at allocation when needed

    def close(self) -> None:  # the caller owns the vector env
        pass


class GymVectorBackend(_CopyBackend):
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
        self.num_envs = venv.num_envs
        self.single_observation_space = venv.single_observation_space
        self.single_action_space = venv.single_action_space
        self.num_workers = getattr(venv, "num_workers", None)
        self._alloc(num_slots, pin)
        self.worker_pids = [p.pid for p in getattr(venv, "processes", [])]

    def reset(self, seed):
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


class SB3VecBackend(_CopyBackend):
    """A ``step_async`` / ``step_wait`` vector env: SB3's ``VecEnv`` API (``step`` ->
    obs, rewards, dones, infos, truncation in ``infos[i]["TimeLimit.truncated"]``) or a
    baselines-style ``SubprocVecEnv`` with gymnasium's 5-tuple (``step`` -> obs,
    rewards, terminated, truncated, infos). Either way the final observation of an
    ended episode must be in ``infos[i]["terminal_observation"]`` (or ``"final_obs"``):
    without it a truncated episode cannot be bootstrapped."""

    kind = "subproc"

    def __init__(self, venv, num_slots: int, pin: bool = False):
        self.venv = venv
        self.num_envs = venv.num_envs
        self.single_observation_space = venv.observation_space
        self.single_action_space = venv.action_space
        procs = getattr(venv, "processes", None) or getattr(venv, "ps", None) or []
        self.num_workers = len(procs) or None
        self._alloc(num_slots, pin)
        self.worker_pids = [p.pid for p in procs]

    def reset(self, seed):
        import inspect

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
                        "ended episode (infos[i]['terminal_observation']); the trainer needs it")
                self.final_obs[slot, i] = final
                if len(out) == 4 and info.get("TimeLimit.truncated", False):
                    self.truncated[slot, i] = True
                    self.terminated[slot, i] = False


def make_backend(venv, num_slots: int, pin: bool = False):
    """Wrap a vector env the trainer did not create itself."""
    import gymnasium as gym

    if isinstance(venv, gym.vector.VectorEnv):
        return GymVectorBackend(venv, num_slots, pin)
    if hasattr(venv, "step_async") and hasattr(venv, "step_wait") and hasattr(venv, "num_envs"):
        return SB3VecBackend(venv, num_slots, pin)
    raise ValueError(f"cannot train on {type(venv).__name__}: give a gymnasium VectorEnv or an SB3 VecEnv")


# ============================================================================ pinning
class HostPin:
    """Page-locks the memory under ``arrays`` with ``cudaHostRegister`` (one region:
    the arrays are carved out of one segment and share pages, and CUDA refuses to
    register a page twice); ``release()`` unregisters (before the engine closes)."""

    def __init__(self, arrays):
        self.ptr = None
        arrays = [a for a in arrays if a is not None and a.nbytes]
        if not arrays:
            return
        page = mmap.PAGESIZE
        lo = min(a.ctypes.data for a in arrays)
        hi = max(a.ctypes.data + a.nbytes for a in arrays)
        start, end = lo - lo % page, -(-hi // page) * page
        err = torch.cuda.cudart().cudaHostRegister(start, end - start, 0)
        code = int(getattr(err, "value", err))
        if code != 0:
            warnings.warn(f"cudaHostRegister failed (error {code}); rollout copies will not be asynchronous")
            return
        self.ptr, self.nbytes = start, end - start

    @property
    def pinned(self) -> bool:
        return self.ptr is not None

    def release(self) -> None:
        if self.ptr is not None:
            torch.cuda.synchronize()  # no copy from these pages may still be in flight
            err = torch.cuda.cudart().cudaHostUnregister(self.ptr)
            self.ptr = None
            code = int(getattr(err, "value", err))
            if code != 0:
                warnings.warn(f"cudaHostUnregister failed (error {code})")


# ============================================================================ rollout
class Rollout:
    """Tensors over the backend's ``[T+1, N, ...]`` buffers plus the learner's own
    ``[T, N]`` arrays (values, log-probs, advantages, returns).

    On CPU ``obs``, ``actions``, ``rewards``, ``terminated``, ``truncated`` and
    ``final_obs`` are ``torch.from_numpy`` views of the backend buffers (for the engine:
    its shared memory). With CUDA, ``obs_dev`` is a device buffer filled slot by slot
    as the policy acts, and the categorical actions are sampled on the device.
    """

    def __init__(self, backend, policy: ActorCritic, T: int, device: torch.device):
        self.backend, self.T, self.N, self.device = backend, T, backend.num_envs, device
        self.cuda = device.type == "cuda"
        self.obs = torch.from_numpy(backend.obs)  # [T+1, N, *obs_shape]
        self.final_obs = torch.from_numpy(backend.final_obs)
        self.act = torch.from_numpy(backend.act)  # [T+1, N, *act_shape], what the env gets
        self.rewards = torch.from_numpy(backend.rewards)
        self.terminated = torch.from_numpy(backend.terminated)
        self.truncated = torch.from_numpy(backend.truncated)
        T, N = self.T, self.N
        dist = policy.dist
        self.gaussian = isinstance(dist, GaussianDist)
        dev = device
        pin = self.cuda
        # Learner-side arrays (numpy views kept for fastvec.gae).
        self.values_np = _alloc((T + 1, N), np.float32, pin)
        self.next_values_np = _alloc((T, N), np.float32, pin)
        self.adv_np = _alloc((T, N), np.float32, pin)
        self.ret_np = _alloc((T, N), np.float32, pin)
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


def compute_gae_targets(rewards, values, next_values, terminated, truncated, gamma, lam, out=None):
    """Thin wrapper over :func:`fastvec.gae` (kept separate for the tests)."""
    from .gae import gae

    return gae(rewards, values, next_values, terminated, truncated, gamma, lam, out=out)


# ============================================================================ trainer
def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda requested but CUDA is not available")
    return dev


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


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
            flat[off:off + n].copy_(p.reshape(-1))
            p.data = flat[off:off + n].view_as(p)
            p.grad = grad[off:off + n].view_as(p)
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
        bc1 = 1.0 - b1 ** self.t
        bc2 = 1.0 - b2 ** self.t
        with torch.no_grad():
            self.m.lerp_(g, 1.0 - b1)
            self.v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            torch.sqrt(self.v, out=self._denom).div_(math.sqrt(bc2)).add_(self.eps)
            self.param.addcdiv_(self.m, self._denom, value=-self.lr / bc1)

    def state_dict(self) -> dict:
        return {"m": self.m, "v": self.v, "t": self.t, "lr": self.lr, "eps": self.eps,
                "betas": (self.b1, self.b2)}


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


class _EpisodeTracker:
    """Episode returns and lengths from a rollout's rewards and flags, vectorised over
    time (a Python loop only over the episodes that ended)."""

    def __init__(self, n: int, window: int):
        self.ret = np.zeros(n)
        self.len = np.zeros(n, np.int64)
        self.window = collections.deque(maxlen=window)
        self.recent_returns: list[float] = []
        self.recent_lengths: list[int] = []
        self.episodes = 0

    def update(self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> None:
        T = rewards.shape[0]
        done = terminated | truncated
        if not done.any():
            self.ret += rewards.sum(0)
            self.len += T
            return
        cum = np.cumsum(rewards, 0)
        base_r = np.zeros_like(self.ret)
        base_t = np.zeros_like(self.len)
        ts, ns = np.nonzero(done)
        for t, n in zip(ts.tolist(), ns.tolist()):
            r = float(self.ret[n] + cum[t, n] - base_r[n])
            length = int(self.len[n] + t + 1 - base_t[n])
            self.window.append(r)
            self.recent_returns.append(r)
            self.recent_lengths.append(length)
            self.ret[n] = 0.0
            self.len[n] = 0
            base_r[n] = cum[t, n]
            base_t[n] = t + 1
        self.episodes += len(ts)
        self.ret += cum[-1] - base_r
        self.len += T - base_t

    def mean(self):
        return float(np.mean(self.window)) if self.window else None

    def full(self) -> bool:
        return len(self.window) == self.window.maxlen

    def drain(self):
        r, l = self.recent_returns, self.recent_lengths
        self.recent_returns, self.recent_lengths = [], []
        return r, l


class _RewardScaler:
    """SB3 VecNormalize-style reward scaling: divide by the running std of the
    discounted return (per env), clip to +-10."""

    def __init__(self, n: int, gamma: float, clip: float = 10.0, eps: float = 1e-8):
        self.acc = np.zeros(n)
        self.gamma, self.clip, self.eps = gamma, clip, eps
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    def __call__(self, rewards, done) -> np.ndarray:
        T = rewards.shape[0]
        rets = np.empty_like(rewards)
        for t in range(T):
            self.acc = self.acc * self.gamma + rewards[t]
            rets[t] = self.acc
            self.acc[done[t]] = 0.0
        b_mean, b_var, n = rets.mean(), rets.var(), rets.size
        delta = b_mean - self.mean
        tot = self.count + n
        self.mean += delta * n / tot
        self.var = (self.var * self.count + b_var * n + delta ** 2 * self.count * n / tot) / tot
        self.count = tot
        return np.clip(rewards / math.sqrt(self.var + self.eps), -self.clip, self.clip).astype(np.float32)


class PPO:
    """The trainer's state: backend, policy, optimiser, rollout, statistics."""

    def __init__(self, cfg: PPOConfig, backend, device: torch.device, policy: ActorCritic | None = None):
        self.cfg, self.backend, self.device = cfg, backend, device
        obs_space, act_space = backend.single_observation_space, backend.single_action_space
        # Threads first: results (even the initial weights) depend on the thread count.
        cnn = is_image_space(obs_space)
        self.act_threads = cfg.torch_threads or (_cores() if cnn else 1)
        self.learn_threads = cfg.learn_threads or cfg.torch_threads or (_cores() if cnn else 1)
        self._threads = None
        self._set_threads(self.learn_threads)
        self.policy = policy or make_policy(
            obs_space, act_space, hidden=cfg.hidden, activation=cfg.activation, ortho_init=cfg.ortho_init,
            log_std_init=cfg.log_std_init, normalize_obs=cfg.normalize_obs)
        self.policy.to(device)
        self.flat_param, self.flat_grad = flatten_parameters(self.policy)
        self.opt = FlatAdam(self.flat_param, cfg.lr, cfg.adam_eps)
        self.T, self.N = cfg.n_steps, backend.num_envs
        self.rollout = Rollout(backend, self.policy, self.T, device)
        self.tracker = _EpisodeTracker(self.N, cfg.return_window)
        self.reward_scaler = _RewardScaler(self.N, cfg.gamma) if cfg.normalize_reward else None
        self.env_steps = 0
        self.updates = 0
        self.curve: list[tuple[int, float]] = []
        self.stats: dict = {}
        self.t_act = self.t_env = self.t_learn = self.t_prep = 0.0
        self._batch = self.T * self.N
        self.num_updates = max(1, cfg.total_steps // self._batch)

    def _set_threads(self, n: int) -> None:
        if self._threads != n:
            torch.set_num_threads(n)
            self._threads = n

    # ------------------------------------------------------------------ acting
    def collect(self) -> None:
        """One rollout of T steps on every env (see the module docstring)."""
        ro, T = self.rollout, self.T
        self._set_threads(self.act_threads)
        policy_act = self.policy.act_
        step = self.backend.step
        obs_s, act_s, noise_s, raw_s = ro.obs_slots, ro.act_slots, ro.noise_slots, ro.raw_slots
        logp_s, val_s = ro.logp_slots, ro.value_slots
        perf = time.perf_counter
        t_act = t_env = 0.0
        with torch.inference_mode():
            self.policy.dist.sample_noise(ro.noise)
            if ro.cuda:
                obs_h, act_h = ro.obs_host_slots, ro.act_host_slots
                for t in range(T):
                    t0 = perf()
                    obs_s[t].copy_(obs_h[t], non_blocking=True)
                    policy_act(obs_s[t], noise_s[t], act_s[t + 1], raw_s[t], logp_s[t], val_s[t])
                    act_h[t + 1].copy_(act_s[t + 1])  # synchronous: the env needs it now
                    t1 = perf()
                    step(t + 1)
                    t_env += perf() - t1
                    t_act += t1 - t0
                obs_s[T].copy_(obs_h[T], non_blocking=True)
            else:
                for t in range(T):
                    t0 = perf()
                    policy_act(obs_s[t], noise_s[t], act_s[t + 1], raw_s[t], logp_s[t], val_s[t])
                    t1 = perf()
                    step(t + 1)
                    t_env += perf() - t1
                    t_act += t1 - t0
        self.t_act += t_act
        self.t_env += t_env
        self.last_env_latency = t_env / T
        self.last_act_latency = t_act / T
        self.env_steps += T * self.N
        b = self.backend
        tr = self.tracker
        n_before = tr.episodes
        tr.update(b.rewards[1:], b.terminated[1:], b.truncated[1:])
        if tr.episodes != n_before:  # for the learning-curve PNG
            self.curve.append((self.env_steps, tr.mean()))

    # ------------------------------------------------------------------ targets
    @torch.no_grad()
    def prepare(self) -> None:
        """Values, old log-probs, truncation bootstrap and GAE for the rollout."""
        t0 = time.perf_counter()
        cfg, ro, b, T, N = self.cfg, self.rollout, self.backend, self.T, self.N
        pol = self.policy
        self._set_threads(self.learn_threads)
        if pol.obs_norm is not None:
            pol.update_obs_norm(ro.obs_dev[1:])
        if not pol.values_at_act:
            # One batched pass over the rollout (the policy did not change while acting).
            flat = ro.obs_dev.reshape((T + 1) * N, *ro.obs.shape[2:])
            params, v = pol.params_and_value(flat)
            ro.values.copy_(v.view(T + 1, N))
            ro.logp.copy_(pol.dist.log_prob(params[: T * N], ro.batch_actions()).view(T, N))
        else:
            ro.values[T].copy_(pol.value(ro.obs_slots[T]))
        if ro.cuda:
            ro.values_host.copy_(ro.values)  # device -> pinned host, synchronous
        term, trunc = b.terminated[1:], b.truncated[1:]
        np.copyto(ro.next_values_np, ro.values_np[1:])
        boot = trunc & ~term
        if boot.any():
            ts, ns = np.nonzero(boot)
            final = torch.from_numpy(b.final_obs[1:][ts, ns]).to(self.device)
            ro.next_values_np[ts, ns] = pol.value(final).float().cpu().numpy()
        rewards = b.rewards[1:]
        if self.reward_scaler is not None:
            rewards = self.reward_scaler(rewards, term | trunc)
        compute_gae_targets(rewards, ro.values_np[:T], ro.next_values_np, term, trunc,
                            cfg.gamma, cfg.gae_lambda, out=(ro.adv_np, ro.ret_np))
        if ro.cuda:
            ro.adv.copy_(torch.from_numpy(ro.adv_np), non_blocking=True)
            ro.ret.copy_(torch.from_numpy(ro.ret_np), non_blocking=True)
        self.t_prep += time.perf_counter() - t0

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
        cfg, ro, pol = self.cfg, self.rollout, self.policy
        self._set_threads(self.learn_threads)
        frac = max(1.0 - self.updates / self.num_updates, 0.0)
        lr = cfg.lr * frac if cfg.anneal_lr else cfg.lr
        self.opt.lr = lr
        clip = max(cfg.clip_coef * frac if cfg.anneal_clip else cfg.clip_coef, 1e-8)
        B = self._batch
        mb = min(cfg.minibatch_size, B)
        obs = ro.batch_obs()
        acts = ro.batch_actions()
        adv = ro.adv.view(B)
        if cfg.norm_adv and B > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        cols = [ro.logp.view(B, 1), adv.view(B, 1), ro.ret.view(B, 1), ro.values[: self.T].reshape(B, 1)]
        packed_obs = pol.packable_obs
        if packed_obs:
            D = pol.obs_dim
            data = torch.cat([obs.reshape(B, D).float(), *cols], 1)
        else:
            D = 0
            data = torch.cat(cols, 1)
        grad, max_norm = self.flat_grad, cfg.max_grad_norm
        clip_vf, ent_coef, vf_coef, target_kl = cfg.clip_vf, cfg.ent_coef, cfg.vf_coef, cfg.target_kl
        dist = pol.dist
        stats = collections.defaultdict(list)
        stop = False
        epochs_done = 0
        n_mb = 0
        for epoch in range(cfg.n_epochs):
            last_epoch = epoch == cfg.n_epochs - 1
            want_stats = last_epoch or target_kl is not None
            if mb < B:
                perm = torch.randperm(B, device=self.device)
                data_e, acts_e = data[perm], acts[perm]
                obs_e = None if packed_obs else obs[perm]
            else:
                data_e, acts_e, obs_e = data, acts, (None if packed_obs else obs)
            for start in range(0, B - 1, mb):
                rows = data_e[start:start + mb]
                if rows.shape[0] < 2:
                    continue
                a = acts_e[start:start + mb]
                o = rows[:, :D] if packed_obs else obs_e[start:start + mb]
                olp, adv_b, ret, ov = rows[:, D], rows[:, D + 1], rows[:, D + 2], rows[:, D + 3]
                params, v = pol.params_and_value(o)
                logp, ent = dist.log_prob_entropy(params, a, need_entropy=bool(ent_coef) or want_stats)
                logratio = logp - olp
                ratio = logratio.exp()
                pg_loss = -torch.min(adv_b * ratio, adv_b * ratio.clamp(1.0 - clip, 1.0 + clip)).mean()
                if clip_vf is not None:
                    v_clipped = ov + (v - ov).clamp(-clip_vf, clip_vf)
                    v_loss = torch.max((v - ret).square(), (v_clipped - ret).square()).mean()
                else:
                    v_loss = (v - ret).square().mean()
                loss = pg_loss + (0.5 * vf_coef) * v_loss
                if ent_coef:
                    ent_mean = ent.mean()
                    loss = loss - ent_coef * ent_mean
                if want_stats:
                    with torch.no_grad():
                        approx_kl = ((ratio - 1.0) - logratio).mean()
                        if target_kl is not None and approx_kl.item() > 1.5 * target_kl:
                            stop = True
                            stats["kl"].append(approx_kl)
                            break
                        stats["kl"].append(approx_kl)
                        stats["cf"].append(((ratio - 1.0).abs() > clip).float().mean())
                        stats["pg"].append(pg_loss.detach())
                        stats["v"].append(0.5 * v_loss.detach())
                        stats["ent"].append(ent.detach().mean())
                grad.zero_()
                loss.backward()
                # clip_grad_norm_ on the one flat gradient
                grad.mul_((max_norm / (grad.norm() + 1e-6)).clamp_(max=1.0))
                self.opt.step()
                n_mb += 1
            epochs_done = epoch + 1
            if stop:
                break
        self.updates += 1
        if ro.cuda:
            torch.cuda.synchronize()
        self.t_learn += time.perf_counter() - t0
        self._learn_samples = getattr(self, "_learn_samples", 0) + n_mb * mb
        self.grad_steps = getattr(self, "grad_steps", 0) + n_mb
        self._last_stats = (stats, lr, clip, epochs_done, stop)

    def summarize(self) -> dict:
        """Losses etc. of the last update (reads tensors: call at logging time only)."""
        if not hasattr(self, "_last_stats"):
            return {}
        stats, lr, clip, epochs_done, stop = self._last_stats
        ro, T = self.rollout, self.T

        def mean(key):
            xs = stats.get(key)
            return float(torch.stack(xs).mean()) if xs else None

        with torch.no_grad():
            ret = ro.ret.reshape(-1)
            v = ro.values[:T].reshape(-1)
            var_y = ret.var()
            ev = float(1.0 - (ret - v).var() / var_y) if var_y > 0 else float("nan")
        out = {
            "losses/policy": mean("pg"), "losses/value": mean("v"), "losses/entropy": mean("ent"),
            "losses/approx_kl": mean("kl"), "losses/clip_fraction": mean("cf"),
            "losses/explained_variance": ev, "losses/learning_rate": lr, "losses/clip_coef": clip,
            "losses/epochs": epochs_done, "losses/kl_early_stop": int(stop),
        }
        if isinstance(self.policy.dist, GaussianDist):
            out["losses/action_std"] = float(self.policy.dist.log_std.detach().exp().mean())
        return out


# ============================================================================ checkpoints
def save_checkpoint(path: str, ppo: PPO, env_id: str | None, env_kwargs: dict | None, extra=None) -> str:
    pol = ppo.policy
    state = {k: v.detach().cpu().clone() for k, v in pol.state_dict().items()}
    ckpt = {
        "format": CHECKPOINT_FORMAT,
        "env_id": env_id,
        "env_kwargs": dict(env_kwargs or {}),
        "config": ppo.cfg.to_dict(),
        "observation_space": ppo.backend.single_observation_space,
        "action_space": ppo.backend.single_action_space,
        "policy": describe_policy(pol),
        "state_dict": state,
        "env_steps": ppo.env_steps,
        "extra": extra or {},
    }
    tmp = path + ".tmp"
    torch.save(ckpt, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str) -> dict:
    """Load a checkpoint written by ``fastvec train``; ValueError with a one-line
    message if the file is missing or is not one."""
    if not os.path.exists(path):
        raise ValueError(f"checkpoint not found: {path}")
    if os.path.isdir(path):
        cand = os.path.join(path, "checkpoint.pt")
        if not os.path.exists(cand):
            raise ValueError(f"{path} is a directory without checkpoint.pt")
        path = cand
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ValueError(f"{path} is not a readable checkpoint: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a fastvec PPO checkpoint")
    return ckpt


def policy_from_checkpoint(ckpt: dict) -> ActorCritic:
    c = ckpt["config"]
    pol = make_policy(ckpt["observation_space"], ckpt["action_space"], hidden=tuple(c["hidden"]),
                      activation=c["activation"], ortho_init=False, log_std_init=c["log_std_init"],
                      normalize_obs=c["normalize_obs"])
    pol.load_state_dict(ckpt["state_dict"])
    pol.eval()
    return pol


def _check_spaces(ckpt: dict, obs_space, act_space, env_id) -> None:
    if ckpt["observation_space"] != obs_space or ckpt["action_space"] != act_space:
        raise ValueError(
            f"checkpoint spaces (obs {ckpt['observation_space']}, actions {ckpt['action_space']}) "
            f"do not match {env_id} (obs {obs_space}, actions {act_space})"
        )


# ============================================================================ train
def train(env_id: str | None = None, config: PPOConfig | None = None, *, venv=None,
          env_kwargs: dict | None = None, run_dir: str | None = None, progress: bool = True,
          tensorboard: bool = True, init_from: str | dict | None = None,
          save: bool = True, backend: str = "engine", ray_address: str | None = None,
          ray_actors: int | None = None) -> dict:
    """Train PPO; returns a result dict (``solved``, ``env_steps``, ``wall_seconds``,
    ``final_mean_return``, ``sps`` ...).

    ``venv``: train on this vector env (gymnasium ``VectorEnv`` with same-step autoreset,
    or SB3 ``VecEnv``) instead of starting a fastvec engine for ``env_id``. The caller
    keeps ownership (it is not closed).
    ``run_dir``: where TensorBoard events, ``metrics.jsonl``, ``learning_curve.png`` and
    ``checkpoint.pt`` go (None: no files at all).
    ``backend``: ``"engine"`` (this machine) or ``"ray"``: the envs run in Ray actors
    (``fastvec.ray.RayEngine``) on the cluster at ``ray_address`` (None: a local Ray
    instance on 127.0.0.1), ``ray_actors`` of them (default: one per node);
    ``num_workers`` is then the worker processes per actor (started by a fork server in
    each actor: ``context`` does not apply).
    """
    from .monitor import Monitor, process_rss, worker_health
    from .presets import env_factory, solve_threshold

    cfg = (config or PPOConfig()).validate()
    device = _resolve_device(cfg.device)
    if env_id is None and venv is None:
        raise ValueError("give an env id or a vector env")
    if backend not in ("engine", "ray"):
        raise ValueError(f"backend must be 'engine' or 'ray', got {backend!r}")
    if backend != "ray" and (ray_address is not None or ray_actors is not None):
        raise ValueError("ray_address and ray_actors need backend='ray'")
    if backend == "ray" and venv is not None:
        raise ValueError("backend='ray' starts its own envs: pass an env id, not a vector env")
    ckpt = None
    if init_from is not None:
        ckpt = load_checkpoint(init_from) if isinstance(init_from, str) else init_from
        if env_id is not None and ckpt.get("env_id") not in (None, env_id):
            raise ValueError(f"checkpoint was trained on {ckpt['env_id']}, not {env_id}")
    monitor = Monitor(run_dir, tensorboard=tensorboard) if run_dir else Monitor(None)
    threshold = cfg.solve_return
    if threshold is None and cfg.stop_at_return is not None:
        threshold = cfg.stop_at_return
    if threshold is None and env_id is not None:
        threshold = solve_threshold(env_id)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    warm_up_torch()

    # ---- the clock starts here: env start-up is part of the wall time
    t_start = time.perf_counter()
    try:
        if venv is None and backend == "ray":
            from .ray import RayEngine

            fns = [env_factory(env_id, env_kwargs)] * cfg.num_envs
            engine = RayEngine(fns, num_slots=cfg.n_steps + 1, autoreset_mode="same_step",
                               ray_address=ray_address, num_actors=ray_actors,
                               workers_per_actor=cfg.num_workers, spin_us=cfg.spin_us)
            try:
                backend = EngineBackend(fns, cfg.n_steps + 1, engine=engine, kind="fastvec-ray")
            except BaseException:
                engine.close()
                raise
        elif venv is None:
            fns = [env_factory(env_id, env_kwargs)] * cfg.num_envs
            backend = EngineBackend(fns, cfg.n_steps + 1, cfg.num_workers, cfg.context, cfg.spin_us)
        else:
            backend = make_backend(venv, cfg.n_steps + 1, pin=device.type == "cuda")
    except BaseException:
        monitor.close()
        raise
    pin = None
    ppo = None
    bar = None
    solved = False
    try:
        if ckpt is not None:
            _check_spaces(ckpt, backend.single_observation_space, backend.single_action_space,
                          env_id or "this env")
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True
            pin = HostPin(backend.arrays()) if backend.arrays() else None
        policy = None
        if ckpt is not None:
            policy = policy_from_checkpoint(ckpt)
            policy.train()
        ppo = PPO(cfg, backend, device, policy)
        backend.reset(cfg.seed)
        t_ready = time.perf_counter()
        monitor.text("config", "```\n" + json.dumps(cfg.to_dict(), indent=1) + "\n```")
        monitor.text("policy", describe_policy(ppo.policy))
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=cfg.total_steps, unit="step", unit_scale=True, file=sys.stderr,
                       mininterval=0.5, dynamic_ncols=True, desc=env_id or "train", leave=False)
        last_log_t, last_log_steps, last_learn = t_ready, 0, 0.0
        last_samples = 0
        pids = backend.worker_pids
        ro = ppo.rollout
        obs0, obsT = ro.obs[0], ro.obs[ro.T]
        while ppo.env_steps < cfg.total_steps:
            ppo.collect()
            if bar is not None:
                bar.update(ppo.T * ppo.N)
            mean_ret = ppo.tracker.mean()
            if (cfg.stop_at_return is not None and ppo.tracker.full()
                    and mean_ret >= cfg.stop_at_return):
                solved = True
                break
            if ppo.env_steps >= cfg.total_steps:
                break
            ppo.prepare()
            ppo.update()
            obs0.copy_(obsT)  # the next rollout starts where this one ended
            now = time.perf_counter()
            if now - last_log_t >= cfg.log_every_s:
                dt = now - last_log_t
                rets, lens = ppo.tracker.drain()
                scal = {
                    "charts/mean_return": mean_ret,
                    "charts/mean_episode_length": float(np.mean(lens)) if lens else None,
                    "charts/episodes": ppo.tracker.episodes,
                    "charts/env_sps": (ppo.env_steps - last_log_steps) / dt,
                    "charts/env_sps_overall": ppo.env_steps / (now - t_start),
                    "charts/learner_sps": ((ppo._learn_samples - last_samples)
                                           / max(ppo.t_learn - last_learn, 1e-9)),
                    "time/act_s": ppo.t_act, "time/env_s": ppo.t_env,
                    "time/prepare_s": ppo.t_prep, "time/learn_s": ppo.t_learn,
                    "health/step_latency_us": ppo.last_env_latency * 1e6,
                    "health/act_latency_us": ppo.last_act_latency * 1e6,
                    **ppo.summarize(),
                }
                if pids:
                    h = worker_health(pids)
                    scal["health/workers_alive"] = h.get("workers_alive")
                    scal["health/workers_rss_mb"] = h.get("workers_rss_bytes", 0) / 2**20
                rss = process_rss()
                if rss:
                    scal["health/main_rss_mb"] = rss["main"] / 2**20
                monitor.log(ppo.env_steps, scal, {"charts/episode_returns": rets,
                                                  "charts/episode_lengths": lens})
                if bar is not None and mean_ret is not None:
                    bar.set_postfix_str(f"return {mean_ret:.1f}", refresh=False)
                last_log_t, last_log_steps = now, ppo.env_steps
                last_learn, last_samples = ppo.t_learn, ppo._learn_samples
        wall = time.perf_counter() - t_start
    except BaseException:
        monitor.close()
        raise
    finally:
        if bar is not None:
            bar.close()
        if pin is not None:
            pin.release()
        backend.close()
    final_mean = ppo.tracker.mean()
    if cfg.stop_at_return is None and threshold is not None and final_mean is not None:
        solved = ppo.tracker.full() and final_mean >= threshold
    result = {
        "env_id": env_id,
        "solved": bool(solved),
        "env_steps": int(ppo.env_steps),
        "wall_seconds": round(wall, 4),
        "final_mean_return": None if final_mean is None else round(final_mean, 4),
        "sps": round(ppo.env_steps / wall, 1),
        "episodes": ppo.tracker.episodes,
        "updates": ppo.updates,
        "grad_steps": getattr(ppo, "grad_steps", 0),
        "seed": cfg.seed,
        "num_envs": ppo.N,
        "num_workers": getattr(backend, "num_workers", None),
        "backend": backend.kind,
        "device": str(device),
        "policy": describe_policy(ppo.policy),
        "threshold": threshold,
        "startup_seconds": round(t_ready - t_start, 4),
        "time_breakdown": {"act": round(ppo.t_act, 4), "env": round(ppo.t_env, 4),
                           "prepare": round(ppo.t_prep, 4), "learn": round(ppo.t_learn, 4)},
        "learner_sps": round(getattr(ppo, "_learn_samples", 0) / ppo.t_learn, 1) if ppo.t_learn else None,
    }
    # final logging point, checkpoint, plot
    rets, lens = ppo.tracker.drain()
    monitor.log(ppo.env_steps, {"charts/mean_return": final_mean,
                                "charts/env_sps_overall": result["sps"], **ppo.summarize()},
                {"charts/episode_returns": rets, "charts/episode_lengths": lens})
    if run_dir:
        result["run_dir"] = run_dir
        if save:
            result["checkpoint"] = save_checkpoint(os.path.join(run_dir, "checkpoint.pt"), ppo, env_id,
                                                   env_kwargs, extra={"result": dict(result)})
        monitor.plot(title=f"{env_id or backend.kind} seed {cfg.seed}", curve=ppo.curve,
                     threshold=threshold)
        with open(os.path.join(run_dir, "result.json"), "w") as f:
            json.dump(result, f, indent=1)
    monitor.close()
    return result


# ============================================================================ eval
def evaluate(checkpoint, episodes: int = 10, seed: int = 0, deterministic: bool = True,
             env_id: str | None = None, num_envs: int | None = None) -> dict:
    """Run ``episodes`` episodes of a checkpoint's policy (in-process, vectorised).

    Episodes are spread evenly over the envs (each env runs its share, as SB3's
    ``evaluate_policy``), so short episodes are not over-represented.
    """
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from .presets import check_env_id, env_factory

    ckpt = load_checkpoint(checkpoint) if isinstance(checkpoint, str) else checkpoint
    ck_env = ckpt.get("env_id")
    if env_id is not None and ck_env is not None and env_id != ck_env:
        raise ValueError(f"checkpoint was trained on {ck_env}, not {env_id}")
    env_id = env_id or ck_env
    if env_id is None:
        raise ValueError("the checkpoint does not name its env; pass env_id")
    check_env_id(env_id)
    if episodes < 1:
        raise ValueError(f"episodes must be a positive integer, got {episodes}")
    n = min(episodes, num_envs or 8)
    fn = env_factory(env_id, ckpt.get("env_kwargs"))
    venv = SyncVectorEnv([fn] * n, autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        _check_spaces(ckpt, venv.single_observation_space, venv.single_action_space, env_id)
        torch.set_num_threads(1)
        pol = policy_from_checkpoint(ckpt)
        targets = np.array([(episodes + i) // n for i in range(n)])
        counts = np.zeros(n, np.int64)
        ep_ret, ep_len = np.zeros(n), np.zeros(n, np.int64)
        returns, lengths = [], []
        obs, _ = venv.reset(seed=seed)
        t0 = time.perf_counter()
        while (counts < targets).any():
            act = pol.predict(obs, deterministic=deterministic)
            if isinstance(venv.single_action_space, gym.spaces.Box):
                act = act.astype(venv.single_action_space.dtype)
            obs, r, term, trunc, _ = venv.step(act)
            ep_ret += r
            ep_len += 1
            for i in np.flatnonzero(term | trunc):
                if counts[i] < targets[i]:
                    returns.append(float(ep_ret[i]))
                    lengths.append(int(ep_len[i]))
                    counts[i] += 1
                ep_ret[i], ep_len[i] = 0.0, 0
        wall = time.perf_counter() - t0
    finally:
        venv.close()
    return {
        "env_id": env_id, "episodes": len(returns), "mean_return": float(np.mean(returns)),
        "std_return": float(np.std(returns)), "min_return": float(np.min(returns)),
        "max_return": float(np.max(returns)), "mean_length": float(np.mean(lengths)),
        "deterministic": deterministic, "seed": seed, "wall_seconds": round(wall, 3),
    }


# ============================================================================ bench hook
def time_to_solve(env_id: str = "CartPole-v1", seeds=(0, 1, 2), threshold: float | None = None,
                  overrides=(), max_steps: int = 200_000) -> dict:
    """Wall time of ``fastvec train ENV --stop-at-return THRESHOLD`` per seed (in this
    process, preset hyperparameters), for ``fastvec bench --train``. The side-by-side
    comparison with SB3 is ``benchmarks/bench_train.py``."""
    import statistics

    from .presets import preset_for, solve_threshold

    threshold = solve_threshold(env_id) if threshold is None else threshold
    runs = []
    for seed in seeds:
        cfg = apply_overrides(PPOConfig(), preset_for(env_id))
        cfg.seed, cfg.stop_at_return, cfg.total_steps = seed, threshold, max_steps
        apply_overrides(cfg, list(overrides))
        r = train(env_id, cfg, progress=False, tensorboard=False)
        runs.append({k: r[k] for k in ("seed", "solved", "env_steps", "wall_seconds", "sps")})
    return {
        "env_id": env_id, "threshold": threshold, "runs": runs,
        "solved": sum(r["solved"] for r in runs), "seeds": len(runs),
        "median_wall_seconds": statistics.median(r["wall_seconds"] for r in runs),
        "median_env_steps": statistics.median(r["env_steps"] for r in runs),
    }
