"""The Ray actor: a node-local ``Engine`` over a contiguous group of the envs.

Replies are tuples starting with "ok", or ``("error", report)`` where ``report`` (see
``report``) describes the exception for the driver. Actors on the driver's node may
also serve steps over a doorbell socket (``open_fast_path``), reading actions from and
writing results into the driver's ring directly.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import tempfile
import threading
import traceback

import cloudpickle
import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._core import channel
from .._core import protocol as P
from .._core.base import IN_SLOT
from .._core.pickled import dumps
from .._core.segment import Ring, SegmentPlan, attach_segment
from ..engine import Engine
from ..errors import WorkerError, cause_class_blob
from ..options import EngineOptions

__all__ = ["FastvecActor", "actor_class", "report", "forget_segment", "janitor"]


def report(exc: BaseException, fatal: bool | None = None) -> dict:
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
            "exc_class": cause_class_blob(exc),
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
        "exc_class": cause_class_blob(exc),
        "fatal": True if fatal is None else fatal,
    }


class FastvecActor:
    """One Ray actor: a node-local ``Engine`` over envs ``[start, stop)`` of the vector
    env. Replies are tuples starting with "ok" or ("error", report)."""

    def __init__(self, blob, start: int, num_workers: int, options: EngineOptions):
        self._start = start
        self._engine = None
        self._error = None
        self._slot = 0
        self._conn = None
        self._ring = None
        try:
            fns = cloudpickle.loads(blob)
            self._engine = Engine(fns, options.replace(num_slots=2), num_workers=num_workers)
        except BaseException as exc:  # reported by hello(): the driver decides
            self._error = report(exc, fatal=True)
            return
        name = getattr(self._engine, "shm_name", None)
        if name and not options.restart_on_error:
            # Nothing attaches to the engine's segment by name after start-up (only a
            # replacement worker would): drop the name now. Ray ends a lost actor together
            # with its whole process group, resource tracker included, which would leave
            # the segment behind. The mappings stay valid until the processes exit.
            forget_segment(name)

    # ------------------------------------------------------------ start-up
    def hello(self):
        if self._error is not None:
            return ("error", self._error)
        eng = self._engine
        return (
            "ok",
            {
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
            },
        )

    def processes(self):
        eng = self._engine
        return (
            "ok",
            {
                "pid": os.getpid(),
                "worker_pids": eng.worker_pids if eng is not None else [],
                "node_id": ray.get_runtime_context().get_node_id(),
            },
        )

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
            columns, records = eng.step(IN_SLOT, s).general()
        except Exception as exc:
            return ("error", report(exc))
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
            return (
                "ok",
                [b[s] for b in eng.obs_bufs],
                ended,
                finals,
                eng.rewards[s],
                term,
                trunc,
                columns,
                records,
                new,
            )
        parts = tuple([b[s][lo:hi] for b in eng.obs_bufs] for lo, hi in chunks)
        return parts + (("ok", None, ended, finals, eng.rewards[s], term, trunc, columns, records, new),)

    def reset(self, blob):
        try:
            kwargs = pickle.loads(blob)
            eng = self._engine
            s = self._slot = 1 - self._slot
            infos = eng.reset(s, kwargs)
        except Exception as exc:
            return ("error", report(exc))
        idx = np.asarray(sorted(kwargs), dtype=np.int64)
        return ("ok", infos, idx, [b[s][idx] for b in eng.obs_bufs])

    def call(self, blob):
        try:
            kind, name, args, kwargs, indices, values = pickle.loads(blob)
            out = self._engine.call(kind, name, args, kwargs, indices=indices, values=values)
        except Exception as exc:
            return ("error", report(exc, fatal=False) if not isinstance(exc, WorkerError) else report(exc))
        try:
            return ("ok", dumps(out))
        except Exception as exc:
            return ("error", report(exc, fatal=False))

    # ------------------------------------------------------------ fast path
    def open_fast_path(self, shm_name, entries, start, stop):
        """Map the driver's ring and listen on a private Unix socket for doorbells.
        Returns ("ok", the socket's path) (the driver connects once; the path is then
        removed), or ("error", report) when this is not possible here."""
        try:
            return ("ok", self._open_fast_path(shm_name, entries, start, stop))
        except Exception as exc:
            self._ring = None
            return ("error", report(exc, fatal=False))

    def _open_fast_path(self, shm_name, entries, start, stop):
        arrays = SegmentPlan.from_entries(entries).arrays(attach_segment(shm_name))
        self._ring = Ring.of(arrays, envs=(start, stop))
        folder = tempfile.mkdtemp(prefix="fastvec-ray-")  # mode 0700
        path = os.path.join(folder, "doorbell")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        listener.settimeout(120.0)
        threading.Thread(
            target=self._serve_fast_path, args=(listener, folder, path), name="fastvec-doorbell", daemon=True
        ).start()
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
        fd = conn.fileno()
        ring = self._ring
        try:
            while True:
                try:
                    cmd, slot, _arg, _n = channel.recv_header(fd)
                except channel.PeerClosed:
                    return  # the driver closed: done
                if cmd == P.CMD_PING:
                    channel.send_header(fd, P.REPLY_DONE, 0)
                    continue
                out = self._step([a[slot] for a in ring.act])
                if out[0] == "error":
                    channel.send_header(fd, P.REPLY_ERROR, slot, 0, dumps(out[1]))
                    continue
                s, columns, records, new = out
                eng = self._engine
                for dst, src in zip(ring.obs, eng.obs_bufs):
                    dst[slot] = src[s]
                term, trunc = eng.terminated[s], eng.truncated[s]
                ring.rewards[slot] = eng.rewards[s]
                ring.terminated[slot] = term
                ring.truncated[slot] = trunc
                ended = term | trunc
                if ended.any():
                    for dst, src in zip(ring.final, eng.final_bufs):
                        dst[slot][ended] = src[s][ended]
                channel.send_header(fd, P.REPLY_DONE, slot, 0, dumps((columns, records, new)))
        except (OSError, channel.PeerClosed):
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


def actor_class():
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(max_restarts=0, max_task_retries=0)(FastvecActor)
    return _ACTOR_CLASS


def forget_segment(name: str) -> None:
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


def janitor(state: dict, node_id: str, names) -> None:
    """Start the clean-up of ``names`` on ``node_id`` (waited for at shutdown)."""
    global _JANITOR
    names = [n for n in names if n]
    if not names or not ray.is_initialized():
        return
    if _JANITOR is None:
        _JANITOR = ray.remote(num_cpus=0, max_retries=0)(_unlink_segments)
    try:
        ref = _JANITOR.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)).remote(
            names
        )
    except Exception:
        return
    state.setdefault("janitors", []).append(ref)
