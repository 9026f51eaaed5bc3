"""The two front doors over Ray: ``fastvec.ray.AsyncVectorEnv`` and ``fastvec.ray.SubprocVecEnv``.

Each is its local door (``fastvec.AsyncVectorEnv``, ``fastvec.SubprocVecEnv``) with a
``RayEngine`` behind it: the same keywords, plus the fields of ``RayPlacement`` (and
``start_timeout``), so a script switches by changing one constructor.
"""

from __future__ import annotations

import inspect

from ..doors.gymnasium import AsyncVectorEnv as _GymDoor
from ..doors.sb3 import SubprocVecEnv as _SB3Door
from .engine import RayEngine
from .placement import RayPlacement

__all__ = ["AsyncVectorEnv", "SubprocVecEnv"]


class _RayDoor:
    _workers_share_our_cores = False  # actors may run on other nodes: torch_threads="auto" keeps out
    """What both Ray doors add to their local door: a ``RayEngine`` and its actors."""

    def __init__(self, env_fns, *args, start_timeout: float | None = 300.0, **kwargs):
        if "num_workers" in kwargs:
            raise TypeError(f"{type(self).__name__} takes workers_per_actor, not num_workers")
        ray_kwargs = {k: kwargs.pop(k) for k in RayPlacement.field_names() if k in kwargs}
        self._ray_placement = RayPlacement(**ray_kwargs)
        self._start_timeout = start_timeout
        super().__init__(env_fns, *args, **kwargs)

    def _make_engine(self, env_fns, options, num_workers, placement="contiguous", env_costs=None) -> RayEngine:
        # num_workers: the actors' worker processes come from workers_per_actor
        if not (isinstance(placement, str) and placement == "contiguous") or env_costs is not None:
            raise ValueError("placement and env_costs are not available on Ray: actors run contiguous runs of envs")
        return RayEngine(env_fns, options.replace(start_timeout=self._start_timeout), self._ray_placement)

    @property
    def num_actors(self) -> int:
        return self._engine.num_actors

    def __repr__(self) -> str:
        return f"fastvec.ray.{type(self).__name__}(num_envs={self.num_envs}, num_actors={self._engine.num_actors})"


def _signature(local_door) -> inspect.Signature:
    """The local door's signature (less ``num_workers``) with the Ray keywords: for
    ``help()`` and editors."""
    params = [
        p
        for name, p in inspect.signature(local_door.__init__).parameters.items()
        if name != "num_workers" and p.kind is not p.VAR_KEYWORD
    ]
    extra = [inspect.Parameter("start_timeout", inspect.Parameter.KEYWORD_ONLY, default=300.0)]
    extra += [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default)
        for f in RayPlacement.__dataclass_fields__.values()
    ]
    return inspect.Signature(params + extra)


_DOC = """``{local}`` whose envs run in Ray actors over a cluster.

    Ray placement: the fields of ``fastvec.ray.RayPlacement`` (``ray_address``,
    ``num_actors``, ``actors_per_node``, ``envs_per_actor``, ``workers_per_actor``,
    ``num_cpus_per_actor``, ``local_fast_path``, ``ray_init_kwargs``) and
    ``start_timeout``. ``context``, ``spin_us`` and ``main_spin_us`` apply to the actors'
    engines. Everything else: see ``{local}``.
    """


class AsyncVectorEnv(_RayDoor, _GymDoor):
    __doc__ = _DOC.format(local="fastvec.AsyncVectorEnv")

    def __init__(self, env_fns, *args, **kwargs):
        super().__init__(env_fns, *args, **kwargs)


class SubprocVecEnv(_RayDoor, _SB3Door):
    __doc__ = _DOC.format(local="fastvec.SubprocVecEnv")

    def __init__(self, env_fns, *args, **kwargs):
        super().__init__(env_fns, *args, **kwargs)


AsyncVectorEnv.__init__.__signature__ = _signature(_GymDoor)
SubprocVecEnv.__init__.__signature__ = _signature(_SB3Door)
