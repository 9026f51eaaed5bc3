"""fastvec on a Ray cluster: the envs live in Ray actors spread over the nodes.

    import fastvec.ray
    envs = fastvec.ray.AsyncVectorEnv(env_fns)          # was: fastvec.AsyncVectorEnv(env_fns)
    venv = fastvec.ray.SubprocVecEnv(env_fns)           # was: fastvec.SubprocVecEnv(env_fns)

Each actor hosts a node-local ``fastvec.engine.Engine`` over a contiguous group of envs,
so stepping inside a node stays shared-memory and zero-copy. ``RayEngine`` is an
``EngineBase`` (docs/ENGINE_API.md) like the local engine, for the two front doors and
the trainer: the results land in a ring of ``[num_slots, num_envs, ...]`` arrays in
the driver, in one shared-memory segment laid out by the same plan as the engine's.

A step sends every actor its slice of the actions at once and gathers the results as
they arrive. Two transports, chosen per actor:

- an actor on another node (always available): one Ray actor task per step; actions go
  as numpy arrays in the task's arguments, observations, rewards, flags and infos come
  back as numpy arrays through Ray's object store;
- an actor on the driver's own node (``local_fast_path=True``, the default): the actor
  maps the driver's ring, reads its actions from it and writes its results into it; a
  16-byte doorbell on a private Unix socket (the engine's own framing and commands)
  starts the step and the reply carries only the infos. Ray still places, watches and replaces the actor; only the per-step
  messages skip Ray's task machinery (~1 ms per call on a 2-core machine).

A dead actor (killed, its node gone) or one silent past ``step_timeout`` raises
``fastvec.WorkerError`` naming the actor and its envs, never a hang; with
``restart_on_error=True`` the actor is replaced instead, its envs reset and reported as
truncated with ``info["fastvec_restarted"] = True`` (like a replaced worker of the
single-machine engine).

Ray is an optional dependency (``pip install "fastvec[ray]"``); ``import fastvec`` never
imports it. With no ``ray_address`` and no Ray connection in this process, a local Ray
instance is started that listens on 127.0.0.1 only, and stopped when the last vector env
using it closes.

The package:

- ``session``: this process's Ray connection, joined or started;
- ``placement``: where the actors go and which envs each runs (``RayPlacement``);
- ``actor``: the actor, a node-local ``Engine`` over its envs;
- ``calls``: calls to the actors, and the errors of the failures they report;
- ``transport``: a step's dispatch and collection, per actor;
- ``engine``: ``RayEngine``, with its resets and calls in ``resets_calls``;
- ``doors``: the two front doors over it.
"""

from __future__ import annotations

try:
    import ray  # noqa: F401  (the real Ray: a clear message when it is missing)
except ImportError as _exc:  # pragma: no cover - exercised without Ray
    raise ImportError('fastvec.ray needs Ray: install it with `pip install "fastvec[ray]"`') from _exc

from .doors import AsyncVectorEnv, SubprocVecEnv
from .engine import RayEngine
from .placement import RayPlacement
from .session import loopback_only

__all__ = ["RayEngine", "RayPlacement", "AsyncVectorEnv", "SubprocVecEnv", "loopback_only"]
