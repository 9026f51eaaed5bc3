"""Worker processes: started, watched, replaced and stopped.

A ``Supervisor`` owns one process and one socket per worker. Closing our end of a
worker's socket is the close command: the worker reads end of file, closes its envs and
exits. A worker that does not (an env stuck in a step) gets SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import os
import pickle
import time
import weakref
from multiprocessing.connection import wait

import cloudpickle
import numpy as np

from . import channel
from . import protocol as P
from .placement import envs_text
from .segment import release_segment
from .worker import WorkerSpec, worker_main

CLOSE_GRACE_S = 2.0


def shutdown(procs, conns, segment_box, grace: float) -> None:
    """Stop workers and free the segment. Module-level so a finalizer can call it
    without keeping the engine alive; safe to run twice."""
    procs = [p for p in procs if p is not None]
    for conn in conns:
        if conn is None:
            continue
        try:
            conn.close()
        except OSError:
            pass
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)
    for proc in procs:
        try:
            proc.close()
        except ValueError:
            pass
    segment = segment_box.pop() if segment_box else None
    release_segment(segment, unlink=True)


class Supervisor:
    """The worker processes of one engine. ``placement[w]`` holds the indices of the
    envs worker ``w`` runs (``fastvec._core.placement``); ``fds`` (an int array the
    doorbells read in place) holds the parent's end of each worker's socket. ``mode``:
    the autoreset mode's ``protocol`` code; ``daemon``: start daemonic processes."""

    def __init__(self, owner, ctx, env_fns: list, placement: list, *, mode: int, daemon: bool = True):
        self.ctx = ctx
        self.daemon = daemon
        self.env_fns = env_fns
        self.num_envs = len(env_fns)
        self.mode = mode
        self.place(placement)
        n = len(placement)
        self.procs: list = [None] * n
        self.conns: list = [None] * n
        self.fds = np.full(n, -1, dtype=np.intc)
        self.segment_box: list = []  # the segment, once created, so the finalizer frees it
        self.finalizer = weakref.finalize(owner, shutdown, self.procs, self.conns, self.segment_box, CLOSE_GRACE_S)

    def place(self, placement: list) -> None:
        """Worker w runs envs ``placement[w]``: their factories, pickled once per worker
        (a closure the envs share travels once per worker, not once per env)."""
        self.placement = placement
        self.blobs = [cloudpickle.dumps([self.env_fns[i] for i in envs]) for envs in placement]

    @property
    def pids(self) -> list[int]:
        return [int(p.pid) for p in self.procs]

    def spawn(self, w: int, probe_s: float = 0.0) -> None:
        """Start the process of worker w (again, after a failure); ``probe_s > 0``: it
        first times its envs on throwaway instances and waits for ``build`` (a probe)."""
        parent, child = self.ctx.Pipe(duplex=True)
        # With fork the child inherits every socket of ours; it closes all but its own.
        close_fds = (
            [c.fileno() for c in self.conns if c is not None] + [parent.fileno()]
            if self.ctx.get_start_method() == "fork"
            else []
        )
        spec = WorkerSpec(
            index=w,
            fns_blob=self.blobs[w],
            rows=self.placement[w],
            num_envs=self.num_envs,
            mode=self.mode,
            main_pid=os.getpid(),
            close_fds=close_fds,
            probe_s=probe_s,
        )
        proc = self.ctx.Process(
            target=worker_main,
            args=(spec, child),
            name=f"fastvec-worker-{w}",
            # daemonic: multiprocessing ends it at exit, but it may not start processes
            # of its own; either way it watches its parent and exits with it.
            daemon=self.daemon,
        )
        try:
            proc.start()
        finally:
            child.close()
        self.conns[w] = parent
        self.procs[w] = proc
        self.fds[w] = parent.fileno()  # in place: the Controller reads this array

    def build(self, w: int) -> None:
        """After a probe: tell worker w which envs to build (``place`` first)."""
        payload = pickle.dumps((self.placement[w], self.blobs[w]), protocol=pickle.HIGHEST_PROTOCOL)
        channel.send_header(int(self.fds[w]), P.CMD_BUILD, 0, 0, payload)

    def stop(self, w: int) -> None:
        """End worker w's process (it failed) and close its socket."""
        proc = self.procs[w]
        if proc.is_alive():
            proc.terminate()
            proc.join(CLOSE_GRACE_S)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        try:
            self.conns[w].close()
        except OSError:
            pass
        self.conns[w] = None
        proc.close()

    def describe(self, w: int) -> str:
        pid = self.procs[w].pid if self.procs[w] is not None else None
        return f"worker {w} (pid {pid}, envs {envs_text(self.placement[w])})"

    def death_message(self, w: int, doing: str) -> str:
        proc = self.procs[w]
        proc.join(0.5)
        code = proc.exitcode
        if code is None:
            how = "closed its control socket"
        elif code < 0:
            how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        return f"{self.describe(w)} {how} while {doing}"

    def read_replies(self, workers, timeout, doing: str, fail) -> dict:
        """Start-up replies, read straight off the sockets (no doorbells yet):
        ``{w: (code, slot, arg, payload bytes or None)}``. ``fail(w, message)`` makes
        the exception to raise for a dead, silent or garbling worker."""
        workers = list(workers)
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: dict[int, tuple] = {}
        by_conn = {id(self.conns[w]): w for w in workers}
        while len(replies) < len(workers):
            left = [self.conns[w] for w in workers if w not in replies]
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(left, remaining)
            if not ready:
                w = by_conn[id(left[0])]
                raise fail(w, f"{self.describe(w)} did not answer within {timeout:g} s while {doing}")
            for conn in ready:
                w = by_conn[id(conn)]
                try:
                    cmd, rslot, arg, n = channel.recv_header(conn.fileno())
                    replies[w] = (cmd, rslot, arg, channel.recv_payload(conn.fileno(), n) if n else None)
                except channel.PeerClosed:
                    raise fail(w, self.death_message(w, doing)) from None
                except ValueError as exc:
                    raise fail(w, f"{self.describe(w)} sent a malformed message while {doing}: {exc}") from None
        return replies
