"""Cores: the piece between a policy's encoder and its heads, where memory goes.

A core maps the encoder's features to the features its heads read. ``IdentityCore``
has no memory: it passes the features through (no parameters, no state), so a policy
with it computes exactly encoder then heads. ``RecurrentCore`` (an LSTM or a GRU cell)
keeps ``state_size`` numbers per env, one flat row (the LSTM's ``h`` then ``c``): the
rollout stores the row each step was fed (``fastvec.train.storage.rollout``), zero where an
episode starts, and PPO's epochs replay whole sequences from the rows recorded at
their starts.

The one rule both the acting step and the sequence replay follow: the state fed at step
``t`` is the state the core gave at ``t - 1``, zeroed where an episode starts at ``t``
(``starts[t]``: the previous step ended an episode, terminated or truncated).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..config.rules import CORES

__all__ = ["IdentityCore", "RecurrentCore", "CORES", "make_core"]

"""What ``policy_core`` may be: none (no memory), lstm or gru."""


class IdentityCore(nn.Module):
    """No memory: the features as they are."""

    state_size = 0
    """Numbers of recurrent state per env (none)."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features


class RecurrentCore(nn.Module):
    """An LSTM or GRU of ``size`` units over features of ``in_size``; its state is one row
    of ``state_size`` numbers per env (LSTM: ``h`` then ``c``; GRU: ``h``)."""

    def __init__(self, kind: str, in_size: int, size: int):
        super().__init__()
        if kind not in ("lstm", "gru"):
            raise ValueError(f"a recurrent core is lstm or gru, got {kind!r}")
        self.kind, self.size = kind, int(size)
        self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(in_size, self.size)
        self.state_size = 2 * self.size if kind == "lstm" else self.size
        # Zero biases and orthogonal recurrent weights, as CleanRL's LSTM agents start.
        for name, p in self.rnn.named_parameters():
            if "bias" in name:
                nn.init.zeros_(p)
            elif "weight_hh" in name:
                nn.init.orthogonal_(p)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        raise TypeError("a recurrent core steps with its state: call step() or sequence(), not the module")

    def _run(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``[L, B, in_size]`` from ``state`` with no episode starting inside:
        (outputs ``[L, B, size]``, the state left at the end ``[B, state_size]``)."""
        if self.kind == "lstm":
            h, c = state[:, : self.size], state[:, self.size :]
            y, (h, c) = self.rnn(x, (h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous()))
            return y, torch.cat([h[0], c[0]], 1)
        y, h = self.rnn(x, state.unsqueeze(0).contiguous())
        return y, h[0]

    def step(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: features ``[B, in_size]`` and the state fed ``[B, state_size]`` ->
        (output ``[B, size]``, the state it leaves ``[B, state_size]``)."""
        y, left = self._run(x.unsqueeze(0), state)
        return y[0], left

    def sequence(self, x: torch.Tensor, state: torch.Tensor, starts: torch.Tensor, need=()):
        """Steps ``0..L-1`` of ``B`` sequences: features ``[L, B, in_size]``, the state fed
        at step 0 ``[B, state_size]``, ``starts`` ``[L, B]`` (bool: an episode starts there,
        so the state fed is zero). Returns (outputs ``[L, B, size]``, ``{t: the state left
        after step t}`` for each ``t`` in ``need``).

        The steps run in as few calls of the fused RNN as there are steps where some
        sequence starts an episode or a state is needed, plus one: inside a call no state
        is zeroed, and the RNN gives the state only at its end."""
        L = x.shape[0]
        cuts = set(torch.nonzero(starts[1:].any(1)).flatten().add(1).tolist())
        cuts.update(t + 1 for t in need if t + 1 < L)
        bounds = [0, *sorted(cuts), L]
        keep = (~starts).unsqueeze(-1).to(x.dtype)
        outs, left = [], {}
        for a, b in zip(bounds[:-1], bounds[1:]):
            y, state = self._run(x[a:b], state * keep[a])
            outs.append(y)
            left[b - 1] = state
        return torch.cat(outs), {t: left[t] for t in need}


def make_core(kind: str, in_size: int, size: int) -> nn.Module:
    """The core ``policy_core`` names, over features of ``in_size``."""
    if kind == "none":
        return IdentityCore()
    if kind not in CORES:
        raise ValueError(f"policy_core must be one of {', '.join(CORES)}, got {kind!r}")
    return RecurrentCore(kind, in_size, size)
