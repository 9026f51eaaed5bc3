"""Types of the compiled ``fastvec.doors._gym_infos`` (source: ``csrc/fastvec/doors/_gym_infos.pyx``)."""

from typing import Any

import numpy as np

def table_vector_infos(
    info_i: np.ndarray,
    info_f: np.ndarray,
    mask: np.ndarray,
    slot: int,
    cols: list[tuple[Any, str, bool, np.dtype | None, type]],
) -> dict[Any, np.ndarray] | None: ...
