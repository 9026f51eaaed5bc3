"""The async pipeline's learner process seen from the collector: started
(``LearnerProcess``) ahead of its spec, on one end of a socket pair, and talked to
(``LearnerLink``: messages each way, and why it died where it did). Its main loop is
``fastvec.train.pipelines.learner.main``."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

from ..compute.ranks import RankError
from .handoff import POLL_S, dumps, ignore_sigint, learner_command, learner_env, restore_sigint

__all__ = ["LearnerError", "LearnerProcess", "LearnerLink", "learner_error"]


class LearnerError(RuntimeError):
    """The async pipeline's learner process raised or died."""


def learner_error(msg: tuple) -> Exception:
    """The error an ``("error", text[, "rank"])`` message from the learner stands for: a
    ``RankError`` where it failed because another rank's learner is gone."""
    return RankError(msg[1]) if msg[2:] == ("rank",) else LearnerError(msg[1])


class LearnerProcess:
    """The learner process, started ahead of its spec on one end of a socket pair.

    ``fork=True`` (where this process runs one thread) forks it: ready in milliseconds,
    with torch already imported. A forked child may only use one torch thread (the
    parent's OpenMP pool does not survive a fork: more threads hang) and no CUDA, so the
    collector tells it (``exec``) to replace itself with a fresh interpreter
    (``learner_command``) where the learner needs either: that takes a second or two
    (importing torch). ``fork=False`` starts the fresh interpreter at once. Not
    multiprocessing's spawn: that runs the caller's script again."""

    def __init__(self, fork: bool = True):
        ours, theirs = socket.socketpair()
        self.forked = fork and threading.active_count() == 1
        old = ignore_sigint()  # SIGINT ignored from the start (kept across exec): Ctrl-C is the collector's
        try:
            if self.forked:
                for stream in (sys.stdout, sys.stderr):  # nothing buffered for the child to write twice
                    try:
                        stream.flush()
                    except (AttributeError, OSError, ValueError):
                        pass
                self.proc: _Forked | subprocess.Popen = _Forked(theirs.fileno())
            else:
                self.proc = subprocess.Popen(
                    learner_command(theirs.fileno()), pass_fds=[theirs.fileno()], env=learner_env(), close_fds=True
                )
        except BaseException:
            ours.close()
            raise
        finally:
            restore_sigint(old)
            theirs.close()
        self.conn = Connection(ours.detach())

    def close(self, timeout: float = 10.0) -> None:
        """Ask it to stop; kill it after ``timeout`` seconds. Safe to call twice."""
        if self.proc.poll() is None:
            try:
                self.conn.send_bytes(dumps(("stop",)))
            except OSError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5.0)
        if not self.conn.closed:
            self.conn.close()


class _Forked:
    """A forked learner, with ``subprocess.Popen``'s ``poll``, ``wait``, ``kill`` and
    ``pid``. The child closes every inherited descriptor but its socket and std streams
    (a copy of a worker's socket would keep that worker from noticing its parent die),
    and never returns into the caller's code: it ends with ``os._exit``."""

    def __init__(self, fd: int):
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:  # the child
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.closerange(3, fd)
                os.closerange(fd + 1, _max_fd())
                from .learner import main

                main(fd, forked=True)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired("fastvec learner", timeout or 0.0)
            time.sleep(0.005)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):  # pragma: no cover
        return 4096


class LearnerLink:
    """The collector's end of a started ``LearnerProcess``: ``send`` and ``receive`` its
    messages (``fastvec.train.pipelines.handoff``), a ``LearnerError`` with its last words where it died."""

    def __init__(self, learner: LearnerProcess):
        self.learner, self.proc, self.conn = learner, learner.proc, learner.conn

    def send(self, msg) -> None:
        try:
            self.conn.send_bytes(dumps(msg))
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            raise self.failure() from None

    def pending(self) -> bool:
        """A message waits (``receive`` will not block)."""
        return self.conn.poll(0)

    def receive(self):
        """The learner's next message; LearnerError where it died (its last words first)."""
        while True:
            try:
                if self.conn.poll(POLL_S):
                    return pickle.loads(self.conn.recv_bytes())
            except (EOFError, ConnectionResetError, OSError):
                raise self.failure() from None
            if self.proc.poll() is not None:
                raise self.failure()

    def failure(self) -> Exception:
        """Why the learner is gone, as the error to raise: its own where it sent one before
        exiting (``learner_error``), else how it died."""
        try:
            while self.conn.poll(0):
                msg = pickle.loads(self.conn.recv_bytes())
                if msg[0] == "error":
                    return learner_error(msg)
        except (EOFError, OSError):
            pass
        return LearnerError(self.death())

    def death(self) -> str:
        """How the learner process ended."""
        try:
            code = self.proc.wait(1.0)
        except subprocess.TimeoutExpired:
            code = None
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        return f"the learner process died ({how})"

    def close(self, timeout: float = 10.0) -> None:
        """Stop the learner (it finishes what it is doing); kill it after ``timeout``."""
        self.learner.close(timeout)
