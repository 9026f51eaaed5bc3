"""torch's process-wide state as the trainer sets it: the device, the RNG states, the
thread count (switched between acting and learning), the first-use costs.

Threads: ``torch_threads`` defaults to 1 for MLP policies (on 2 cores, 2 threads are
no faster for a 64x64 MLP and fight the env workers for the second core) and to all
cores for CNNs (the env workers sleep while the policy runs: acting is synchronous).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from ...options import available_cores
from ..config.settings import ConfigError

__all__ = ["resolve_device", "rng_state", "set_rng_state", "warm_up_torch", "Threads"]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda requested but CUDA is not available")
    return dev


def rng_state() -> dict:
    """torch's and numpy's global RNG states (and CUDA's where initialised)."""
    st = {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    if "cuda" in st and torch.cuda.is_available():
        try:
            torch.cuda.set_rng_state_all(st["cuda"])
        except (RuntimeError, IndexError):  # another device count: CUDA draws differ, the rest holds
            pass


_WARM = False


def warm_up_torch() -> None:
    """First-use costs (autograd engine start-up) before the clock starts. The trainer
    never builds a ``torch.optim`` optimiser, whose first construction imports
    ``torch._dynamo`` (3-6 s here)."""
    global _WARM
    if not _WARM:
        p = nn.Parameter(torch.zeros(2))
        (p * 2).sum().backward()
        _WARM = True


class Threads:
    """torch's intra-op threads while acting (``act``) and while learning (``learn``),
    and the switch between them (``use``: a no-op when the count is already set).

    Acting runs right before each env step: its threads must leave the workers' cores
    free (they spin a while after each op; see ``fastvec.doors.threads``). Learning has
    the cores to itself."""

    def __init__(self, cfg, cnn: bool, workers: int):
        self.act = cfg.torch_threads or (max(1, available_cores() - workers) if cnn else 1)
        self.learn = cfg.learn_threads or cfg.torch_threads or (available_cores() if cnn else 1)
        self._now: int | None = None

    def use(self, n: int) -> None:
        if self._now != n:
            torch.set_num_threads(n)
            self._now = n
