"""Ctrl-C and SIGTERM during ``fastvec train``: a stop at the next safe point, with a
checkpoint; a second signal stops at once."""

from __future__ import annotations

import signal
import sys
import threading

__all__ = ["StopOnSignal"]


class StopOnSignal:
    """SIGINT / SIGTERM ask the training loop to stop at its next safe point (it writes
    a checkpoint and returns); a second signal raises KeyboardInterrupt at once."""

    def __init__(self):
        self.signum = None
        self.last = None
        self._old = {}

    def __call__(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame):
        self.last = signum
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        print(
            f"fastvec train: {signal.Signals(signum).name}: stopping at the next safe point with a "
            "checkpoint (again: stop now)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()
