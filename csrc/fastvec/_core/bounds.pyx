# cython: language_level=3
"""Action bounds: one typed pass over a batch, no temporaries.

The Python side (``fastvec._core.actions``) checks dtype and shape first and, when this
says no, finds the offending env and words the error.
"""
cimport numpy as cnp

cnp.import_array()

ctypedef fused action_t:
    float
    double
    cnp.int64_t
    cnp.int32_t
    cnp.int16_t
    cnp.int8_t
    cnp.uint8_t


def in_bounds(const action_t[:, ::1] actions, const double[::1] low, const double[::1] high):
    """True if every ``actions[e, k]`` lies in ``[low[k], high[k]]`` (NaN does not)."""
    cdef Py_ssize_t e, k, n = actions.shape[0], m = actions.shape[1]
    cdef double v
    cdef bint ok = True
    if low.shape[0] != m or high.shape[0] != m:
        raise ValueError(f"bounds of length {low.shape[0]}/{high.shape[0]} for {m} action columns")
    with nogil:
        for e in range(n):
            for k in range(m):
                v = <double>actions[e, k]
                if not (v >= low[k] and v <= high[k]):
                    ok = False
                    break
            if not ok:
                break
    return ok
