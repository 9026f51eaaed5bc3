"""A step's dispatch and collection, per actor, over one of two transports.

- an actor on another node: one Ray actor task per step; actions go as numpy arrays in
  the task's arguments, results come back as numpy arrays through Ray (observations in
  chunks small enough to travel inline with the reply: a trip through the object store
  costs ~1 ms);
- an actor on the driver's own node (``local_fast_path``): the actor maps the driver's
  ring, reads its actions from it and writes its results into it; a doorbell on a
  private Unix socket (the engine's framing and commands, ``fastvec._core.channel``)
  starts the step and the reply carries only the infos.
"""

from __future__ import annotations

import pickle
import select
import socket
import time
import warnings

import numpy as np
import ray

from .._core import channel
from .._core import protocol as P
from .._core.infos import StepResult, join_parts
from ..errors import WorkerError

__all__ = ["StepTransport", "INLINE_BYTES"]

# Ray sends objects up to max_direct_call_object_size (100 KiB by default) inline with a
# task's reply; bigger ones go through the object store.
INLINE_BYTES = 90_000


class StepTransport:
    """Stepping for ``RayEngine``: ``_dispatch``, ``_collect_step`` and ``_result`` of
    ``EngineBase``'s template, and the doorbell sockets of actors on this node."""

    def _chunk_plan(self) -> None:
        """Per actor: the row ranges its observations come back in, or None (one piece)."""
        row_bytes = sum(int(np.prod(leaf.shape, dtype=np.int64)) * leaf.dtype.itemsize for leaf in self.obs_leaves_info)
        self._chunks = []
        for a, b in self.groups:
            n = b - a
            if row_bytes * n <= INLINE_BYTES or row_bytes > INLINE_BYTES:
                self._chunks.append(None)
            else:
                rows = max(1, INLINE_BYTES // row_bytes)
                self._chunks.append([(lo, min(lo + rows, n)) for lo in range(0, n, rows)])
        self._inflight_refs, self._inflight_parts, self._inflight_socks, self._dispatch_failures = {}, {}, {}, {}

    def _open_fast_path(self, k: int) -> None:
        """Doorbell socket to actor k if it runs on this node."""
        if not self.local_fast_path or self.placement[k]["node_id"] != self._driver_node:
            return
        a, b = self.groups[k]
        try:
            path = self._ray_get(
                self._actors[k].open_fast_path.remote(self.shm_name, self._plan_entries, a, b),
                k,
                self.options.start_timeout,
                "opening its shared-memory channel",
            )
        except WorkerError as exc:
            if exc.exc_type is None:  # the actor itself failed
                raise
            warnings.warn(
                f"fastvec.ray: {self._actor_desc(k)} cannot share this process's memory "
                f"({exc.exc_type}: {exc.exc_message}); its steps go through Ray tasks",
                RuntimeWarning,
                stacklevel=4,
            )
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.options.start_timeout)
            sock.connect(path)
            sock.settimeout(None)  # blocking, for the channel's framing; waits go through select
            channel.send_header(sock.fileno(), P.CMD_PING, 0)
            ready, _, _ = select.select([sock], [], [], self.options.start_timeout)
            if not ready or channel.recv_header(sock.fileno())[0] != P.REPLY_DONE:
                raise OSError("no answer to the first doorbell")
        except (OSError, channel.PeerClosed) as exc:
            sock.close()
            raise WorkerError(
                f"{self._actor_desc(k)} could not open its shared-memory channel: {exc}",
                worker=k,
                env_indices=range(a, b),
            ) from None
        self._state["socks"][k] = sock
        self.placement[k]["fast_path"] = True

    def _dispatch(self, slot: int) -> None:
        """Actions to every actor at once: doorbells to the local ones, Ray tasks to the rest."""
        socks = self._state["socks"]
        self._inflight_refs = {}
        self._inflight_parts = {}
        self._inflight_socks = {}
        self._dispatch_failures = {}
        for k, actor in enumerate(self._actors):
            sock = socks.get(k)
            if sock is not None:
                try:
                    channel.send_header(sock.fileno(), P.CMD_STEP, slot)
                    self._inflight_socks[sock] = k
                except (OSError, channel.PeerClosed) as exc:
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

    def _collect_step(self, slot: int, timeout):
        timeout = self._outer_timeout(timeout)
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
                        status, _slot, _arg, n = channel.recv_header(sock.fileno())
                        body = pickle.loads(channel.recv_payload(sock.fileno(), n))
                    except channel.PeerClosed:
                        failures[k] = (self._death(k, EOFError("its shared-memory channel closed"), "stepping"), True)
                        continue
                    except (OSError, EOFError, pickle.UnpicklingError, ValueError) as exc:
                        failures[k] = (self._death(k, exc, "stepping"), True)
                        continue
                    if status == P.REPLY_ERROR:
                        failures[k] = (self._error(k, body, "stepping"), bool(body["fatal"]))
                    else:
                        results[k] = body
            # Actors elsewhere: results travel back through Ray, written as they arrive.
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            got, failed = self._gather(
                self._inflight_refs, left, "stepping", on_reply=lambda k, reply: self._write_step(k, slot, reply)
            )
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
                    dst[slot, a + lo : a + hi] = src
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
            self.restarts.append(
                {"worker": k, "actor": k, "inner_worker": rec.get("worker"), "envs": envs, "error": rec.get("error")}
            )
            warnings.warn(
                f"fastvec.ray: {self._actor_desc(k)} restarted its worker {rec.get('worker')} "
                f"and reset envs {envs[0]}..{envs[-1]}: {rec.get('error')}",
                RuntimeWarning,
                stacklevel=4,
            )

    def _result(self, slot: int, results: dict) -> StepResult:
        parts, records = [], []
        for k in sorted(results):
            columns, recs, _new = results[k]
            start = self.groups[k][0]
            if columns is not None:
                parts.append((start, columns))
            else:
                records += [(start + j, step_info, reset_info) for j, step_info, reset_info in recs]
        if not records and len(parts) == 1 and parts[0][0] == 0 and self.num_actors == 1:
            return StepResult(self, slot, columns=parts[0][1])  # one actor: its columns are already global
        columns, records = join_parts(parts, records)
        return StepResult(self, slot, columns=columns, records=records)
