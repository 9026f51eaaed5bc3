# cython: language_level=3
"""SB3's per-env info dicts straight from the shared info table (the common step)."""
cimport numpy as cnp

from fastvec._core.infotable cimport check_table, table_full
from fastvec._core.protocol cimport INFO_COLS

import numpy as np

cnp.import_array()

# Why compiled: the parent runs this once per step with caches cold from the envs that
# just ran on its core, between the workers' reply and its own return; fewer Python
# objects and frames, less time (on Pong 8 envs the parent's work around the wait went
# from ~55 to ~36 us per step with it).
# ``cols``: ``[(key, mask_key, is_int, dtype, kind), ...]`` for columns 0, 1, ...;
# ``kind`` is the Python type the env gave, ``dtype`` what gymnasium's merge makes of it
# (None: the table's own int64/float64).


def table_env_infos(const long long[:, :, ::1] info_i, const double[:, :, ::1] info_f,
                    const cnp.uint16_t[:, ::1] mask, Py_ssize_t slot, list cols):
    """One info dict per env, ``{key: kind(value), ...}`` in column order: the values and
    types the envs returned, as ``columns_to_records`` (fastvec._core.infos) rebuilds them; None
    when some env lacks some column."""
    cdef Py_ssize_t i, n = mask.shape[1], k = len(cols), c
    cdef list keys = [], kinds = [], out = []
    cdef cnp.uint8_t[INFO_COLS] ints, how  # how: 0 the stored int/float itself, 1 bool, 2 kind(value)
    cdef dict d
    check_table(info_i, info_f, mask, slot, k)
    if not table_full(mask, slot, k):
        return None
    for c in range(k):
        key, _mask_key, is_int, _dtype, kind = cols[c]
        keys.append(key)
        kinds.append(kind)
        ints[c] = 1 if is_int else 0
        how[c] = 0 if (kind is int if is_int else kind is float) else (1 if kind is bool else 2)
    for i in range(n):
        d = {}
        for c in range(k):
            if ints[c]:  # two branches: one C expression would make both a double
                value = info_i[slot, i, c]
            else:
                value = info_f[slot, i, c]
            if how[c] == 1:
                value = value != 0
            elif how[c] == 2:
                value = kinds[c](value)
            d[keys[c]] = value
        out.append(d)
    return out
