"""fastvec on a Ray cluster: the envs live in Ray actors spread over the nodes.

    import fastvec.ray
    envs = fastvec.ray.AsyncVectorEnv(env_fns)          # was: fastvec.AsyncVectorEnv(env_fns)
    venv = fastvec.ray.SubprocVecEnv(env_fns)           # was: fastvec.SubprocVecEnv(env_fns)

Each actor hosts a node-local ``fastvec.engine.Engine`` over a contiguous group of envs,
so stepping inside a node stays shared-memory and zero-copy. ``RayEngine`` speaks the
engine's interface (docs/ENGINE_API.md) to the two front doors and to the trainer: the
results land in a ring of ``[num_slots, num_envs, ...]`` arrays in the driver, in one
shared-memory segment laid out like the engine's.

A step sends every actor its slice of the actions at once and gathers the results as
they arrive. Two transports, chosen per actor:

- an actor on another node (always available): one Ray actor task per step; actions go
  as numpy arrays in the task's arguments, observations, rewards, flags and infos come
  back as numpy arrays through Ray's object store;
- an actor on the driver's own node (``local_fast_path=True``, the default): the actor
  maps the driver's ring, reads its actions from it and writes its results into it; a
  16-byte doorbell on a private Unix socket starts the step and the reply carries only
  the infos. Ray still places, watches and replaces the actor; only the per-step
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
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
import select
import socket
import struct
import tempfile
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Sequence

import cloudpickle
import numpy as np

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as _exc:  # pragma: no cover - exercised without Ray
    raise ImportError(
        "fastvec.ray needs Ray: install it with `pip install \"fastvec[ray]\"`"
    ) from _exc

from gymnasium.vector import AutoresetMode

from .actions import ActionWriter
from .engine import EngineBase, check_env_fns, pickle_payloads
from .errors import WorkerError
from .infos import columns_to_records, join_parts
from .layout import SegmentPlan, leaves_of
from .shm import attach_segment, create_segment, release_segment
from .sb3 import SubprocVecEnv as _SB3Door
from .vector import AsyncVectorEnv as _GymDoor

__all__ = ["RayEngine", "AsyncVectorEnv", "SubprocVecEnv", "loopback_only"]

_AUTORESET_MODES = ("same_step", "next_step", "disabled")
_CLOSE_GRACE_S = 5.0
_HEADER = struct.Struct("<qq")  # doorbell and reply header: (command or status, slot or length)
_CMD_STEP = 1
_CMD_PING = 2
_OK = 0
_ERROR = 1
# Ray sends objects up to max_direct_call_object_size (100 KiB by default) inline with a
# task's reply; bigger ones go through the object store.
_INLINE_BYTES = 90_000


# ============================================================================ helpers
def _check_positive_int(value, name: str, allow_none: bool = True):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer{' or None' if allow_none else ''}, got {value!r}")
    return int(value)


def _check_timeout(value, name: str):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")
    return float(value)


def split_weighted(total: int, weights: Sequence[float]) -> list[tuple[int, int]]:
    """Contiguous [start, stop) groups of ``total`` items, sizes in proportion to
    ``weights`` (largest remainder), each at least 1."""
    n = len(weights)
    if total < n:
        raise ValueError(f"cannot split {total} envs over {n} actors")
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum() if w.sum() > 0 else np.full(n, 1.0 / n)
    raw = w * total
    sizes = np.maximum(np.floor(raw).astype(int), 1)
    while sizes.sum() < total:  # the largest remainders get one more
        sizes[int(np.argmax(raw - sizes))] += 1
    while sizes.sum() > total:  # the minimum of 1 overshot: take from the most over their share
        over = np.where(sizes > 1, sizes - raw, -np.inf)
        sizes[int(np.argmax(over))] -= 1
    groups, start = [], 0
    for size in sizes.tolist():
        groups.append((start, start + size))
        start += size
    return groups


@contextlib.contextmanager
def loopback_only():
    """Within this block, a Ray node started in this process (``ray.init`` of a local
    instance, ``ray.cluster_utils.Cluster.add_node``) given ``127.0.0.1`` as its address
    keeps it, so that every Ray process listens on the loopback interface only.

    Ray normally swaps a loopback node address for the machine's outward address, so
    that other machines can join. fastvec's own local instance serves this process only.
    """
    from ray._private import ray_constants

    missing = object()
    before = getattr(ray_constants, "ENABLE_RAY_CLUSTER", missing)
    ray_constants.ENABLE_RAY_CLUSTER = False  # read by services.get_node_ip_address()
    try:
        yield
    finally:
        if before is missing:
            del ray_constants.ENABLE_RAY_CLUSTER
        else:
            ray_constants.ENABLE_RAY_CLUSTER = before


# ----------------------------------------------------------------- Ray connection
_session_lock = threading.Lock()
_session = {"owners": 0, "generation": 0}


def _connect(address, init_kwargs) -> int | None:
    """Make sure this process is connected to Ray. Returns the generation of the
    connection fastvec made when the caller took a share of it (to release with
    ``_disconnect``), None when the connection is the user's."""
    with _session_lock:
        if _session["owners"] and not ray.is_initialized():
            _session["owners"] = 0  # someone called ray.shutdown(): those shares are void
            _session["generation"] += 1
        if ray.is_initialized():
            if address not in (None, "auto"):
                current = ray.get_runtime_context().gcs_address
                if address.split("://")[-1] != current:
                    raise ValueError(
                        f"Ray is already initialized in this process (connected to {current}); "
                        f"ray_address={address!r} differs: call ray.shutdown() first or drop ray_address"
                    )
            if _session["owners"] == 0:
                return None  # the user's connection: theirs to shut down
            _session["owners"] += 1
            return _session["generation"]
        kwargs = {"log_to_driver": False, "logging_level": logging.ERROR}
        if address is None:
            kwargs.update(include_dashboard=False, _node_ip_address="127.0.0.1")
            kwargs.update(init_kwargs or {})
            with loopback_only():
                ray.init(address="local", **kwargs)
        else:
            kwargs.update(init_kwargs or {})
            ray.init(address=address, **kwargs)
        _session["owners"] = 1
        _session["generation"] += 1
        return _session["generation"]


def _disconnect(generation: int) -> None:
    with _session_lock:
        if _session["owners"] <= 0 or generation != _session["generation"]:
            return
        _session["owners"] -= 1
        if _session["owners"] == 0 and ray.is_initialized():
            ray.shutdown()


def _client_mode() -> bool:
    try:
        from ray.util.client import ray as client_ray

        return bool(client_ray.is_connected())
    except Exception:
        return False


# ----------------------------------------------------------------- socket plumbing
def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """``n`` bytes from ``sock``; None on end of file."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            return None
        got += k
    return bytes(buf)


def _dumps(obj) -> bytes:
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return cloudpickle.dumps(obj)


def _report(exc: BaseException, fatal: bool | None = None) -> dict:
    """A picklable description of an exception raised inside an actor."""
    if isinstance(exc, WorkerError):
        return {
            "kind": "WorkerError",
            "message": exc.args[0] if exc.args else "",
            "worker": exc.worker,
            "env_index": exc.env_index,
            "exc_type": exc.exc_type,
            "exc_message": exc.exc_message,
            "worker_traceback": exc.worker_traceback,
            # an env that raised leaves the engine usable; a dead or silent worker does not
            "fatal": (exc.exc_type is None) if fatal is None else fatal,
        }
    return {
        "kind": "ValueError" if isinstance(exc, ValueError) else "other",
        "message": f"{type(exc).__name__}: {exc}",
        "worker": None,
        "env_index": None,
        "exc_type": f"{type(exc).__module__}.{type(exc).__qualname__}".replace("builtins.", ""),
        "exc_message": str(exc),
        "worker_traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "fatal": True if fatal is None else fatal,
    }


# ============================================================================ the actor
class _FastvecActor:
    """One Ray actor: a node-local ``Engine`` over envs ``[start, stop)`` of the vector
    env. Replies are tuples starting with "ok" or ("error", report)."""

    def __init__(self, blob, start, autoreset_mode, num_workers, context, step_timeout,
                 start_timeout, restart_on_error, spin_us, main_spin_us):
        self._start = start
        self._engine = None
        self._error = None
        self._slot = 0
        self._conn = None
        self._ring = None
        try:
            from .engine import Engine

            fns = cloudpickle.loads(blob)
            self._engine = Engine(
                fns, num_workers=num_workers, num_slots=2, autoreset_mode=autoreset_mode,
                context=context, step_timeout=step_timeout, start_timeout=start_timeout,
                restart_on_error=restart_on_error, spin_us=spin_us, main_spin_us=main_spin_us,
            )
        except BaseException as exc:  # reported by hello(): the driver decides
            self._error = _report(exc, fatal=True)
            return
        name = getattr(self._engine, "shm_name", None)
        if name and not restart_on_error:
            # Nothing attaches to the engine's segment by name after start-up (only a
            # replacement worker would): drop the name now. Ray ends a lost actor together
            # with its whole process group, resource tracker included, which would leave
            # the segment behind. The mappings stay valid until the processes exit.
            _forget_segment(name)

    # ------------------------------------------------------------ start-up
    def hello(self):
        if self._error is not None:
            return ("error", self._error)
        eng = self._engine
        return ("ok", {
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "worker_pids": eng.worker_pids,
            "num_workers": eng.num_workers,
            "shm_name": getattr(eng, "shm_name", None),
            "observation_space": eng.single_observation_space,
            "action_space": eng.single_action_space,
            "metadata": eng.env_metadata,
            "render_mode": eng.render_mode,
            "spec": getattr(eng, "spec", None),
        })

    def processes(self):
        eng = self._engine
        return ("ok", {"pid": os.getpid(), "worker_pids": eng.worker_pids if eng is not None else [],
                       "node_id": ray.get_runtime_context().get_node_id()})

    # ------------------------------------------------------------ stepping
    def _step(self, act_leaves):
        """Step the engine on ``act_leaves`` (one array per action leaf, [n, ...]).
        Returns (inner slot, columns, records, new restart records) or ("error", report)."""
        eng = self._engine
        s = self._slot = 1 - self._slot
        before = len(eng.restarts)
        try:
            for dst, src in zip(eng.act_bufs, act_leaves):
                dst[s] = src
            eng.step_async_written(s)
            columns, records = eng.step_wait_report()
        except Exception as exc:
            return ("error", _report(exc))
        new = [dict(r) for r in eng.restarts[before:]]
        return s, columns, records, new

    def step(self, act_leaves, chunks=None):
        """One step; the results as numpy arrays. With ``chunks`` (row ranges), the
        observations come back as ``len(chunks)`` separate return values, each small
        enough for Ray to send inline with the reply, and the rest as the last one."""
        out = self._step(act_leaves)
        if out[0] == "error":
            return out if chunks is None else (None,) * len(chunks) + (out,)
        s, columns, records, new = out
        eng = self._engine
        term, trunc = eng.terminated[s], eng.truncated[s]
        ended = np.flatnonzero(term | trunc)
        finals = [b[s][ended] for b in eng.final_bufs] if len(ended) else []
        if chunks is None:
            return ("ok", [b[s] for b in eng.obs_bufs], ended, finals, eng.rewards[s], term, trunc,
                    columns, records, new)
        parts = tuple([b[s][lo:hi] for b in eng.obs_bufs] for lo, hi in chunks)
        return parts + (("ok", None, ended, finals, eng.rewards[s], term, trunc, columns, records, new),)

    def reset(self, blob):
        try:
            kwargs = pickle.loads(blob)
            eng = self._engine
            s = self._slot = 1 - self._slot
            infos = eng.reset(s, kwargs)
        except Exception as exc:
            return ("error", _report(exc))
        idx = np.asarray(sorted(kwargs), dtype=np.int64)
        return ("ok", infos, idx, [b[s][idx] for b in eng.obs_bufs])

    def call(self, blob):
        try:
            kind, name, args, kwargs, indices, values = pickle.loads(blob)
            out = self._engine.call(kind, name, args, kwargs, indices=indices, values=values)
        except Exception as exc:
            return ("error", _report(exc, fatal=False) if not isinstance(exc, WorkerError) else _report(exc))
        try:
            return ("ok", _dumps(out))
        except Exception as exc:
            return ("error", _report(exc, fatal=False))

    # ------------------------------------------------------------ fast path
    def open_fast_path(self, shm_name, entries, start, stop, n_obs, n_act):
        """Map the driver's ring and listen on a private Unix socket for doorbells.
        Returns ("ok", the socket's path) (the driver connects once; the path is then
        removed), or ("error", report) when this is not possible here."""
        try:
            return ("ok", self._open_fast_path(shm_name, entries, start, stop, n_obs, n_act))
        except Exception as exc:
            self._ring = None
            return ("error", _report(exc, fatal=False))

    def _open_fast_path(self, shm_name, entries, start, stop, n_obs, n_act):
        segment = attach_segment(shm_name)
        plan = SegmentPlan()
        plan.entries = entries
        arrays = plan.arrays(segment)
        self._ring = {
            "obs": [arrays[f"obs{i}"][:, start:stop] for i in range(n_obs)],
            "final": [arrays[f"final{i}"][:, start:stop] for i in range(n_obs)],
            "act": [arrays[f"act{i}"][:, start:stop] for i in range(n_act)],
            "rewards": arrays["rewards"][:, start:stop],
            "terminated": arrays["terminated"][:, start:stop],
            "truncated": arrays["truncated"][:, start:stop],
        }
        folder = tempfile.mkdtemp(prefix="fastvec-ray-")  # mode 0700
        path = os.path.join(folder, "doorbell")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        listener.settimeout(120.0)
        threading.Thread(target=self._serve_fast_path, args=(listener, folder, path),
                         name="fastvec-doorbell", daemon=True).start()
        return path

    def _serve_fast_path(self, listener, folder, path):
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        finally:
            listener.close()
            for fn, arg in ((os.unlink, path), (os.rmdir, folder)):
                try:
                    fn(arg)
                except OSError:
                    pass
        if hasattr(socket, "SO_PEERCRED"):
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", creds)
            if uid != os.getuid():
                conn.close()
                return
        conn.settimeout(None)
        self._conn = conn
        ring = self._ring
        try:
            while True:
                header = _recv_exact(conn, _HEADER.size)
                if header is None:
                    return  # the driver closed: done
                cmd, slot = _HEADER.unpack(header)
                if cmd == _CMD_PING:
                    conn.sendall(_HEADER.pack(_OK, 0))
                    continue
                out = self._step([a[slot] for a in ring["act"]])
                if out[0] == "error":
                    payload = _dumps(out[1])
                    conn.sendall(_HEADER.pack(_ERROR, len(payload)) + payload)
                    continue
                s, columns, records, new = out
                eng = self._engine
                for dst, src in zip(ring["obs"], eng.obs_bufs):
                    dst[slot] = src[s]
                term, trunc = eng.terminated[s], eng.truncated[s]
                ring["rewards"][slot] = eng.rewards[s]
                ring["terminated"][slot] = term
                ring["truncated"][slot] = trunc
                ended = term | trunc
                if ended.any():
                    for dst, src in zip(ring["final"], eng.final_bufs):
                        dst[slot][ended] = src[s][ended]
                payload = _dumps((columns, records, new))
                conn.sendall(_HEADER.pack(_OK, len(payload)) + payload)
        except OSError:
            return
        finally:
            conn.close()

    def close(self):
        if self._conn is not None:
            try:
                self._conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._engine is not None:
            self._engine.close()
        return True


_ACTOR_CLASS = None
_JANITOR = None


def _actor_class():
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(max_restarts=0, max_task_retries=0)(_FastvecActor)
    return _ACTOR_CLASS


def _forget_segment(name: str) -> None:
    """Unlink a segment this process created and tell multiprocessing's resource
    tracker it is gone."""
    import _posixshmem
    from multiprocessing import resource_tracker

    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        return
    try:
        resource_tracker.unregister("/" + name, "shared_memory")
    except Exception:
        pass


def _unlink_segments(names) -> list:
    """Runs on an actor's node after the actor died without closing its engine: remove
    the engine's shared-memory segment (its resource tracker may have been killed with
    it). Returns the names it removed."""
    import _posixshmem

    removed = []
    for name in names:
        try:
            _posixshmem.shm_unlink("/" + name)
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def _janitor(state: dict, node_id: str, names) -> None:
    """Start the clean-up of ``names`` on ``node_id`` (waited for at shutdown)."""
    global _JANITOR
    names = [n for n in names if n]
    if not names or not ray.is_initialized():
        return
    if _JANITOR is None:
        _JANITOR = ray.remote(num_cpus=0, max_retries=0)(_unlink_segments)
    try:
        ref = _JANITOR.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)).remote(names)
    except Exception:
        return
    state.setdefault("janitors", []).append(ref)


# ============================================================================ shutdown
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
            ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=_CLOSE_GRACE_S)
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
                _janitor(state, *segments[k])
        janitors = state.pop("janitors", [])
        if janitors:
            try:
                ray.wait(janitors, num_returns=len(janitors), timeout=_CLOSE_GRACE_S)
            except Exception:
                pass
    segment = state.pop("segment", None)
    release_segment(segment, unlink=True)
    generation = state.pop("owns_ray", None)
    if generation is not None:
        try:
            _disconnect(generation)
        except Exception:
            pass


# ============================================================================ RayEngine
class RayEngine(EngineBase):
    """The engine's interface (docs/ENGINE_API.md) over Ray actors, each hosting a
    node-local ``fastvec.engine.Engine`` over a contiguous group of envs.

    For the front doors a "worker" is an actor: ``num_workers`` is the number of actors,
    ``groups[k]`` the envs of actor k, ``WorkerError.worker`` the failed actor.

    Parameters
    ----------
    env_fns : sequence of callables
        Each returns a gymnasium env; cloudpickled (their modules must be importable on
        every node: installed, or in the driver's working directory, which Ray puts on
        the workers' path).
    ray_address : str, optional
        Address of a running cluster (``"auto"``, ``"host:port"``, ``"ray://..."``).
        None: use this process's Ray connection if there is one, else start a local
        instance listening on 127.0.0.1 only (stopped when the last user closes).
    num_actors : int, optional
        Actors to start. Default: ``actors_per_node`` on every node with CPUs (at most
        one per env).
    actors_per_node : int, optional
        Actors per node (default 1); nodes are filled in order, the driver's first.
    envs_per_actor : int, optional
        Envs per actor (the last actor may get fewer); sets ``num_actors``.
        Default: envs in proportion to the actors' CPUs.
    workers_per_actor : int, optional
        Worker processes of each actor's engine. Default: the actor's CPUs (at most one
        per env).
    num_cpus_per_actor : float, optional
        CPUs each actor reserves in Ray. Default: the node's CPUs shared among its
        actors, so the defaults fill the CPUs Ray reports.
    num_slots, autoreset_mode, context, step_timeout, start_timeout, restart_on_error,
    spin_us, main_spin_us :
        As for ``fastvec.engine.Engine`` (``context``, ``spin_us`` and ``main_spin_us``
        apply to the actors' engines; ``context`` defaults to "forkserver" there, so that
        the workers do not inherit the actor's Ray sockets and threads). A silent actor
        is declared failed after ``step_timeout`` plus a grace of
        ``max(1, step_timeout / 2)`` seconds; an env stuck inside an actor is reported by
        that actor's engine after ``step_timeout``.
    local_fast_path : bool, default True
        Actors on the driver's node exchange steps through the driver's shared memory
        and a Unix-socket doorbell instead of Ray tasks.
    ray_init_kwargs : dict, optional
        Extra keyword arguments for ``ray.init`` when fastvec connects or starts Ray.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable],
        *,
        ray_address: str | None = None,
        num_actors: int | None = None,
        actors_per_node: int | None = None,
        envs_per_actor: int | None = None,
        workers_per_actor: int | None = None,
        num_cpus_per_actor: float | None = None,
        num_slots: int = 2,
        autoreset_mode: str = "same_step",
        context: str | None = None,
        step_timeout: float | None = None,
        start_timeout: float | None = 300.0,
        restart_on_error: bool = False,
        local_fast_path: bool = True,
        spin_us: float | None = None,
        main_spin_us: float | None = None,
        ray_init_kwargs: dict | None = None,
    ):
        self._closed = True  # until fully started
        # ---- everything that can be checked before touching Ray
        env_fns = check_env_fns(env_fns)
        self.num_envs = num_envs = len(env_fns)
        num_actors = _check_positive_int(num_actors, "num_actors")
        actors_per_node = _check_positive_int(actors_per_node, "actors_per_node")
        envs_per_actor = _check_positive_int(envs_per_actor, "envs_per_actor")
        workers_per_actor = _check_positive_int(workers_per_actor, "workers_per_actor")
        if num_cpus_per_actor is not None:
            if isinstance(num_cpus_per_actor, bool) or not isinstance(num_cpus_per_actor, (int, float)) \
                    or not 0 <= num_cpus_per_actor < float("inf"):
                raise ValueError(f"num_cpus_per_actor must be a number >= 0 or None, got {num_cpus_per_actor!r}")
            if num_cpus_per_actor > 1 and float(num_cpus_per_actor) != int(num_cpus_per_actor):
                raise ValueError(f"num_cpus_per_actor above 1 must be a whole number (Ray's rule), "
                                 f"got {num_cpus_per_actor!r}")
        if num_actors is not None and num_actors > num_envs:
            raise ValueError(f"num_actors={num_actors} exceeds num_envs={num_envs}")
        if envs_per_actor is not None:
            needed = -(-num_envs // envs_per_actor)
            if num_actors is not None and num_actors != needed:
                raise ValueError(f"num_actors={num_actors} does not match envs_per_actor={envs_per_actor} "
                                 f"for {num_envs} envs (that needs {needed} actors)")
            num_actors = needed
        self.num_slots = _check_positive_int(num_slots, "num_slots", allow_none=False)
        if autoreset_mode not in _AUTORESET_MODES:
            raise ValueError(f"autoreset_mode must be one of {sorted(_AUTORESET_MODES)}, got {autoreset_mode!r}")
        self.autoreset_mode = autoreset_mode
        self.step_timeout = _check_timeout(step_timeout, "step_timeout")
        self._start_timeout = _check_timeout(start_timeout, "start_timeout")
        if context is not None and context not in ("fork", "forkserver", "spawn"):
            raise ValueError(f"context must be 'fork', 'forkserver', 'spawn' or None, got {context!r}")
        if ray_address is not None and (not isinstance(ray_address, str) or not ray_address):
            raise ValueError(f"ray_address must be a non-empty string or None, got {ray_address!r}")
        if ray_init_kwargs is not None and not isinstance(ray_init_kwargs, dict):
            raise ValueError(f"ray_init_kwargs must be a dict or None, got {type(ray_init_kwargs).__name__}")
        for name, value in (("spin_us", spin_us), ("main_spin_us", main_spin_us)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 <= value < 1e6):
                raise ValueError(f"{name} must be a number of microseconds in [0, 1e6), got {value!r}")
        self.restart_on_error = bool(restart_on_error)
        self.local_fast_path = bool(local_fast_path)
        blobs_source = list(env_fns)
        try:
            cloudpickle.dumps(blobs_source[0])
        except Exception as exc:
            raise ValueError(f"could not pickle env_fns[0] for the actors: {exc}") from None

        self._state: dict = {"actors": [], "socks": {}, "owns_ray": None}
        self._finalizer = weakref.finalize(self, _shutdown, self._state)
        self._broken: str | None = None
        self._pending_slot: int | None = None
        self._last_slot = 0
        self.restarts: list[dict] = []
        self.history: list[dict] = []
        # forkserver by default: an actor is a multi-threaded Ray worker whose gRPC sockets a
        # forked worker would inherit; the fork server starts clean (and costs no start-up time
        # next to the actor's own).
        self._actor_opts = dict(autoreset_mode=autoreset_mode, context=context or "forkserver",
                                step_timeout=self.step_timeout,
                                start_timeout=self._start_timeout, restart_on_error=self.restart_on_error,
                                spin_us=spin_us, main_spin_us=main_spin_us)
        try:
            self._state["owns_ray"] = _connect(ray_address, ray_init_kwargs)
            self._driver_node = ray.get_runtime_context().get_node_id()
            if _client_mode():
                # Ray Client: this process is not on any node; its "node" is the client
                # server's, whose shared memory it cannot reach.
                self.local_fast_path = False
            self._plan(num_actors, actors_per_node, envs_per_actor, workers_per_actor, num_cpus_per_actor)
            self._blobs = []
            for a, b in self.groups:
                try:
                    self._blobs.append(cloudpickle.dumps(blobs_source[a:b]))
                except Exception as exc:
                    raise ValueError(f"could not pickle env_fns[{a}:{b}] for the actors: {exc}") from None
            self._start()
        except BaseException:
            self._finalizer()
            raise
        self._closed = False

    # ------------------------------------------------------------------ placement
    def _plan(self, num_actors, actors_per_node, envs_per_actor, workers_per_actor, num_cpus_per_actor):
        nodes = [(n["NodeID"], float(n.get("Resources", {}).get("CPU", 0.0)))
                 for n in ray.nodes() if n.get("Alive")]
        nodes = [n for n in nodes if n[1] > 0] or nodes
        if not nodes:
            raise WorkerError("the Ray cluster has no live node")
        nodes.sort(key=lambda n: (n[0] != self._driver_node, n[0]))  # the driver's node first
        per_node = actors_per_node or 1
        if num_actors is None:
            num_actors = min(self.num_envs, per_node * len(nodes))
        if actors_per_node is not None:
            if num_actors > actors_per_node * len(nodes):
                raise ValueError(f"{num_actors} actors at actors_per_node={actors_per_node} need "
                                 f"{-(-num_actors // actors_per_node)} nodes; the cluster has {len(nodes)}")
            counts = [min(actors_per_node, max(0, num_actors - i * actors_per_node)) for i in range(len(nodes))]
        else:
            base, extra = divmod(num_actors, len(nodes))
            counts = [base + (1 if i < extra else 0) for i in range(len(nodes))]
        node_of, cpus = [], []
        for (node_id, node_cpus), count in zip(nodes, counts):
            if count == 0:
                continue
            if num_cpus_per_actor is not None:
                share = float(num_cpus_per_actor)
                if share * count > node_cpus + 1e-9:
                    raise ValueError(f"{count} actors of {share:g} CPUs do not fit on node {node_id[:8]}, "
                                     f"which has {node_cpus:g} CPUs")
            else:
                share = node_cpus / count
                share = float(math.floor(share)) if share >= 1 else math.floor(share * 1e4) / 1e4
            node_of += [node_id] * count
            cpus += [share] * count
        self.num_actors = self.num_workers = len(node_of)
        if envs_per_actor is not None:
            self.groups = [(a, min(a + envs_per_actor, self.num_envs))
                           for a in range(0, self.num_envs, envs_per_actor)]
        else:
            self.groups = split_weighted(self.num_envs, [max(c, 1e-3) for c in cpus])
        self._env_actor = np.repeat(np.arange(self.num_actors), [b - a for a, b in self.groups])
        self.placement = []
        for k, ((a, b), node_id, c) in enumerate(zip(self.groups, node_of, cpus)):
            workers = workers_per_actor if workers_per_actor is not None else max(1, int(c))
            self.placement.append({"actor": k, "node_id": node_id, "envs": (a, b), "num_cpus": c,
                                   "num_workers": min(workers, b - a), "pid": None, "fast_path": False})

    def _spawn(self, k: int, soft: bool = False):
        p = self.placement[k]
        a, _b = p["envs"]
        actor = _actor_class().options(
            num_cpus=p["num_cpus"],
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=p["node_id"], soft=soft),
        ).remote(self._blobs[k], a, num_workers=p["num_workers"], **self._actor_opts)
        return actor

    def _start(self) -> None:
        actors = [self._spawn(k) for k in range(self.num_actors)]
        self._actors = actors
        self._state["actors"] = actors
        try:
            hellos = self._gather({k: a.hello.remote() for k, a in enumerate(actors)},
                                  self._start_timeout, "starting", raise_first=True)
        except WorkerError as exc:
            if "did not answer" not in str(exc):
                raise
            k = exc.worker
            raise WorkerError(
                f"{exc}: is its node short of the {self.placement[k]['num_cpus']:g} CPUs it asks for? "
                "(other actors, e.g. another fastvec.ray vector env, may hold them; "
                "num_cpus_per_actor=0 lifts the reservation)", worker=k, env_indices=exc.env_indices) from None
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
        self._action_writer = ActionWriter(self.single_action_space, self.num_envs)

        # The ring: one segment laid out like the engine's, so actors on this node can map it.
        plan = SegmentPlan()
        for i, leaf in enumerate(self.obs_leaves_info):
            plan.add(f"obs{i}", (self.num_slots, self.num_envs) + leaf.shape, leaf.dtype)
            plan.add(f"final{i}", (self.num_slots, self.num_envs) + leaf.shape, leaf.dtype)
        for i, leaf in enumerate(self.act_leaves_info):
            plan.add(f"act{i}", (self.num_slots, self.num_envs) + leaf.shape, leaf.dtype)
        plan.add("rewards", (self.num_slots, self.num_envs), np.float64)
        plan.add("terminated", (self.num_slots, self.num_envs), np.bool_)
        plan.add("truncated", (self.num_slots, self.num_envs), np.bool_)
        segment = create_segment(plan.size)
        self._state["segment"] = segment
        self.shm_name = segment.name
        self._plan_entries = plan.entries
        arrays = plan.arrays(segment.buf)
        self._bind_ring(arrays)
        # Observations of actors on other nodes come back in chunks small enough for Ray to
        # send inline with the task's reply (a trip through the object store costs ~1 ms).
        row_bytes = sum(int(np.prod(leaf.shape, dtype=np.int64)) * leaf.dtype.itemsize
                        for leaf in self.obs_leaves_info)
        self._chunks = []
        for a, b in self.groups:
            n = b - a
            if row_bytes * n <= _INLINE_BYTES or row_bytes > _INLINE_BYTES:
                self._chunks.append(None)
            else:
                rows = max(1, _INLINE_BYTES // row_bytes)
                self._chunks.append([(lo, min(lo + rows, n)) for lo in range(0, n, rows)])
        self._inflight_refs, self._inflight_parts, self._inflight_socks, self._dispatch_failures = {}, {}, {}, {}
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
        self.history.append({"actor": k, "node_id": info["node_id"], "pid": info["pid"],
                             "worker_pids": list(info["worker_pids"]), "shm_name": info.get("shm_name")})
        p["num_workers"] = info["num_workers"]
        p["fast_path"] = False

    def _open_fast_path(self, k: int) -> None:
        """Doorbell socket to actor k if it runs on this node."""
        if not self.local_fast_path or self.placement[k]["node_id"] != self._driver_node:
            return
        a, b = self.groups[k]
        try:
            path = self._ray_get(
                self._actors[k].open_fast_path.remote(self.shm_name, self._plan_entries, a, b,
                                                      len(self.obs_bufs), len(self.act_bufs)),
                k, self._start_timeout, "opening its shared-memory channel")
        except WorkerError as exc:
            if exc.exc_type is None:  # the actor itself failed
                raise
            warnings.warn(f"fastvec.ray: {self._actor_desc(k)} cannot share this process's memory "
                          f"({exc.exc_type}: {exc.exc_message}); its steps go through Ray tasks",
                          RuntimeWarning, stacklevel=4)
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self._start_timeout)
            sock.connect(path)
            sock.sendall(_HEADER.pack(_CMD_PING, 0))
            reply = _recv_exact(sock, _HEADER.size)
            if reply is None or _HEADER.unpack(reply)[0] != _OK:
                raise OSError("no answer to the first doorbell")
            sock.settimeout(None)
        except OSError as exc:
            sock.close()
            raise WorkerError(f"{self._actor_desc(k)} could not open its shared-memory channel: {exc}",
                              worker=k, env_indices=range(a, b)) from None
        self._state["socks"][k] = sock
        self.placement[k]["fast_path"] = True

    # ------------------------------------------------------------------ plumbing

    @property
    def worker_pids(self) -> list[int]:
        """Pids of the actor processes (each on its own node)."""
        return [p["pid"] for p in self.placement]

    def process_info(self) -> list[dict]:
        """Per actor, fresh from the actors: node id, actor pid and its engine's worker pids."""
        self._check_usable()
        return [self._ray_get(a.processes.remote(), k, self._start_timeout, "listing its processes")
                for k, a in enumerate(self._actors)]

    def _actor_desc(self, k: int) -> str:
        p = self.placement[k]
        a, b = p["envs"]
        node = (p["node_id"] or "?")[:8]
        return f"actor {k} (node {node}, pid {p['pid']}, envs {a}..{b - 1})"

    def _outer_timeout(self, timeout):
        """How long the driver waits for an actor whose engine has ``timeout``."""
        return None if timeout is None else timeout + max(1.0, 0.5 * timeout)

    def _error(self, k: int, rep: dict, doing: str) -> Exception:
        """The driver-side exception for an actor's error report."""
        a, b = self.groups[k]
        if rep["kind"] == "ValueError" and rep["env_index"] is None and doing in ("starting", "restarting"):
            return ValueError(f"{rep['exc_message']} (in {self._actor_desc(k)})")
        env_index = rep["env_index"]
        where = f"env {a + env_index}" if env_index is not None else self._actor_desc(k)
        if rep["exc_type"] and env_index is not None:
            head = f"{where} raised {rep['exc_type']}: {rep['exc_message']} (while {doing}, in {self._actor_desc(k)})"
        else:
            head = f"{self._actor_desc(k)} failed while {doing}"
        message = f"{head}; the actor's engine reported (env indices inside the actor count from 0): {rep['message']}"
        return WorkerError(message, worker=k, env_indices=range(a, b),
                           env_index=None if env_index is None else a + env_index,
                           exc_type=rep["exc_type"], exc_message=rep["exc_message"],
                           worker_traceback=rep["worker_traceback"])

    def _death(self, k: int, exc: BaseException, doing: str) -> WorkerError:
        self._state.setdefault("lost", set()).add(k)  # not worth asking to close
        a, b = self.groups[k]
        text = str(exc).strip().splitlines()
        detail = text[0] if text else type(exc).__name__
        what = "failed" if isinstance(exc, ray.exceptions.RayTaskError) else "died"
        return WorkerError(f"{self._actor_desc(k)} {what} while {doing}: {type(exc).__name__}: {detail}",
                           worker=k, env_indices=range(a, b))

    def _silent(self, k: int, timeout: float, doing: str) -> WorkerError:
        self._state.setdefault("lost", set()).add(k)
        a, b = self.groups[k]
        return WorkerError(f"{self._actor_desc(k)} did not answer within {timeout:g} s while {doing}",
                           worker=k, env_indices=range(a, b))

    def _ray_get(self, ref, k: int, timeout, doing: str):
        """One actor call; its "ok" payload, or an exception (fatal ones break the engine)."""
        replies = self._gather({k: ref}, timeout, doing, raise_first=True)
        return replies[k]

    def _gather(self, refs: dict, timeout, doing: str, raise_first: bool = False, on_reply=None):
        """Wait for ``{actor: ObjectRef}`` as the replies arrive. Returns
        ``(results, failures)`` ({k: payload}, {k: (exception, fatal)}), or, with
        ``raise_first``, the results after raising the first failure."""
        pending = {ref: k for k, ref in refs.items()}
        deadline = None if timeout is None else time.monotonic() + timeout
        results, failures = {}, {}
        try:
            while pending:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=left)
                if not ready:
                    for ref, k in pending.items():
                        failures[k] = (self._silent(k, timeout, doing), True)
                    pending.clear()
                    break
                for ref in ready:
                    k = pending.pop(ref)
                    try:
                        reply = ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        failures[k] = (self._death(k, exc, doing), True)
                        continue
                    if reply[0] == "error":
                        failures[k] = (self._error(k, reply[1], doing), bool(reply[1]["fatal"]))
                        continue
                    if on_reply is not None:
                        on_reply(k, reply)
                    results[k] = reply[1] if len(reply) == 2 else reply
        except KeyboardInterrupt:
            self._broken = "interrupted while waiting for the actors"
            raise
        if not raise_first:
            return results, failures
        if failures:
            k, (exc, fatal) = next(iter(sorted(failures.items())))
            if fatal:
                self._broken = str(exc)
            raise exc
        return results

    # ------------------------------------------------------------------ stepping

    def _start_step(self, slot: int) -> None:
        """Actions to every actor at once: doorbells to the local ones, Ray tasks to the rest."""
        socks = self._state["socks"]
        self._inflight_refs = {}
        self._inflight_parts = {}
        self._inflight_socks = {}
        self._dispatch_failures = {}
        bell = _HEADER.pack(_CMD_STEP, slot)
        for k, actor in enumerate(self._actors):
            sock = socks.get(k)
            if sock is not None:
                try:
                    sock.sendall(bell)
                    self._inflight_socks[sock] = k
                except OSError as exc:
                    self._dispatch_failures[k] = (self._death(k, exc, "stepping"), True)
            else:
                a, b = self.groups[k]
                acts = [buf[slot, a:b] for buf in self.act_bufs]
                chunks = self._chunks[k]
                if chunks is None:
                    self._inflight_refs[k] = actor.step.remote(acts)
                else:
                    refs = actor.step.options(num_returns=len(chunks) + 1).remote(acts, chunks)
                    self._inflight_refs[k] = refs[-1]
                    self._inflight_parts[k] = refs[:-1]
        self._pending_slot = slot

    def step_wait_report(self, timeout: float | None = ...):
        """Like ``Engine.step_wait_report``: ``(columns, records)``, exactly one not None."""
        if self._pending_slot is None:
            raise RuntimeError("step_wait() called without step_async()")
        slot, self._pending_slot = self._pending_slot, None
        if timeout is ...:
            timeout = self.step_timeout
        results, failures = self._collect_step(slot, self._outer_timeout(timeout))
        if failures and not self.restart_on_error:
            k, (exc, fatal) = next(iter(sorted(failures.items())))
            if fatal:
                self._broken = str(exc)
            raise exc
        columns, records = self._join_reports(results)
        if failures:
            records = records if columns is None else columns_to_records(columns)
            columns = None
            for k, (exc, _fatal) in sorted(failures.items()):
                records += self._replace_actor(k, slot, exc)
            records.sort(key=lambda rec: rec[0])
        self._last_slot = slot
        return columns, records

    def _collect_step(self, slot: int, timeout):
        failures = dict(self._dispatch_failures)
        results: dict[int, tuple] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        # Actors on this node: their results are already in the ring when they reply.
        socks = dict(self._inflight_socks)
        try:
            while socks:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                ready, _, _ = select.select(list(socks), [], [], left)
                if not ready:
                    for k in socks.values():
                        failures[k] = (self._silent(k, timeout, "stepping"), True)
                    break
                for sock in ready:
                    k = socks.pop(sock)
                    try:
                        header = _recv_exact(sock, _HEADER.size)
                        if header is None:
                            raise EOFError("its shared-memory channel closed")
                        status, n = _HEADER.unpack(header)
                        payload = _recv_exact(sock, n) if n else b""
                        if payload is None:
                            raise EOFError("its shared-memory channel closed mid-reply")
                        body = pickle.loads(payload)
                    except (OSError, EOFError, pickle.UnpicklingError, ValueError) as exc:
                        failures[k] = (self._death(k, exc, "stepping"), True)
                        continue
                    if status == _ERROR:
                        failures[k] = (self._error(k, body, "stepping"), bool(body["fatal"]))
                    else:
                        results[k] = body
            # Actors elsewhere: results travel back through Ray, written as they arrive.
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            got, failed = self._gather(self._inflight_refs, left, "stepping",
                                       on_reply=lambda k, reply: self._write_step(k, slot, reply))
        except KeyboardInterrupt:
            self._broken = "interrupted while waiting for the actors"
            raise
        for k, reply in got.items():
            results[k] = reply[7:10]
        failures.update(failed)
        for k, (_cols, _recs, new) in results.items():
            self._note_inner_restarts(k, new)
        self._inflight_refs, self._inflight_socks, self._dispatch_failures = {}, {}, {}
        self._inflight_parts = {}
        return results, failures

    def _write_step(self, k: int, slot: int, reply) -> None:
        _, obs, ended, finals, rewards, terminated, truncated, *_rest = reply
        a, b = self.groups[k]
        if obs is not None:
            for dst, src in zip(self.obs_bufs, obs):
                dst[slot, a:b] = src
        else:  # in chunks, which came with the same reply
            parts = ray.get(self._inflight_parts.pop(k))
            for (lo, hi), part in zip(self._chunks[k], parts):
                for dst, src in zip(self.obs_bufs, part):
                    dst[slot, a + lo:a + hi] = src
        if len(ended):
            rows = ended + a
            for dst, src in zip(self.final_bufs, finals):
                dst[slot, rows] = src
        self.rewards[slot, a:b] = rewards
        self.terminated[slot, a:b] = terminated
        self.truncated[slot, a:b] = truncated

    def _note_inner_restarts(self, k: int, new: list) -> None:
        """An actor's engine replaced one of its workers (restart_on_error)."""
        a = self.groups[k][0]
        for rec in new:
            envs = [a + i for i in rec.get("envs", [])]
            self.restarts.append({"worker": k, "actor": k, "inner_worker": rec.get("worker"), "envs": envs,
                                  "error": rec.get("error")})
            warnings.warn(f"fastvec.ray: {self._actor_desc(k)} restarted its worker {rec.get('worker')} "
                          f"and reset envs {envs[0]}..{envs[-1]}: {rec.get('error')}", RuntimeWarning, stacklevel=4)

    def _join_reports(self, results: dict):
        parts, records = [], []
        for k in sorted(results):
            columns, recs, _new = results[k]
            start = self.groups[k][0]
            if columns is not None:
                parts.append((start, columns))
            else:
                records += [(start + j, step_info, reset_info) for j, step_info, reset_info in recs]
        if not records and len(parts) == 1 and parts[0][0] == 0 and self.num_actors == 1:
            return parts[0][1], None  # one actor: its columns are already global
        return join_parts(parts, records)

    def _replace_actor(self, k: int, slot: int, exc: WorkerError) -> list:
        """Replace actor k by a fresh one (same node if it is still there), reset its envs
        into ``slot``; they end their episode there, truncated."""
        a, b = self.groups[k]
        previous = [buf[self._last_slot, a:b].copy() for buf in self.obs_bufs]
        try:
            sock = self._state["socks"].pop(k, None)
            if sock is not None:
                sock.close()
            try:
                ray.kill(self._actors[k], no_restart=True)
            except Exception:
                pass
            if k in self._state.get("segments", {}):
                _janitor(self._state, *self._state["segments"].pop(k))
            # Its node if that is still alive (Ray's soft affinity may move it even then),
            # any node otherwise.
            alive = any(n.get("Alive") and n["NodeID"] == self.placement[k]["node_id"] for n in ray.nodes())
            self._actors[k] = self._state["actors"][k] = self._spawn(k, soft=not alive)
            self._state.get("lost", set()).discard(k)
            info = self._ray_get(self._actors[k].hello.remote(), k, self._start_timeout, "restarting")
            self._check_spaces(k, info, {"observation_space": self.single_observation_space,
                                         "action_space": self.single_action_space})
            self._adopt(k, info)
            self._open_fast_path(k)
            reset_infos = self._reset_actors(slot, {k: {j: {} for j in range(b - a)}}, "resetting restarted envs")
        except BaseException as again:
            self._broken = f"restarting {self._actor_desc(k)} failed: {again}"
            if isinstance(again, WorkerError):
                raise again from exc
            raise
        warnings.warn(f"fastvec.ray: {exc}; restarted {self._actor_desc(k)} and reset envs {a}..{b - 1}",
                      RuntimeWarning, stacklevel=4)
        self.restarts.append({"worker": k, "actor": k, "envs": list(range(a, b)), "error": str(exc)})
        self.rewards[slot, a:b] = 0.0
        self.terminated[slot, a:b] = False
        self.truncated[slot, a:b] = True
        for final, prev in zip(self.final_bufs, previous):
            final[slot, a:b] = prev
        info = {"fastvec_restarted": True, "fastvec_error": str(exc)}
        return [(i, dict(info), reset_infos.get(i, {})) for i in range(a, b)]

    # ------------------------------------------------------------------ commands

    def reset(self, slot: int, kwargs_per_env: dict[int, dict]) -> dict[int, dict]:
        """Reset the envs named in ``kwargs_per_env``, writing their observations into
        ``slot``. Returns {env: reset info}."""
        self._check_usable()
        targets: dict[int, dict] = {}
        for i, kwargs in kwargs_per_env.items():
            k = int(self._env_actor[i])
            targets.setdefault(k, {})[i - self.groups[k][0]] = kwargs
        infos = self._reset_actors(slot, targets, "resetting")
        self._last_slot = slot
        return infos

    def _reset_actors(self, slot: int, targets: dict, doing: str) -> dict:
        blobs = pickle_payloads(targets, "reset arguments for the actors")
        refs = {k: self._actors[k].reset.remote(blob) for k, blob in blobs.items()}
        replies = self._gather(refs, self._outer_timeout(self.step_timeout), doing, raise_first=True)
        infos = {}
        for k in sorted(replies):
            _, recs, idx, obs = replies[k]
            a = self.groups[k][0]
            rows = idx + a
            for dst, src in zip(self.obs_bufs, obs):
                dst[slot, rows] = src
            for j, info in recs.items():
                infos[a + j] = info
        return infos

    def call(self, kind: str, name, args=(), kwargs=None, indices=None, values=None) -> list:
        """Run ``kind`` (see ``Engine.call``) on the envs at ``indices``, in order."""
        self._check_usable()
        indices = self.normalize_indices(indices)
        targets: dict[int, tuple[list, list]] = {}
        for n, i in enumerate(indices):
            k = int(self._env_actor[i])
            idx, vals = targets.setdefault(k, ([], []))
            idx.append(i - self.groups[k][0])
            vals.append(None if values is None else values[n])
        blobs = pickle_payloads(
            {k: (kind, name, tuple(args), dict(kwargs or {}), idx, None if values is None else vals)
             for k, (idx, vals) in targets.items()},
            "arguments for the actors")
        refs = {k: self._actors[k].call.remote(blob) for k, blob in blobs.items()}
        replies = self._gather(refs, self._outer_timeout(self.step_timeout), f"{kind}({name!r})",
                               raise_first=True)
        cursor = {k: iter(pickle.loads(blob)) for k, blob in replies.items()}
        return [next(cursor[int(self._env_actor[i])]) for i in indices]

    # ------------------------------------------------------------------ views

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Stop the actors (their engines close their workers), free the ring, and stop
        the local Ray instance if this was its last user. Idempotent."""
        if not hasattr(self, "_finalizer"):
            return
        self._closed = True
        if self._pending_slot is not None and self._broken is None:
            slot, self._pending_slot = self._pending_slot, None
            try:  # let a step in flight finish so the actors are idle when told to close
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    self._collect_step(slot, _CLOSE_GRACE_S)
            except Exception:
                pass
        self._pending_slot = None
        for name in ("obs_bufs", "final_bufs", "act_bufs"):
            if hasattr(self, name):
                setattr(self, name, [])
        for name in ("rewards", "terminated", "truncated"):
            if hasattr(self, name):
                setattr(self, name, None)
        self._finalizer()

    def __repr__(self) -> str:
        return f"fastvec.ray.RayEngine(num_envs={self.num_envs}, num_actors={getattr(self, 'num_actors', '?')})"


# ============================================================================ front doors
_RAY_DOC = """
    Ray placement (see ``fastvec.ray.RayEngine``): ``ray_address``, ``num_actors``,
    ``actors_per_node``, ``envs_per_actor``, ``workers_per_actor``, ``num_cpus_per_actor``,
    ``start_timeout``, ``local_fast_path``, ``ray_init_kwargs``. ``context``, ``spin_us`` and
    ``main_spin_us`` apply to the actors' engines.
"""


def _ray_options(**kwargs) -> dict:
    return kwargs


class _RayDoor:
    """What both Ray doors add to their local door: a ``RayEngine`` and its actors."""

    _ray_options: dict

    def _make_engine(self, env_fns, **kwargs) -> RayEngine:
        kwargs.pop("num_workers", None)
        return RayEngine(env_fns, **kwargs, **self._ray_options)

    @property
    def num_actors(self) -> int:
        return self._engine.num_actors

    def __repr__(self) -> str:
        return f"fastvec.ray.{type(self).__name__}(num_envs={self.num_envs}, num_actors={self._engine.num_actors})"


class AsyncVectorEnv(_RayDoor, _GymDoor):
    __doc__ = ("``fastvec.AsyncVectorEnv`` (a ``gymnasium.vector.VectorEnv``) whose envs run in "
               "Ray actors over a cluster.\n" + _RAY_DOC + "\n    Everything else: see "
               "``fastvec.AsyncVectorEnv``.\n")

    def __init__(
        self,
        env_fns: Sequence[Callable],
        *,
        ray_address: str | None = None,
        num_actors: int | None = None,
        actors_per_node: int | None = None,
        envs_per_actor: int | None = None,
        workers_per_actor: int | None = None,
        num_cpus_per_actor: float | None = None,
        start_timeout: float | None = 300.0,
        local_fast_path: bool = True,
        ray_init_kwargs: dict | None = None,
        copy: bool = True,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        step_timeout: float | None = None,
        context: str | None = None,
        num_slots: int = 2,
        restart_on_error: bool = False,
        spin_us: float | None = None,
        main_spin_us: float | None = None,
    ):
        self._ray_options = _ray_options(
            ray_address=ray_address, num_actors=num_actors, actors_per_node=actors_per_node,
            envs_per_actor=envs_per_actor, workers_per_actor=workers_per_actor,
            num_cpus_per_actor=num_cpus_per_actor, start_timeout=start_timeout,
            local_fast_path=local_fast_path, ray_init_kwargs=ray_init_kwargs)
        super().__init__(env_fns, copy=copy, autoreset_mode=autoreset_mode, step_timeout=step_timeout,
                         context=context, num_slots=num_slots, restart_on_error=restart_on_error,
                         spin_us=spin_us, main_spin_us=main_spin_us)


class SubprocVecEnv(_RayDoor, _SB3Door):
    __doc__ = ("``fastvec.SubprocVecEnv`` (Stable-Baselines3's ``VecEnv`` API) whose envs run "
               "in Ray actors over a cluster.\n" + _RAY_DOC + "\n    Everything else: see "
               "``fastvec.SubprocVecEnv``.\n")

    def __init__(
        self,
        env_fns: list[Callable],
        start_method: str | None = None,
        *,
        ray_address: str | None = None,
        num_actors: int | None = None,
        actors_per_node: int | None = None,
        envs_per_actor: int | None = None,
        workers_per_actor: int | None = None,
        num_cpus_per_actor: float | None = None,
        start_timeout: float | None = 300.0,
        local_fast_path: bool = True,
        ray_init_kwargs: dict | None = None,
        copy: bool = True,
        num_slots: int = 2,
        step_timeout: float | None = None,
        restart_on_error: bool = False,
        spin_us: float | None = None,
        main_spin_us: float | None = None,
    ):
        self._ray_options = _ray_options(
            ray_address=ray_address, num_actors=num_actors, actors_per_node=actors_per_node,
            envs_per_actor=envs_per_actor, workers_per_actor=workers_per_actor,
            num_cpus_per_actor=num_cpus_per_actor, start_timeout=start_timeout,
            local_fast_path=local_fast_path, ray_init_kwargs=ray_init_kwargs)
        super().__init__(env_fns, start_method, copy=copy, num_slots=num_slots, step_timeout=step_timeout,
                         restart_on_error=restart_on_error, spin_us=spin_us, main_spin_us=main_spin_us)
