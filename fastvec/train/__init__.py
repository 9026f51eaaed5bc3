"""PPO on fastvec: ``fastvec train`` and ``fastvec eval`` as a package (imports torch).

The trainer in layers, one subpackage each, each importing only the layers above it in
this list (``tests/test_house.py`` keeps the order; ``docs/ARCHITECTURE.md`` draws it):

- ``config``: ``PPOConfig`` and its rules, ``--set`` overrides, presets, mixes of envs;
- ``compute``: torch's device, RNG and threads, data-parallel ranks, page-locked memory;
- ``model``: the actor-critic (encoders, cores, distributions) and its acting step;
- ``storage``: rollout storage over the engine's ring (or another vector env), agent
  rows, the learner's tensors over it;
- ``algo``: PPO's collect, targets and update, the optimiser, statistics, checkpoints;
- ``pipelines``: lock-step, or the async collector and its learner process;
- ``run``: the loop over rollouts, its report, run directory and stops;
- ``commands``: ``fastvec train``, ``fastvec eval``, ``fastvec export``, and ``run_training``.

A layer's ``__init__`` lists its modules and exports nothing: a name is imported from the
module that defines it, or, for the public ones, from ``fastvec.train`` (``__all__`` below).

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

from .algo.checkpoints import load_checkpoint, policy_from_checkpoint, resume_checkpoint, save_checkpoint
from .algo.ppo import PPO
from .commands.evaluate import evaluate
from .commands.export import export_policy
from .commands.launch import run_training
from .commands.members import run_members
from .config.overrides import apply_overrides
from .config.presets import env_factory, preset_for, solve_threshold
from .config.settings import ConfigError, PPOConfig, TransportConfig
from .pipelines.watch import LearnerError
from .run.card import write_model_card
from .run.loop import train
from .run.monitor import Monitor
from .run.stops import RestartLimitError
from .storage.sources import EngineStorage, GymVectorStorage, HostPin, RolloutStorage, SB3VecStorage, storage_for

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
    "run_members",
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
    "export_policy",
    "write_model_card",
]
