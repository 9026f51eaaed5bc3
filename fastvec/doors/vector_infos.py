"""gymnasium's vector infos (a value array and a ``_key`` mask per key) from the
engine's results, for the gymnasium door and its batches: columns turned into arrays,
the compiled table builder's column spec, and gymnasium's own merge env by env.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv

__all__ = ["vector_dtype", "columns_to_vector_infos", "VectorInfos"]


def vector_dtype(kind, is_int: bool):
    """The dtype gymnasium's vector infos give a column of ``kind`` values, or None when
    it is the info table's own int64/float64."""
    dtype = np.dtype(kind)
    return None if dtype == np.dtype(np.int64 if is_int else np.float64) else dtype


def columns_to_vector_infos(columns: dict, num_envs: int) -> dict:
    """What gymnasium's ``VectorEnv._add_info`` builds from these infos, env by env: per
    key an array of ``kind`` with the values, and a ``_key`` boolean mask."""
    infos: dict = {}
    everyone = None
    for key, (kind, idx, values) in columns.items():
        if idx is None:  # every env reported this key: values is an array of num_envs
            if everyone is None:
                everyone = np.ones(num_envs, dtype=np.bool_)
            infos[key] = values.astype(kind, copy=False)
            infos[f"_{key}"] = everyone.copy()
            continue
        array = np.zeros(num_envs, dtype=kind)
        array[idx] = values
        mask = np.zeros(num_envs, dtype=np.bool_)
        mask[idx] = True
        infos[key] = array
        infos[f"_{key}"] = mask
    return infos


class VectorInfos:
    """The infos of ``num_envs`` envs (a vector env's, or a batch's) as gymnasium builds
    them, read from ``engine``'s results."""

    _add_info: Callable[..., dict] = VectorEnv._add_info  # gymnasium's merge: it reads only num_envs

    def __init__(self, engine, num_envs: int):
        self.engine, self.num_envs = engine, num_envs
        # The compiled builder's column spec (_cols), made once per info-table schema (_cols_for).
        self._cols_for: list | None = None
        self._cols: list[tuple[Any, str, bool, np.dtype | None, type]] = []

    def add(self, infos: dict, env_info: dict, i: int) -> dict:
        """``env_info`` added to ``infos`` as env ``i``'s."""
        return self._add_info(infos, env_info, i)

    def table_cols(self, schema) -> list[tuple[Any, str, bool, np.dtype | None, type]]:
        """The compiled builder's column spec for an info-table schema."""
        if self._cols_for is not schema:
            self._cols = [(key, f"_{key}", is_int, vector_dtype(kind, is_int), kind) for key, kind, is_int in schema]
            self._cols_for = schema
        return self._cols

    def merge(self, records, slot: int, same_step: bool, first: int = 0, infos=None, offset: int = 0) -> dict[str, Any]:
        """gymnasium's merge, env by env (nested infos, final observations): env ``j``
        of ``records`` is the engine's env ``first + j``, at position ``offset + j``,
        added to ``infos``."""
        eng, add = self.engine, self._add_info
        infos = {} if infos is None else infos
        for i, step_info, reset_info in records:
            if same_step and reset_info is not None:
                infos = add(
                    infos, {"final_obs": eng.final_obs_of(slot, first + i), "final_info": step_info}, offset + i
                )
                infos = add(infos, reset_info, offset + i)
            else:
                infos = add(infos, step_info if step_info is not None else reset_info, offset + i)
        return infos
