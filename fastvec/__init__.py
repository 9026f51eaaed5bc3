"""fastvec: shared-memory, zero-copy vector environments, a Cython GAE and a PPO trainer.

Front doors:

- ``fastvec.AsyncVectorEnv``: a ``gymnasium.vector.VectorEnv``.
- ``fastvec.SubprocVecEnv``: Stable-Baselines3's ``VecEnv`` API (SB3 optional).
- ``fastvec.AgentVectorEnv``, ``fastvec.AgentVecEnv``: the same for PettingZoo
  ``ParallelEnv`` copies, one row per agent.

Both run on ``fastvec.Engine``. ``fastvec.gae`` computes GAE over ``[T, N]`` rollouts,
``fastvec.vtrace`` its off-policy counterpart (V-trace's importance-clipped targets).
``fastvec.ray`` (optional, ``pip install "fastvec[ray]"``, imported only on request) has
the same two doors over Ray actors spread across a cluster.
"""

from .errors import ClosedError, WorkerError
from .returns import gae, gae_from_dones, vtrace

__version__ = "0.1.0"

# Imported on first use: SubprocVecEnv pulls in SB3 (and so torch) when it is installed.
_LAZY = {
    "Engine": ("fastvec.engine", "Engine"),
    "AsyncVectorEnv": ("fastvec.doors.gymnasium", "AsyncVectorEnv"),
    "SubprocVecEnv": ("fastvec.doors.sb3", "SubprocVecEnv"),
    "PlacementReport": ("fastvec._core.placement", "PlacementReport"),
    "AgentVectorEnv": ("fastvec.doors.gymnasium_agents", "AgentVectorEnv"),
    "AgentVecEnv": ("fastvec.doors.sb3_agents", "AgentVecEnv"),
}

__all__ = ["WorkerError", "ClosedError", "gae", "gae_from_dones", "vtrace", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fastvec' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
