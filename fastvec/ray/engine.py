"""``RayEngine``: the engine's interface over Ray actors (see the package docstring)."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Sequence

import cloudpickle
import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._core.actions import ActionWriter
from .._core.base import EngineBase
from .._core.segment import create_segment, leaves_of, plan_segment, release_segment
from ..errors import WorkerError
from ..options import EngineOptions, check_env_fns
from .actor import actor_class, janitor
from .calls import CLOSE_GRACE_S, ActorCalls
from .placement import RayPlacement, plan
from .resets_calls import ActorResetsAndCalls
from .session import client_mode, connect, disconnect
from .transport import StepTransport

__all__ = ["RayEngine"]


class RayEngine(StepTransport, ActorResetsAndCalls, ActorCalls, EngineBase):
    """An ``EngineBase`` over Ray actors, each hosting a node-local
    ``fastvec.engine.Engine`` over a contiguous group of envs.

    For the front doors a "worker" is an actor: ``num_workers`` is the number of actors,
    ``groups[k]`` the envs of actor k, ``WorkerError.worker`` the failed actor.

    Parameters
    ----------
    env_fns : sequence of callables
        Each returns a gymnasium env; cloudpickled (their modules must be importable on
        every node: installed, or in the driver's working directory, which Ray puts on
        the workers' path).
    options : EngineOptions, optional
        As for ``fastvec.engine.Engine`` (``context``, ``spin_us`` and ``main_spin_us``
        apply to the actors' engines; ``context`` defaults to "forkserver" there, so that
        the workers do not inherit the actor's Ray sockets and threads). A silent actor
        is declared failed after ``step_timeout`` plus a grace of
        ``max(1, step_timeout / 2)`` seconds; an env stuck inside an actor is reported by
        that actor's engine after ``step_timeout``.
    placement : RayPlacement, optional
        Where the actors go (``fastvec.ray.RayPlacement``: ``ray_address``,
        ``num_actors``, ``actors_per_node``, ``envs_per_actor``, ``workers_per_actor``,
        ``num_cpus_per_actor``, ``local_fast_path``, ``ray_init_kwargs``).

    The fields of both may also be given as keywords.
    """

    _log_prefix = "fastvec.ray"

    def __init__(
        self,
        env_fns: Sequence[Callable],
        options: EngineOptions | None = None,
        placement: RayPlacement | None = None,
        **kwargs,
    ):
        self._closed = True  # until fully started
        # ---- everything that can be checked before touching Ray
        ray_kwargs = {k: kwargs.pop(k) for k in RayPlacement.field_names() if k in kwargs}
        self._take_options(EngineOptions(**kwargs) if options is None else options.replace(**kwargs))
        self.ray_placement = placement = (
            RayPlacement(**ray_kwargs) if placement is None else dataclasses.replace(placement, **ray_kwargs)
        )
        env_fns = check_env_fns(env_fns)
        self.num_envs = len(env_fns)
        placement.check_envs(self.num_envs)
        self.local_fast_path = placement.local_fast_path
        try:
            cloudpickle.dumps(env_fns[0])
        except Exception as exc:
            raise ValueError(f"could not pickle env_fns[0] for the actors: {exc}") from None

        self._state: dict = {"actors": [], "socks": {}, "owns_ray": None}
        self._finalizer = weakref.finalize(self, _shutdown, self._state)
        self.restarts: list[dict] = []
        self.history: list[dict] = []
        # forkserver by default: an actor is a multi-threaded Ray worker whose gRPC sockets a
        # forked worker would inherit; the fork server starts clean (and costs no start-up time
        # next to the actor's own).
        self._actor_options = self.options.replace(context=self.options.context or "forkserver")
        try:
            self._state["owns_ray"] = connect(placement.ray_address, placement.ray_init_kwargs)
            self._driver_node = ray.get_runtime_context().get_node_id()
            if client_mode():
                # Ray Client: this process is not on any node; its "node" is the client
                # server's, whose shared memory it cannot reach.
                self.local_fast_path = False
            self.groups, self.placement = plan(placement, self.num_envs, ray.nodes(), self._driver_node)
            self.num_actors = self.num_workers = len(self.groups)
            self._env_actor = np.repeat(np.arange(self.num_actors), [b - a for a, b in self.groups])
            self._blobs = []
            for a, b in self.groups:
                try:
                    self._blobs.append(cloudpickle.dumps(env_fns[a:b]))
                except Exception as exc:
                    raise ValueError(f"could not pickle env_fns[{a}:{b}] for the actors: {exc}") from None
            self._start()
        except BaseException:
            self._finalizer()
            raise
        self._closed = False

    def _spawn(self, k: int, soft: bool = False):
        p = self.placement[k]
        a, _b = p["envs"]
        actor = (
            actor_class()
            .options(
                num_cpus=p["num_cpus"],
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=p["node_id"], soft=soft),
            )
            .remote(self._blobs[k], a, p["num_workers"], self._actor_options)
        )
        return actor

    def _start(self) -> None:
        actors = [self._spawn(k) for k in range(self.num_actors)]
        self._actors = actors
        self._state["actors"] = actors
        try:
            hellos = self._gather(
                {k: a.hello.remote() for k, a in enumerate(actors)},
                self.options.start_timeout,
                "starting",
                raise_first=True,
            )
        except WorkerError as exc:
            if "did not answer" not in str(exc):
                raise
            k = exc.worker
            raise WorkerError(
                f"{exc}: is its node short of the {self.placement[k]['num_cpus']:g} CPUs it asks for? "
                "(other actors, e.g. another fastvec.ray vector env, may hold them; "
                "num_cpus_per_actor=0 lifts the reservation)",
                worker=k,
                env_indices=exc.env_indices,
            ) from None
        infos = [hellos[k] for k in range(self.num_actors)]
        first = infos[0]
        for k, info in enumerate(infos):
            self._check_spaces(k, info, first)
            self._adopt(k, info)
        self.single_observation_space = first["observation_space"]
        self.single_action_space = first["action_space"]
        self.env_metadata = first["metadata"]
        self.render_mode = first["render_mode"]
        self.spec = first["spec"]
        self.obs_leaves_info = leaves_of(self.single_observation_space)
        self.act_leaves_info = leaves_of(self.single_action_space)
        self._action_writer = ActionWriter(self.single_action_space, self.num_envs, self.options.action_check)

        # The ring: one segment laid out by the engine's plan, so actors on this node can map it.
        plan = plan_segment(self.single_observation_space, self.single_action_space, self.num_slots, self.num_envs)
        segment = create_segment(plan.size)
        self._state["segment"] = segment
        self.shm_name = segment.name
        self._plan_entries = plan.entries
        arrays = plan.arrays(segment.buf)
        self._bind_ring(arrays)
        self._chunk_plan()
        for k in range(self.num_actors):
            self._open_fast_path(k)

    def _check_spaces(self, k: int, info: dict, first: dict) -> None:
        a = self.groups[k][0]
        for key, what in (("observation_space", "observation"), ("action_space", "action")):
            if info[key] != first[key]:
                raise ValueError(
                    f"env {a} (actor {k}) has {what} space {info[key]}, but env 0 has {first[key]}: "
                    "all envs of a vector env must share their spaces"
                )

    def _adopt(self, k: int, info: dict) -> None:
        p = self.placement[k]
        p["node_id"] = info["node_id"]
        p["pid"] = info["pid"]
        p["worker_pids"] = list(info["worker_pids"])
        p["shm_name"] = info.get("shm_name")
        if self.restart_on_error:  # otherwise the actor removed the name at start-up
            self._state.setdefault("segments", {})[k] = (info["node_id"], [info.get("shm_name")])
        # every process and segment this engine ever had, for leak checks
        self.history.append(
            {
                "actor": k,
                "node_id": info["node_id"],
                "pid": info["pid"],
                "worker_pids": list(info["worker_pids"]),
                "shm_name": info.get("shm_name"),
            }
        )
        p["num_workers"] = info["num_workers"]
        p["fast_path"] = False

    @property
    def worker_pids(self) -> list[int]:
        """Pids of the actor processes (each on its own node)."""
        return [p["pid"] for p in self.placement]

    def process_info(self) -> list[dict]:
        """Per actor, fresh from the actors: node id, actor pid and its engine's worker pids."""
        self._check_usable()
        return [
            self._ray_get(a.processes.remote(), k, self.options.start_timeout, "listing its processes")
            for k, a in enumerate(self._actors)
        ]

    def _unit(self, k: int) -> str:
        return self._actor_desc(k)

    def _restart_record(self, k: int) -> dict:
        return {"worker": k, "actor": k}

    def _replace(self, k: int, slot: int) -> dict:
        """Replace actor k by a fresh one (same node if it is still there) and reset its
        envs into ``slot``: ``{env: reset info}``."""
        a, b = self.groups[k]
        sock = self._state["socks"].pop(k, None)
        if sock is not None:
            sock.close()
        try:
            ray.kill(self._actors[k], no_restart=True)
        except Exception:
            pass
        if k in self._state.get("segments", {}):
            janitor(self._state, *self._state["segments"].pop(k))
        # Its node if that is still alive (Ray's soft affinity may move it even then),
        # any node otherwise.
        alive = any(n.get("Alive") and n["NodeID"] == self.placement[k]["node_id"] for n in ray.nodes())
        self._actors[k] = self._state["actors"][k] = self._spawn(k, soft=not alive)
        self._state.get("lost", set()).discard(k)
        info = self._ray_get(self._actors[k].hello.remote(), k, self.options.start_timeout, "restarting")
        self._check_spaces(
            k, info, {"observation_space": self.single_observation_space, "action_space": self.single_action_space}
        )
        self._adopt(k, info)
        self._open_fast_path(k)
        return self._reset_actors(slot, {k: {j: {} for j in range(b - a)}}, "resetting restarted envs")

    def _drain(self) -> None:
        slot, self._pending_slot = self._pending_slot, None
        self._collect_step(slot, CLOSE_GRACE_S)

    def __repr__(self) -> str:
        return f"fastvec.ray.RayEngine(num_envs={self.num_envs}, num_actors={getattr(self, 'num_actors', '?')})"


def _shutdown(state: dict) -> None:
    """Close sockets, stop the actors, free the ring, let go of Ray. Module-level so a
    finalizer can run it without keeping the engine alive; safe to run twice."""
    for sock in state.get("socks", {}).values():
        try:
            sock.close()
        except OSError:
            pass
    state["socks"] = {}
    actors = list(state.get("actors", []))
    state["actors"] = []
    segments = state.get("segments", {})
    if ray.is_initialized():
        refs = {}
        lost = state.get("lost", set())
        for k, actor in enumerate(actors):
            if actor is None or k in lost:  # dead or silent: no use waiting for it
                continue
            try:  # let each actor close its engine (its workers exit cleanly) ...
                refs[k] = actor.close.remote()
            except Exception:
                pass
        closed = set()
        try:
            ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=CLOSE_GRACE_S)
            ready = set(ready)
            for k, ref in refs.items():
                if ref in ready:
                    try:
                        ray.get(ref, timeout=0)
                        closed.add(k)
                    except Exception:
                        pass
        except Exception:
            pass
        for actor in actors:  # ... then end the actor processes
            if actor is None:
                continue
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass
        for k in range(len(actors)):  # an actor that could not close: clean up after it
            if k not in closed and k in segments:
                janitor(state, *segments[k])
        janitors = state.pop("janitors", [])
        if janitors:
            try:
                ray.wait(janitors, num_returns=len(janitors), timeout=CLOSE_GRACE_S)
            except Exception:
                pass
    segment = state.pop("segment", None)
    release_segment(segment, unlink=True)
    generation = state.pop("owns_ray", None)
    if generation is not None:
        try:
            disconnect(generation)
        except Exception:
            pass
