"""``fastvec train --nproc N``: the N ranks of one data-parallel run on this machine.

Each rank is a ``fastvec train`` process of its own with torchrun's variables set
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` on
127.0.0.1 and a free ``MASTER_PORT``), so a rank started here and one started by
``torchrun`` on another node are the same program (``fastvec.train.compute.ranks``). This
process only watches them:

- a rank that fails (an error, or killed) ends the run: the others are asked to stop
  (SIGTERM; they are likely waiting in a collective that fails on its own once the rank's
  sockets close), killed after a grace period, and one line names the rank;
- Ctrl-C and SIGTERM here are passed to every rank once: they stop together at their
  next safe point with a checkpoint, and this process exits with their code (130 / 143);
- should this process be killed, each rank gets SIGTERM from the kernel (``PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

from ..compute.ranks import OTHER_RANK_FAILED

__all__ = ["run_ranks", "rank_argv"]

_GRACE_S = 5.0  # after a rank failed, how long the others get to exit on their own
_PR_SET_PDEATHSIG = 1


def rank_argv(argv: list[str], logdir: str | None) -> list[str]:
    """``fastvec train``'s arguments for a rank: without ``--nproc``, with the run
    directory every rank is to share (rank 0 writes it; a resume reads it)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    if logdir is not None and not any(a == "--logdir" or a.startswith("--logdir=") for a in out):
        out += ["--logdir", logdir]
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child, before exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def run_ranks(argv: list[str], nproc: int) -> int:
    """Run ``fastvec train argv`` as ``nproc`` ranks; the run's exit code."""
    env = dict(os.environ)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), FASTVEC_LEARNER_PORT=str(_free_port()))
    env.update(WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc))
    procs = []
    for rank in range(nproc):
        env_r = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "fastvec", "train", *argv],
                env=env_r,
                stdout=None if rank == 0 else subprocess.DEVNULL,  # rank 0 prints the run's JSON line
                process_group=0,  # a terminal's Ctrl-C reaches this process only, which passes it on once
                preexec_fn=_die_with_parent,
            )
        )
    return _Watch(procs).run()


class _Watch:
    """The ranks' processes until every one has exited."""

    def __init__(self, procs: list[subprocess.Popen]):
        self.procs = procs
        self.signalled: int | None = None

    def _forward(self, signum, frame) -> None:
        if self.signalled is None:  # once: a second signal to a rank means "stop now"
            self.signalled = signum
            for p in self.procs:
                if p.poll() is None:
                    p.send_signal(signum)

    def run(self) -> int:
        old = {s: signal.signal(s, self._forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            failed = self._until_done_or_failed()
            if failed is not None:
                rank, code = self._first_cause(*failed)
                self._stop_the_rest()
                print(
                    f"fastvec train: error: {_how(rank, len(self.procs), code)}; the other ranks were stopped",
                    file=sys.stderr,
                )
                return 1
            codes = [p.returncode for p in self.procs]
            return max(codes, key=abs)
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def _until_done_or_failed(self) -> tuple[int, int] | None:
        """``(rank, exit code)`` of the first rank to fail, or None once all have exited
        without failing (0, or a stop by the signal passed on)."""
        while True:
            running = False
            for rank, p in enumerate(self.procs):
                code = p.poll()
                if code is None:
                    running = True
                elif code != 0 and not (self.signalled is not None and code in (128 + self.signalled, -self.signalled)):
                    return rank, code
            if not running:
                return None
            time.sleep(0.05)

    def _first_cause(self, rank: int, code: int) -> tuple[int, int]:
        """The rank to name: where the first to fail failed only because another did
        (``OTHER_RANK_FAILED``), that other one, once it has exited (a moment at most)."""
        deadline = time.monotonic() + _GRACE_S
        while code == OTHER_RANK_FAILED and time.monotonic() < deadline:
            for r, p in enumerate(self.procs):
                c = p.poll()
                if c is not None and c not in (0, OTHER_RANK_FAILED):
                    return r, c
            time.sleep(0.02)
        return rank, code

    def _stop_the_rest(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _GRACE_S
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _how(rank: int, world: int, code: int) -> str:
    if code < 0:
        return f"rank {rank} of {world} was killed by {signal.Signals(-code).name}"
    return f"rank {rank} of {world} failed (exit code {code})"
