"""The replies of a command, from every worker it went to: waited for, read, decoded.

A dead, silent or garbling worker is *fatal* (the engine is unusable until closed, or
the worker is replaced); an env that raised is not. Either way every healthy worker's
reply is read first, so that no reply is left to be mistaken for a later one.
"""

from __future__ import annotations

import pickle
import time

import numpy as np

from ..errors import WorkerError, load_cause_class, worker_error
from . import channel
from . import protocol as P
from .protocol import WaitResult

__all__ = ["WorkerReplies", "TABLE_REPORT"]

# A worker's step report when its infos are in the shared info table.
TABLE_REPORT = ("table", None)


class WorkerReplies:
    """``Engine``'s reading of its workers' replies (uses ``_ctl``, the doorbells;
    ``_sup``, the processes; ``_table``, the info schemas)."""

    _broken: str | None  # declared by EngineBase: why the engine is unusable, None while it is fine

    def _gather(self, workers, timeout, doing: str, slot: int | None = None) -> dict:
        """Collect one reply from each worker in ``workers``: {worker: payload object}.

        A dead, silent or garbling worker breaks the engine (``WorkerError``); an env
        that raised is reported as ``WorkerError`` after every reply is in, and the
        engine stays usable.
        """
        results, failures = self._collect(workers, timeout, doing, slot)
        if failures:
            _w, (exc, fatal) = next(iter(failures.items()))
            if fatal:
                self._broken = str(exc)
            raise exc
        return results

    def _collect(self, workers, timeout, doing: str, slot: int | None = None, waited: tuple | None = None):
        """Wait for every worker in ``workers``; never stop at the first failure, so the
        healthy workers' replies are consumed and they stay consistent. ``waited``: the
        ``(status, worker)`` a first wait over every worker already returned.

        Returns ``(results, failures)``: {w: payload object} and {w: (WorkerError, fatal)},
        fatal meaning the worker is dead, silent or garbling (not just an env that raised).
        """
        failures: dict[int, tuple] = {}
        self._await_all(workers, timeout, doing, waited, failures)
        if slot is not None and not failures and len(workers) == self.num_workers:
            # The common step: payload-less DONEs, infos (if any) in the table.
            n_table = self._ctl.plain_step_replies(slot)
            if n_table == 0:
                return dict.fromkeys(range(self.num_workers)), failures
            if n_table == self.num_workers:
                return dict.fromkeys(range(self.num_workers), TABLE_REPORT), failures
        results = {}
        for w, reply in self._take_replies(workers, slot, doing, failures).items():
            before = self._broken
            try:
                results.update(self._decode({w: reply}, doing))
            except WorkerError as exc:
                failures[w] = (exc, self._broken is not before)  # _decode marks garbage fatal
                self._broken = before
        return results, failures

    def _lost(self, w: int, message: str) -> tuple:
        """The failure of a dead, silent or garbling worker: ``(WorkerError, fatal)``."""
        return WorkerError(message, worker=w, env_indices=self.envs_of(w).tolist()), True

    def _await_all(self, workers, timeout, doing: str, waited: tuple | None, failures: dict) -> None:
        """Wait until each of ``workers`` is done or has failed (into ``failures``)."""
        pending = [int(w) for w in workers]
        # Every worker (a step): the first wait takes the precomputed array.
        first = self._all_workers if len(pending) == self.num_workers else None
        deadline = None if timeout is None else time.monotonic() + timeout
        describe = self._sup.describe
        try:
            while pending:
                left = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
                if waited is not None:
                    status, w = waited
                    waited = None
                else:
                    status, w = self._ctl.wait(first if first is not None else np.asarray(pending, dtype=np.intc), left)
                first = None
                if status == WaitResult.DONE:
                    break
                if status == WaitResult.DIED:
                    failures[w] = self._lost(w, self._sup.death_message(w, doing))
                    pending.remove(w)
                    continue
                if status == WaitResult.GARBLED:
                    failures[w] = self._lost(w, f"{describe(w)} sent a malformed message while {doing}")
                    pending.remove(w)
                    continue
                for v in list(pending):  # WaitResult.TIMEOUT: every worker still silent has failed
                    if not self._ctl.is_done(v):
                        failures[v] = self._lost(v, f"{describe(v)} did not answer within {timeout:g} s while {doing}")
                        pending.remove(v)
        except KeyboardInterrupt:
            # Replies still in flight would be mistaken for later ones: give up on this engine.
            self._broken = "interrupted while waiting for the workers"
            raise

    def _take_replies(self, workers, slot: int | None, doing: str, failures: dict) -> dict:
        """The raw reply of each of ``workers`` not failed yet: {w: (code, slot, arg,
        payload)}; one unreadable, or for another slot than ``slot``, joins ``failures``."""
        describe = self._sup.describe
        replies = {}
        for w in workers:
            w = int(w)
            if w in failures:
                continue
            try:
                reply = self._ctl.reply(w)
            except channel.PeerClosed:
                failures[w] = self._lost(w, self._sup.death_message(w, doing))
                continue
            except ValueError as exc:
                failures[w] = self._lost(w, f"{describe(w)} sent a malformed message while {doing}: {exc}")
                continue
            if slot is not None and reply[0] == P.REPLY_DONE and reply[1] != slot:
                failures[w] = self._lost(
                    w, f"{describe(w)} answered for slot {reply[1]} instead of {slot} while {doing}"
                )
                continue
            replies[w] = reply
        return replies

    def _decode(self, replies: dict, doing: str) -> dict:
        """Unpickle payloads; raise the first env error once all replies are read.
        Garbled replies mark the engine broken (``self._broken``)."""
        results, error = {}, None
        describe = self._sup.describe
        for w, (cmd, _slot, arg, blob) in replies.items():
            if cmd not in (P.REPLY_DONE, P.REPLY_RESULT, P.REPLY_ERROR, P.REPLY_READY):
                raise self._fail(w, f"{describe(w)} sent a malformed control message (reply code {cmd}) while {doing}")
            try:
                obj = pickle.loads(blob) if blob is not None else None
            except Exception as exc:
                raise self._fail(w, f"{describe(w)} sent an unreadable payload while {doing}: {exc}") from None
            if cmd == P.REPLY_ERROR:
                if error is None:
                    error = (w, obj)
                continue
            if arg & P.IN_TABLE:
                if cmd != P.REPLY_DONE or (obj is not None and not self._table.learn(w, obj)):
                    raise self._fail(w, f"{describe(w)} sent a malformed info table report while {doing}")
                obj = TABLE_REPORT
            results[w] = obj
        if error is not None:
            w, info = error
            if not isinstance(info, dict) or not {"exc_type", "message", "traceback", "during"} <= info.keys():
                raise self._fail(w, f"{describe(w)} sent a malformed error report while {doing}")
            idx = info.get("env_index")
            where = f"env {idx}" if idx is not None else describe(w)
            raise worker_error(
                f"{where} raised {info['exc_type']}: {info['message']} (during {info['during']}, in {describe(w)})",
                cause_class=load_cause_class(info.get("exc_class")),
                worker=w,
                env_indices=self.envs_of(w).tolist(),
                env_index=idx,
                exc_type=info["exc_type"],
                exc_message=info["message"],
                worker_traceback=info["traceback"],
            )
        return results
