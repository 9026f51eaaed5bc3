"""Worker restarts, counted and limited: an env that fails on every reset or step must
end the run, not loop.

Ctrl-C and SIGTERM during ``fastvec train``: a stop at the next safe point, with a
checkpoint; a second signal stops at once.
"""

from __future__ import annotations

import collections
import signal
import sys
import threading

from ..config.settings import PPOConfig
from ..storage.sources import RolloutStorage

__all__ = ["RestartLimitError", "RestartWatch", "StopOnSignal"]


class RestartLimitError(RuntimeError):
    """Workers were replaced more often than ``max_restarts`` per ``restart_window``."""


class RestartWatch:
    """Counts the storage's worker restarts (after the step that made them, and at safe
    points); too many within ``restart_window`` env steps raise ``RestartLimitError`` (an
    env that fails on every reset or step must end the run, not loop)."""

    def __init__(self, storage: RolloutStorage, cfg: PPOConfig, before: int = 0):
        self.storage, self.limit, self.window = storage, cfg.max_restarts, cfg.restart_window
        self.seen = 0
        self.total = before
        self.recent: collections.deque = collections.deque()

    def check(self, env_steps: int) -> None:
        records = self.storage.restarts
        new = records[self.seen :]
        self.seen = len(records)
        self.total += len(new)
        self.recent.extend([env_steps] * len(new))
        while self.recent and self.recent[0] <= env_steps - self.window:
            self.recent.popleft()
        if len(self.recent) > self.limit:
            last = (new or records[-1:])[-1].get("error", "")
            raise RestartLimitError(
                f"{len(self.recent)} worker restarts within {self.window} env steps "
                f"(max_restarts={self.limit}); the last: {last}"
            )


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
