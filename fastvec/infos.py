"""Step infos on their way from workers to the front doors.

Most envs return the same flat dict of numbers every step (MuJoCo's ``x_position``,
ALE's ``lives``). Pickling those dicts one numpy scalar at a time costs more than the
step of a cheap env, so a worker sends them as *columns*: per key, the value type, the
local env indices and the values as plain Python numbers (exact for every numpy float
and integer type, and far cheaper to pickle than numpy scalars or small arrays). Columns rebuild exactly the per-env dicts
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


def _plain(kind):
    """How a value of ``kind`` becomes a plain Python number without loss."""
    if kind in _SCALARS:
        return None
    if issubclass(kind, np.floating) and np.finfo(kind).bits <= 64:
        return float
    if issubclass(kind, np.integer):
        return int
    return False  # complex, longdouble, ...: not sent as columns


def encode_columns(records: list) -> dict | None:
    """``{key: (kind, indices, values)}`` for records that are all ``(j, flat info, None)``
    with one scalar type per key, else None."""
    columns: dict = {}
    for j, info, reset_info in records:
        if reset_info is not None or info is None:
            return None
        for key, value in info.items():
            kind = type(value)
            col = columns.get(key)
            if col is None:
                if not (kind in _SCALARS or issubclass(kind, np.number)):
                    return None
                plain = _plain(kind)
                if plain is False:
                    return None
                columns[key] = col = (kind, plain, [], [])
            elif col[0] is not kind:
                return None
            col[2].append(j)
            col[3].append(value if col[1] is None else col[1](value))
    for kind, _plain_fn, _idx, values in columns.values():
        if kind is int and any(not -(2**63) <= v < 2**63 for v in values):
            return None  # gymnasium would fail on these too, with its own message
    return {key: (kind, idx, values) for key, (kind, _p, idx, values) in columns.items()}


def merge_columns(parts: list[tuple[int, dict]]) -> dict | None:
    """Join workers' columns (indices as lists) ``[(env_offset, columns), ...]`` into global ones, keeping
    keys in order of first appearance; None if a key has two types across workers."""
    merged: dict = {}
    for offset, cols in parts:
        for key, (kind, idx, values) in cols.items():
            if idx is None:  # every env of that part, values an array
                idx = range(len(values))
                values = values.tolist()
            col = merged.get(key)
            if col is None:
                merged[key] = col = (kind, [], [])
            elif col[0] is not kind:
                return None
            col[1].extend(idx if offset == 0 else [i + offset for i in idx])
            col[2].extend(values)
    return merged


def columns_to_records(columns: dict) -> list:
    """Per-env ``(env_index, info, None)`` records, in env order, exact values and types."""
    per_env: dict[int, dict] = {}
    for key, (kind, idx, values) in columns.items():
        if idx is None:  # every env, in order (values: an array)
            idx = range(len(values))
            values = values.tolist()
        for i, value in zip(idx, values):
            per_env.setdefault(i, {})[key] = kind(value)
    return [(i, per_env[i], None) for i in sorted(per_env)]


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


def with_quiet_ends(records: list, ended: np.ndarray) -> list:
    """same_step: ``records`` plus ``(i, {}, {})`` for every env that ended its episode
    without a record (its step and reset infos were both empty, so its worker sent
    nothing), in env order."""
    missing = np.flatnonzero(ended).tolist()
    if not missing:
        return records
    have = {rec[0] for rec in records}
    extra = [(i, {}, {}) for i in missing if i not in have]
    if not extra:
        return records
    return sorted(list(records) + extra, key=lambda rec: rec[0])


def join_parts(parts: list[tuple[int, dict]], records: list) -> tuple:
    """A step's reports from several workers (or actors) -> ``(columns, None)`` when every
    part is columns of one type per key, else ``(None, records)`` in env order.
    ``parts``: ``[(env_offset, columns), ...]``; ``records`` (global indices) or [] when
    every part sent columns."""
    if not records:
        columns = merge_columns(parts)
        if columns is not None:
            return columns, None
    records = list(records)
    for start, cols in parts:
        records += [(start + i, info, r) for i, info, r in columns_to_records(cols)]
    records.sort(key=lambda rec: rec[0])
    return None, records
