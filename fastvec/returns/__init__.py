"""Returns and advantages of ``[T, N]`` rollouts, computed by compiled kernels.

- ``gae_estimates``: ``gae`` and ``gae_from_dones`` (Generalized Advantage Estimation);
- ``vtrace_targets``: ``vtrace`` (importance-clipped advantages and value targets);
- ``kernel_arrays``: the kernels' inputs and outputs, checked (shared by both).

``fastvec.gae``, ``fastvec.gae_from_dones`` and ``fastvec.vtrace`` are these functions.
"""

from .gae_estimates import gae, gae_from_dones
from .vtrace_targets import vtrace

__all__ = ["gae", "gae_from_dones", "vtrace"]
