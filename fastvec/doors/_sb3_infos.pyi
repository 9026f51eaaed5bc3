"""Types of the compiled ``fastvec.doors._sb3_infos`` (source: ``csrc/fastvec/doors/_sb3_infos.pyx``)."""

from typing import Any

import numpy as np

def table_env_infos(
    info_i: np.ndarray,
    info_f: np.ndarray,
    mask: np.ndarray,
    slot: int,
    cols: list[tuple[Any, str, bool, np.dtype | None, type]],
) -> list[dict[Any, Any]] | None: ...
