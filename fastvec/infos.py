"""Step infos on their way from workers to the front doors.

Most envs return the same flat dict of numbers every step (MuJoCo's ``x_position``,
ALE's ``lives``). Pickling those dicts one numpy scalar at a time costs more than the
step of a cheap env, so a worker sends them as *columns*: per key, the value type, the
local env indices and one array of values. Columns rebuild exactly the per-env dicts
(same keys, values and types) and give gymnasium's merged infos without a per-env loop.
Anything else (nested dicts, arrays, strings, mixed types, episode ends that carry a
reset info) travels as plain records ``(local_index, step_info, reset_info)``.
"""
from __future__ import annotations

import numpy as np

_SCALARS = (int, float, bool)


def _scalar_kind(value):
    kind = type(value)
    if kind in _SCALARS or issubclass(kind, np.number):
        return kind
    return None


def encode_columns(records: list) -> dict | None:
    """``{key: (kind, indices, values)}`` for records that are all ``(j, flat info, None)``
    with one scalar type per key, else None."""
    columns: dict = {}
    for j, info, reset_info in records:
        if reset_info is not None or info is None:
            return None
        for key, value in info.items():
            kind = _scalar_kind(value)
            if kind is None:
                return None
            col = columns.get(key)
            if col is None:
                columns[key] = (kind, [j], [value])
            elif col[0] is not kind:
                return None
            else:
                col[1].append(j)
                col[2].append(value)
    out = {}
    try:
        for key, (kind, idx, values) in columns.items():
            # np.array(int) would silently make Python ints beyond int64 objects: refuse.
            arr = np.array(values, dtype=kind)
            if arr.dtype == object:
                return None
            out[key] = (kind, np.array(idx, dtype=np.intp), arr)
    except (OverflowError, TypeError, ValueError):
        return None
    return out


def merge_columns(parts: list[tuple[int, dict]]) -> dict:
    """Join workers' columns ``[(env_offset, columns), ...]`` into global ones, keeping
    keys in order of first appearance."""
    merged: dict = {}
    for offset, cols in parts:
        for key, (kind, idx, values) in cols.items():
            col = merged.get(key)
            if col is None:
                merged[key] = (kind, [idx + offset], [values])
            elif col[0] is not kind:
                return None  # one key, two types across workers: use records
            else:
                col[1].append(idx + offset)
                col[2].append(values)
    return {
        key: (kind, np.concatenate(idx), np.concatenate(values))
        for key, (kind, idx, values) in merged.items()
    }


def columns_to_records(columns: dict) -> list:
    """Per-env ``(env_index, info, None)`` records, in env order, exact values and types."""
    per_env: dict[int, dict] = {}
    for key, (kind, idx, values) in columns.items():
        python_kind = kind in _SCALARS
        for i, value in zip(idx.tolist(), values.tolist() if python_kind else values):
            per_env.setdefault(i, {})[key] = kind(value) if python_kind else value
    return [(i, per_env[i], None) for i in sorted(per_env)]


def columns_to_vector_infos(columns: dict, num_envs: int) -> dict:
    """What gymnasium's ``VectorEnv._add_info`` builds from these infos, env by env: per
    key an array of ``kind`` with the values, and a ``_key`` boolean mask."""
    infos: dict = {}
    for key, (kind, idx, values) in columns.items():
        array = np.zeros(num_envs, dtype=kind)
        array[idx] = values
        mask = np.zeros(num_envs, dtype=np.bool_)
        mask[idx] = True
        infos[key] = array
        infos[f"_{key}"] = mask
    return infos
