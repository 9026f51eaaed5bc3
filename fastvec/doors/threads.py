"""Sharing the cores with the caller's torch.

A training loop runs its policy between two steps and its learner between rollouts,
in torch's intra-op thread pool (one thread per core by default). After each parallel
region those threads spin for a while before they sleep, so on a small machine they
take the cores the workers need for the very step that follows: on 2 cores with 2
workers, a policy loop on HalfCheetah-v5 x8 ran at 0.7x SyncVectorEnv with torch's
default 2 threads and 1.4-1.7x with 1 thread (``benchmarks/bench_loops.py --loops policy``).

So by default a door gives torch the cores its workers leave: ``torch_threads="auto"``
lowers ``torch.set_num_threads`` to ``max(1, cores - num_workers)`` when torch is loaded
in this process, uses more threads than that, and neither ``OMP_NUM_THREADS`` nor
``MKL_NUM_THREADS`` says the user chose; ``close()`` restores what it changed. An int
sets that many threads; None leaves torch alone.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from ..options import available_cores

_USER_CHOICE = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def check_torch_threads(value):
    """``"auto"``, None or a positive int, else ValueError."""
    if value is None or value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"torch_threads must be 'auto', None or a positive int, got {value!r}")
    return int(value)


class TorchThreads:
    """What a door did to torch's thread count, so that ``restore`` can undo it."""

    def __init__(self, setting):
        self.setting = check_torch_threads(setting)
        self.num_workers: int | None = None  # set by the door; None: the envs run elsewhere
        self.before: int | None = None  # torch's count before we changed it
        self.set_to: int | None = None

    def apply(self) -> None:
        """Fit torch to the cores left (called when the door opens and on reset, as torch
        may be imported after the door was made)."""
        torch = sys.modules.get("torch")
        if torch is None or self.setting is None or self.set_to is not None:
            return
        if self.setting == "auto":
            if self.num_workers is None or any(os.environ.get(v) for v in _USER_CHOICE):
                return
            want = max(1, available_cores() - self.num_workers)
        else:
            want = self.setting
        now = torch.get_num_threads()
        if want == now or (self.setting == "auto" and want > now):
            return
        torch.set_num_threads(want)
        self.before, self.set_to = now, want

    def restore(self) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and self.set_to is not None and torch.get_num_threads() == self.set_to:
            torch.set_num_threads(self.before)
        self.before = self.set_to = None
