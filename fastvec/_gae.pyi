"""Types of the compiled ``fastvec._gae`` (source: ``csrc/fastvec/_gae.pyx``).

Arrays are 2-D ``[T, N]`` (``last_value``, ``last_done``: 1-D ``[N]``) of float32 or
float64, one dtype per call; flags are uint8. ``adv`` and ``ret`` (for V-trace, the
value targets) are filled in place.
"""

import numpy as np

def gae_kernel(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    gamma: float,
    lam: float,
    adv: np.ndarray,
    ret: np.ndarray,
) -> None: ...
def gae_dones_kernel(
    rewards: np.ndarray,
    values: np.ndarray,
    dones: np.ndarray,
    last_value: np.ndarray,
    last_done: np.ndarray,
    gamma: float,
    lam: float,
    adv: np.ndarray,
    ret: np.ndarray,
) -> None: ...
def vtrace_kernel(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    log_rhos: np.ndarray,
    gamma: float,
    lam: float,
    rho_bar: float,
    c_bar: float,
    pg_rho_bar: float,
    gae_advantages: bool,
    adv: np.ndarray,
    ret: np.ndarray,
) -> None: ...
