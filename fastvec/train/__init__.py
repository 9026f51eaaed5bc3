"""PPO on fastvec: ``fastvec train`` and ``fastvec eval`` as a package (imports torch).

The trainer in pieces, each a module (``docs/ARCHITECTURE.md`` draws them):

- **config**: ``config`` (``PPOConfig``, every hyperparameter with a docstring, and its
  ``TransportConfig``: how the envs run), ``overrides`` (``--set`` parsing, what a resume
  may change), ``presets`` (per-env hyperparameters and env construction), ``mix``;
- **policy**: ``policies`` (``ActorCritic``: encoder, core, heads), ``encoders``,
  ``cores``, ``distributions``; ``acting`` (the per-step forward, functional or numpy);
- **storage**: ``storage`` (``RolloutStorage`` and its four kinds), ``rollout`` (the
  learner's tensors over it), ``host_memory`` (page-locking for CUDA);
- **collect**: ``collect`` (the policy acts into the storage, lock-step or by groups);
- **targets**: ``targets`` (values, bootstraps, GAE or V-trace);
- **update**: ``update`` (epochs, minibatches, KL stop, the schedules), ``losses`` and
  ``numpy_learner`` (a minibatch's gradient), ``optim`` (flat parameters, Adam),
  ``lr_schedule``;
- ``ppo``: ``PPO``, the three steps over one policy and rollout, and the train state;
  ``statistics``: episode tracking and reward scaling;
- **schedule**: ``schedule`` (``LockStep``, the protocol), ``pipeline`` (async: the
  collector's end) with ``ring``, ``handoff``, ``wire``, ``learner_process``, ``learner``
  and ``seqlock`` (the learner process and what it shares with the collector);
- **run**: ``run`` (``train(cfg, storage, monitor)``, which builds no envs), ``report``
  (logging points, the result), ``restarts``, ``checkpoints``, ``monitor`` (the run
  directory), ``signals``, ``busy`` (the device's busy fraction), ``runtime`` (torch's
  device, RNG and threads);
- **commands**: ``launch`` (``run_training``: the one place that picks a backend),
  ``cli`` (``fastvec train``), ``evaluate`` (``fastvec eval``).

How a rollout lives in the engine's shared memory: the engine is started with
``num_slots = T + 1`` and ``autoreset_mode="same_step"``; slot 0 holds the first
observation of a rollout; for ``t`` in ``0..T-1`` the policy reads observation slot
``t`` and writes its actions straight into ``act_bufs[0][t + 1]``, then the storage
steps slot ``t + 1`` (``step_async(IN_SLOT, t + 1)``, ``step_wait()``): step ``t``'s
rewards and flags land in slot ``t + 1``, and where an episode ended
``final_bufs[0][t + 1]`` holds its final observation (``obs_bufs`` there already holds
the reset observation). After the rollout, slot ``T`` is copied into slot 0. The
learner reads it all through ``torch.from_numpy`` views: no copy on the CPU; with CUDA
the segment is page-locked so uploads are DMA transfers.

Start method: ``context="fork"`` by default: a forked worker inherits the imported
modules, so start-up is the envs' own construction (measured on 2 cores, 8 envs:
CartPole 1 worker fork 0.02 s vs forkserver 1.0 s and spawn 1.05 s). Workers never call
torch, so forking a parent whose torch thread pools exist is safe. Use
``--set context=spawn`` where fork is unavailable or not wanted.
"""

from .checkpoints import load_checkpoint, policy_from_checkpoint, resume_checkpoint, save_checkpoint
from .config import ConfigError, PPOConfig, TransportConfig
from .evaluate import evaluate
from .launch import run_training
from .learner_process import LearnerError
from .monitor import Monitor
from .overrides import apply_overrides
from .ppo import PPO
from .presets import env_factory, preset_for, solve_threshold
from .restarts import RestartLimitError
from .run import train
from .storage import EngineStorage, GymVectorStorage, HostPin, RolloutStorage, SB3VecStorage, storage_for

__all__ = [
    "PPOConfig",
    "TransportConfig",
    "ConfigError",
    "apply_overrides",
    "preset_for",
    "env_factory",
    "solve_threshold",
    "train",
    "Monitor",
    "run_training",
    "LearnerError",
    "RestartLimitError",
    "PPO",
    "RolloutStorage",
    "EngineStorage",
    "GymVectorStorage",
    "SB3VecStorage",
    "storage_for",
    "HostPin",
    "save_checkpoint",
    "load_checkpoint",
    "resume_checkpoint",
    "policy_from_checkpoint",
    "evaluate",
]
