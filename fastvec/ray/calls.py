"""Calls to the actors, and the driver-side errors of the failures they report."""

from __future__ import annotations

import time

import ray

from ..errors import WorkerError, load_cause_class, worker_error

__all__ = ["ActorCalls", "CLOSE_GRACE_S"]

# How long closing waits for the actors: what is in flight, then their own close.
CLOSE_GRACE_S = 5.0


class ActorCalls:
    """Actor calls for ``RayEngine``: waiting for replies as they come, and turning a
    dead, silent or failing actor into a ``WorkerError`` that names it and its envs."""

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
        return worker_error(
            message,
            cause_class=load_cause_class(rep.get("exc_class")) if env_index is not None else None,
            worker=k,
            env_indices=range(a, b),
            env_index=None if env_index is None else a + env_index,
            exc_type=rep["exc_type"],
            exc_message=rep["exc_message"],
            worker_traceback=rep["worker_traceback"],
        )

    def _death(self, k: int, exc: BaseException, doing: str) -> WorkerError:
        self._state.setdefault("lost", set()).add(k)  # not worth asking to close
        a, b = self.groups[k]
        text = str(exc).strip().splitlines()
        detail = text[0] if text else type(exc).__name__
        what = "failed" if isinstance(exc, ray.exceptions.RayTaskError) else "died"
        return WorkerError(
            f"{self._actor_desc(k)} {what} while {doing}: {type(exc).__name__}: {detail}",
            worker=k,
            env_indices=range(a, b),
        )

    def _silent(self, k: int, timeout: float, doing: str) -> WorkerError:
        self._state.setdefault("lost", set()).add(k)
        a, b = self.groups[k]
        return WorkerError(
            f"{self._actor_desc(k)} did not answer within {timeout:g} s while {doing}",
            worker=k,
            env_indices=range(a, b),
        )

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
                    for k in pending.values():
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
