"""Cores: the piece between a policy's encoder and its heads, where memory goes.

A core maps the encoder's features to the features its heads read. Today's policies
have no memory: ``IdentityCore`` passes the features through (no parameters, no state),
so a policy with it computes exactly encoder then heads. A recurrent core (an LSTM or
GRU) is a class beside it with the same place in the policy: it keeps ``state_size``
numbers per env, one flat tensor that the rollout stores beside the observations and
that is zeroed where an episode ends; the policy's acting and batched passes hand it the
state with the features.
"""

from __future__ import annotations

import torch
import torch.nn as nn

__all__ = ["IdentityCore"]


class IdentityCore(nn.Module):
    """No memory: the features as they are."""

    state_size = 0
    """Numbers of recurrent state per env (none)."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features
