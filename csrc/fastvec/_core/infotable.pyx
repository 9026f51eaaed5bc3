# cython: language_level=3
"""The shared info table, for Python code (see infotable.pxd)."""
cimport numpy as cnp
from fastvec._core.protocol cimport INFO_COLS
from fastvec._core.infotable cimport table_full

cnp.import_array()


def mask_full(const cnp.uint16_t[:, ::1] mask, Py_ssize_t slot, int k):
    """True if every env of ``slot`` set all of the first ``k`` info table columns."""
    if not 0 <= slot < mask.shape[0]:
        raise IndexError(f"slot {slot} out of range")
    if k <= 0 or k > INFO_COLS:
        return False
    return table_full(mask, slot, k)
