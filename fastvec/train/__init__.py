"""PPO on fastvec: ``fastvec train`` and ``fastvec eval`` as a package (imports torch).

- ``config``: ``PPOConfig`` (every hyperparameter, a docstring each; the transport
  settings in ``TransportConfig``) and ``--set`` parsing;
- ``storage``: where rollouts live (``RolloutStorage``, the protocol each implements):
  ``EngineStorage`` (the engine's shared memory, zero copy), ``GymVectorStorage`` /
  ``SB3VecStorage`` (copies from another vector env), ``HostPin`` (page-locking for CUDA);
- ``rollout``: the learner's tensors over a storage (views on the CPU, separate device
  buffers filled by copies on a GPU; ``host_memory``: page-locked host memory);
- ``acting``: a policy's per-step forward (``ActingPath``: functional, or numpy on the CPU);
- ``ppo``: acting, targets (GAE) and the clipped update; ``lr_schedule``: the learning
  rate's schedules (linear, constant, adaptive to the KL); ``statistics``: episode
  tracking and reward scaling, kept across rollouts;
- ``loop``: ``train(cfg, storage, monitor)``, which builds no envs;
- ``pipeline``, ``learner``, ``seqlock``: ``pipeline=async``, a learner process beside
  the collector (the collector's end and the ring's K rollouts; the learner process; the
  seqlock its weights come back through);
- ``checkpoints``, ``evaluate``: checkpoints and ``fastvec eval``;
- ``policies``, ``presets``, ``monitor``: the networks, per-env hyperparameters and env
  construction, and the run directory (TensorBoard, ``metrics.jsonl``, plots);
- ``cli``: the commands, and the one place that picks a backend (``run_training``).

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

from .checkpoints import load_checkpoint, policy_from_checkpoint, save_checkpoint
from .config import ConfigError, PPOConfig, TransportConfig, apply_overrides
from .evaluate import evaluate
from .loop import train
from .pipeline import LearnerError
from .ppo import PPO
from .storage import EngineStorage, GymVectorStorage, HostPin, RolloutStorage, SB3VecStorage, storage_for

__all__ = [
    "PPOConfig",
    "TransportConfig",
    "ConfigError",
    "apply_overrides",
    "train",
    "LearnerError",
    "PPO",
    "RolloutStorage",
    "EngineStorage",
    "GymVectorStorage",
    "SB3VecStorage",
    "storage_for",
    "HostPin",
    "save_checkpoint",
    "load_checkpoint",
    "policy_from_checkpoint",
    "evaluate",
]
