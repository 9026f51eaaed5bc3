"""Worker restarts, counted and limited: an env that fails on every reset or step must
end the run, not loop."""

from __future__ import annotations

import collections

from .config import PPOConfig
from .storage import RolloutStorage

__all__ = ["RestartLimitError", "RestartWatch"]


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
