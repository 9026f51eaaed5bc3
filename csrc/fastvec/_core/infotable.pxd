# The shared info table, as the compiled info builders of the front doors read it:
# per slot and env, INFO_COLS 8-byte cells (int64 or float64 by column) and a uint16
# mask of the cells set this step. Inline, so each door's module gets its own copy.
cimport numpy as cnp
from fastvec._core.protocol cimport INFO_COLS


cdef inline int check_table(const long long[:, :, ::1] info_i, const double[:, :, ::1] info_f,
                            const cnp.uint16_t[:, ::1] mask, Py_ssize_t slot, Py_ssize_t k) except -1:
    if not 0 <= slot < mask.shape[0]:
        raise IndexError(f"slot {slot} out of range")
    if k == 0 or k > INFO_COLS or k > info_i.shape[2] or info_i.shape[2] != info_f.shape[2]:
        raise ValueError(f"{k} columns for an info table of {info_i.shape[2]}")
    if info_i.shape[0] != mask.shape[0] or info_i.shape[1] != mask.shape[1] \
            or info_f.shape[0] != mask.shape[0] or info_f.shape[1] != mask.shape[1]:
        raise ValueError("info table and mask disagree in shape")
    return 0


cdef inline bint table_full(const cnp.uint16_t[:, ::1] mask, Py_ssize_t slot, Py_ssize_t k) noexcept:
    """Every env of ``slot`` set all of the first ``k`` columns."""
    cdef Py_ssize_t i
    cdef cnp.uint16_t full = <cnp.uint16_t>((1 << k) - 1)
    for i in range(mask.shape[1]):
        if mask[slot, i] != full:
            return False
    return True
