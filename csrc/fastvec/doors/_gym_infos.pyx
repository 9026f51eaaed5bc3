# cython: language_level=3
"""gymnasium's vector infos straight from the shared info table (the common step)."""
cimport numpy as cnp

from fastvec._core.infotable cimport check_table, table_full

import numpy as np

cnp.import_array()

# Why compiled: the parent runs this once per step with caches cold from the envs that
# just ran on its core, between the workers' reply and its own return; fewer Python
# objects and frames, less time (on Pong 8 envs the parent's work around the wait went
# from ~55 to ~36 us per step with it).
# ``cols``: ``[(key, mask_key, is_int, dtype, kind), ...]`` for columns 0, 1, ...;
# ``kind`` is the Python type the env gave, ``dtype`` what gymnasium's merge makes of it
# (None: the table's own int64/float64).


def table_vector_infos(const long long[:, :, ::1] info_i, const double[:, :, ::1] info_f,
                       const cnp.uint16_t[:, ::1] mask, Py_ssize_t slot, list cols):
    """gymnasium's vector infos ``{key: values, "_key": all-True mask, ...}`` in column
    order, as ``columns_to_vector_infos`` (fastvec.doors.gymnasium) builds them from the same table;
    None when some env lacks some column (the caller takes the general path)."""
    cdef Py_ssize_t i, n = mask.shape[1], k = len(cols), c
    cdef cnp.ndarray row, ones = None
    cdef long long[::1] ri
    cdef double[::1] rf
    check_table(info_i, info_f, mask, slot, k)
    if not table_full(mask, slot, k):
        return None
    infos = {}
    for c in range(k):
        key, mask_key, is_int, dtype, _kind = cols[c]
        if is_int:
            row = np.empty(n, dtype=np.int64)
            ri = row
            for i in range(n):
                ri[i] = info_i[slot, i, c]
        else:
            row = np.empty(n, dtype=np.float64)
            rf = row
            for i in range(n):
                rf[i] = info_f[slot, i, c]
        infos[key] = row if dtype is None else row.astype(dtype)
        if ones is None:
            ones = np.ones(n, dtype=np.bool_)
            infos[mask_key] = ones
        else:
            infos[mask_key] = ones.copy()
    return infos
