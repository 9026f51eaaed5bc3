"""Step infos on their way from workers to the front doors, and ``StepResult``.

Most envs return the same flat dict of numbers every step (MuJoCo's ``x_position``,
ALE's ``lives``). Pickling those dicts one numpy scalar at a time costs more than the
step of a cheap env, so a worker sends them as *columns*: per key, the value type, the
local env indices and the values as plain Python numbers (exact for every numpy float
and integer type, and far cheaper to pickle than numpy scalars or small arrays). Columns rebuild exactly the per-env dicts
(same keys, values and types) and give gymnasium's merged infos without a per-env loop.
Anything else (nested dicts, arrays, strings, mixed types, episode ends that carry a
reset info) travels as plain records ``(local_index, step_info, reset_info)``.

The commonest case of all skips pickling: a worker writes flat numeric infos into the
segment's shared info table (``table_kind`` says which types fit a cell exactly) and
tells the parent its columns once. Turning any of these forms into gymnasium's or SB3's
format is the front doors' job (``fastvec.doors``).
"""

from __future__ import annotations

import pickle

import cloudpickle
import numpy as np

_SCALARS = (int, float, bool)


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


def _global(where, idx) -> list:
    """A part's env indices made global. ``where``: None or 0 (already global), an int
    offset (a contiguous run from there) or an index array (local env j is ``where[j]``:
    a worker's envs, ``fastvec._core.placement``)."""
    if where is None or (type(where) is int and where == 0):
        return idx if type(idx) is list else list(idx)
    if type(where) is int:
        return [i + where for i in idx]
    return where[list(idx)].tolist()


def merge_columns(parts: list[tuple]) -> dict | None:
    """Join workers' columns (indices as lists) ``[(where, columns), ...]`` (``where`` as
    in ``_global``) into global ones, each in env order, keeping keys in order of first
    appearance; None if a key has two types across workers."""
    merged: dict = {}
    for where, cols in parts:
        for key, (kind, idx, values) in cols.items():
            if idx is None:  # every env of that part, values an array
                idx = range(len(values))
                values = values.tolist()
            col = merged.get(key)
            if col is None:
                merged[key] = col = (kind, [], [])
            elif col[0] is not kind:
                return None
            col[1].extend(_global(where, idx))
            col[2].extend(values)
    for key, (kind, idx, values) in merged.items():
        if any(a > b for a, b in zip(idx, idx[1:])):  # envs of workers that interleave
            order = sorted(range(len(idx)), key=idx.__getitem__)
            merged[key] = (kind, [idx[k] for k in order], [values[k] for k in order])
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


def join_parts(parts: list[tuple], records: list) -> tuple:
    """A step's reports from several workers (or actors) -> ``(columns, None)`` when every
    part is columns of one type per key, else ``(None, records)`` in env order.
    ``parts``: ``[(where, columns), ...]`` (``where`` as in ``_global``); ``records``
    (global indices) or [] when every part sent columns."""
    if not records:
        columns = merge_columns(parts)
        if columns is not None:
            return columns, None
    records = list(records)
    for where, cols in parts:
        recs = columns_to_records(cols)
        envs = _global(where, [i for i, _info, _r in recs])
        records += [(i, info, r) for i, (_j, info, r) in zip(envs, recs)]
    records.sort(key=lambda rec: rec[0])
    return None, records


# ------------------------------------------------------------------ the worker's side
_TABLE_FLOATS = (float, np.float16, np.float32, np.float64)
_TABLE_INTS = (int, bool, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32)


def table_kind(kind):
    """True for types stored exactly in an int64 cell of the info table, False for a
    float64 cell, None for types the table cannot hold."""
    if kind in _TABLE_FLOATS:
        return False
    if kind in _TABLE_INTS:
        return True
    return None


class InfoPicklingError(TypeError):
    """A step's infos could not be sent to the parent."""


def dump_records(records: list) -> bytes:
    """A step's report, pickled: ``("cols", columns)`` for flat numeric infos, else
    ``("recs", records)``."""
    columns = encode_columns(records)
    if columns is not None:
        return pickle.dumps(("cols", columns), protocol=pickle.HIGHEST_PROTOCOL)
    try:
        return pickle.dumps(("recs", records), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        pass
    try:  # infos holding lambdas or local classes, as SyncVectorEnv would deliver them
        return cloudpickle.dumps(("recs", records), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise InfoPicklingError(f"the infos of this step could not be pickled: {exc}") from exc


# ------------------------------------------------------------------ the engine's answer
class StepResult:
    """What finishing a step returns, from every engine: the one shape of a step.

    ``slot`` is the ring slot that holds the step's observations, final observations,
    rewards and flags (``engine.obs_bufs[k][slot]``, ``engine.rewards[slot]``, ...). The
    step's infos come in the first of three forms that applies:

    - ``table``: ``(info_i, info_f, info_mask, schema)``: every worker wrote its infos
      into the shared info table under one ``schema`` (``[(key, type, is_int), ...]``,
      column order). A door turns the slot's rows into its format in one compiled pass
      and falls back to ``general()`` where some env lacks some key;
    - ``columns``: ``{key: (type, indices, values)}``, flat numeric infos that travelled
      pickled (``indices`` None: every env, ``values`` an array);
    - ``records``: ``[(env, step_info, reset_info), ...]`` in env order: the rest.

    None of them set: the step had no infos. In same_step mode an episode end whose
    step and reset infos were both empty has no record (its worker sent nothing, so the
    step stayed payload-less): the flags say it; ``env_records()`` adds it back.
    """

    __slots__ = ("slot", "table", "columns", "records", "_engine")

    def __init__(self, engine, slot: int, table=None, columns=None, records=None):
        self._engine = engine
        self.slot = slot
        self.table = table
        self.columns = columns
        self.records = records

    def general(self) -> tuple:
        """``(columns, records)``, exactly one not None: the table form read out as
        columns, no infos as no records."""
        if self.table is not None:
            return self._engine.table_general(self.slot)
        if self.columns is not None:
            return self.columns, None
        return None, (self.records if self.records is not None else [])

    def as_records(self) -> list:
        """The infos as ``(env, step_info, reset_info)`` records in env order."""
        columns, records = self.general()
        return records if columns is None else columns_to_records(columns)

    def env_records(self) -> list:
        """``as_records()`` where in same_step mode every ended episode has a record
        (``reset_info`` a dict), quiet ones included."""
        records = self.as_records()
        eng = self._engine
        if eng.autoreset_mode == "same_step":
            records = with_quiet_ends(records, eng.terminated[self.slot] | eng.truncated[self.slot])
        return records

    def __repr__(self) -> str:
        form = (
            "table"
            if self.table is not None
            else "columns"
            if self.columns is not None
            else f"{len(self.records)} records"
            if self.records
            else "no infos"
        )
        return f"StepResult(slot={self.slot}, {form})"


# ------------------------------------------------------------------ the parent's side
class InfoTable:
    """The parent's view of the shared info table: the arrays, and the columns each
    worker has told it about (a worker's columns only grow: it sends the whole list,
    old columns first, whenever a new key appears)."""

    def __init__(self, info_f: np.ndarray, info_mask: np.ndarray, worker_envs: list, max_cols: int):
        self.info_f = info_f  # [slot, env, col] float64 cells
        self.info_i = info_f.view(np.int64)  # the same cells, read as int64
        self.mask = info_mask  # [slot, env] uint16: which cells an env set this step
        self.worker_envs = worker_envs  # per worker, the (sorted) indices of its envs
        self.max_cols = max_cols
        self.schemas: list[list] = [[] for _ in worker_envs]  # per worker: [(key, type, is_int)]
        self.uniform: list | None = None  # the schema every worker has, when they agree
        self._set(0, [])

    def learn(self, w: int, report) -> bool:
        """Worker w's columns grew: ``("schema", [(key, type), ...])``. False if the
        report is malformed."""
        old = self.schemas[w]
        if not (
            isinstance(report, tuple)
            and len(report) == 2
            and report[0] == "schema"
            and isinstance(report[1], list)
            and len(old) <= len(report[1]) <= self.max_cols
        ):
            return False
        schema = []
        for k, entry in enumerate(report[1]):
            if not (isinstance(entry, tuple) and len(entry) == 2):
                return False
            is_int = table_kind(entry[1])
            if is_int is None or (k < len(old) and old[k][:2] != entry):
                return False
            schema.append((entry[0], entry[1], is_int))
        self._set(w, schema)
        return True

    def forget(self, w: int) -> None:
        """Worker w was replaced: its new process starts with no columns."""
        self._set(w, [])

    def _set(self, w: int, schema: list) -> None:
        self.schemas[w] = schema
        first = self.schemas[0]
        self.uniform = first if all(s == first for s in self.schemas) else None
        # ``StepResult.table`` for a step every worker reported through the table, or
        # None when their schemas differ (made once per schema: it is read every step).
        self.form = None if self.uniform is None else (self.info_i, self.info_f, self.mask, self.uniform)

    def worker_columns(self, w: int, slot: int) -> dict:
        """Worker w's infos of ``slot``, as columns with global env indices."""
        envs = self.worker_envs[w]
        masks = self.mask[slot, envs]
        cols = {}
        for c, (key, kind, is_int) in enumerate(self.schemas[w]):
            present = (masks & (1 << c)) != 0
            table = self.info_i if is_int else self.info_f
            if present.all():
                cols[key] = (kind, envs.tolist(), table[slot, envs, c].tolist())
            elif present.any():
                sel = envs[present]
                cols[key] = (kind, sel.tolist(), table[slot, sel, c].tolist())
        return cols

    def general(self, slot: int, mask_full) -> tuple:
        """Every worker's infos of ``slot`` (all of them reported through the table) as
        ``(columns, records)``, one of them None (see ``join_parts``). Where every env
        set every column of the one schema, in one go: ``{key: (type, None, values)}``
        with an array of exact int64/float64 bits."""
        schema = self.uniform
        if schema is not None and mask_full(self.mask, slot, len(schema)):
            block_i = self.info_i[slot, :, : len(schema)].T.copy()
            block_f = block_i.view(np.float64)
            return {
                key: (kind, None, block_i[c] if is_int else block_f[c]) for c, (key, kind, is_int) in enumerate(schema)
            }, None
        return join_parts([(None, self.worker_columns(w, slot)) for w in range(len(self.worker_envs))], [])
