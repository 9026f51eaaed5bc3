"""The inputs and outputs of the compiled return kernels (``fastvec._gae``: GAE and
V-trace), shared by ``fastvec.gae`` and ``fastvec.vtrace``: each input checked and
converted once (float32 or float64 rows the kernel can read in place, flags as
uint8), each output allocated or checked (dtype, shape, no overlap with an input),
and written back where the kernel needed a copy.
"""

from __future__ import annotations

from numbers import Real

import numpy as np

__all__ = [
    "as_array",
    "check_shape",
    "kernel_ready",
    "values_dtype",
    "float_input",
    "flag_input",
    "real",
    "coef",
    "clip",
    "overlaps",
    "outputs",
    "finish",
]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_U8 = np.dtype(np.uint8)
_NUMERIC_KINDS = "biuf"


# --------------------------------------------------------------------------- #
# validation helpers
# --------------------------------------------------------------------------- #
def as_array(x, name):
    """``np.asarray(x)`` with a ValueError naming ``name`` on garbage."""
    if type(x) is np.ndarray:
        a = x
    else:
        if x is None:
            raise ValueError(f"{name} must be a numeric array, got None")
        try:
            a = np.asarray(x)
        except Exception as exc:  # ragged lists, tensors that refuse, ...
            raise ValueError(f"{name} could not be converted to a numeric array: {exc}") from None
    if a.dtype.kind not in _NUMERIC_KINDS:
        raise ValueError(f"{name} must have a real numeric dtype (bool, integer or float), got dtype {a.dtype}")
    return a


def check_shape(a, name, shape):
    if a.shape != shape:
        if a.ndim != len(shape):
            raise ValueError(
                f"{name} must be {len(shape)}-D with shape {shape}, got {a.ndim}-D array of shape {a.shape}"
            )
        raise ValueError(f"{name} has shape {a.shape}, expected {shape}")


def kernel_ready(a):
    """Whether the kernel can read ``a`` in place: unit stride along the last
    axis (or at most one element there), aligned, row stride a whole number of
    items. Other layouts are copied."""
    isz = a.itemsize
    if a.ndim == 2:
        return (a.shape[1] <= 1 or a.strides[1] == isz) and a.strides[0] % isz == 0 and a.flags.aligned
    return (a.shape[0] <= 1 or a.strides[0] == isz) and a.flags.aligned


def values_dtype(values):
    a = as_array(values, "values")
    dt = a.dtype
    if dt.kind != "f" or dt.itemsize not in (4, 8):
        raise ValueError(f"values must be float32 or float64 (it sets the output dtype), got dtype {dt}")
    dt = _F32 if dt.itemsize == 4 else _F64
    if a.dtype != dt:  # non-native byte order
        a = a.astype(dt, order="C")
    if a.ndim != 2:
        raise ValueError(f"values must be 2-D with shape [T, N], got {a.ndim}-D array of shape {a.shape}")
    if not kernel_ready(a):
        a = np.ascontiguousarray(a)
    return a, dt


def float_input(x, name, dt, shape):
    """Numeric array of ``shape`` converted to float dtype ``dt`` (no copy when
    it already is ``dt`` with a kernel-friendly layout)."""
    a = as_array(x, name)
    check_shape(a, name, shape)
    if a.dtype != dt:
        a = a.astype(dt, order="C")
    elif not kernel_ready(a):
        a = np.ascontiguousarray(a)
    return a


def flag_input(x, name, shape):
    """Flags as a uint8 array, nonzero = set. bool / int8 / uint8 are viewed,
    not copied; any other numeric dtype becomes ``x != 0`` (so NaN counts as
    set)."""
    a = as_array(x, name)
    check_shape(a, name, shape)
    if a.dtype.itemsize == 1 and a.dtype.kind in "biu":
        if a.dtype != _U8:
            a = a.view(_U8)
    else:
        a = np.not_equal(a, 0).view(_U8)
    if not kernel_ready(a):
        a = np.ascontiguousarray(a)
    return a


def real(x, name, expected):
    """``float(x)`` for a real scalar (Python or numpy number, 0-d array; not a
    bool); otherwise a ValueError saying ``name`` must be ``expected``."""
    if type(x) is float:
        return x
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (Real, np.ndarray, np.generic)):
        raise ValueError(f"{name} must be {expected}, got {x!r}")
    if isinstance(x, (np.ndarray, np.generic)):
        if np.ndim(x) != 0 or np.asarray(x).dtype.kind not in "iuf":
            raise ValueError(f"{name} must be {expected}, got {x!r}")
    return float(x)


def coef(x, name):
    """gamma / lam: a finite real number in [0, 1]."""
    x = real(x, name, "a real number in [0, 1]")
    if not (0.0 <= x <= 1.0):  # also False for NaN
        raise ValueError(f"{name} must be a finite number in [0, 1], got {x!r}")
    return x


def clip(x, name):
    """rho_bar / c_bar / pg_rho_bar: a positive number, ``inf`` allowed."""
    x = real(x, name, "a positive number (inf allowed)")
    if not x > 0.0:  # also True for NaN
        raise ValueError(f"{name} must be a positive number (inf allowed), got {x!r}")
    return x


def overlaps(a, b):
    return np.may_share_memory(a, b) and np.shares_memory(a, b)


def outputs(out, dt, shape, inputs, second=("returns", "ret_out")):
    """Validate ``out`` (or allocate). Returns (adv, ret, adv_k, ret_k) where
    the ``_k`` arrays are what the kernel writes into (a temporary when an out
    buffer has a layout the kernel cannot write in place). ``second`` names
    the second output in messages: (what it holds, its argument name)."""
    if out is None:
        adv = np.empty(shape, dt)
        ret = np.empty(shape, dt)
        return adv, ret, adv, ret
    names = ("out[0] (advantages)", f"out[1] ({second[0]})")
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise ValueError(f"out must be a tuple (adv_out, {second[1]}) of two arrays")
    adv, ret = out
    for name, o in zip(names, out):
        if not isinstance(o, np.ndarray):
            raise ValueError(f"{name} must be a numpy.ndarray, got {type(o).__name__}")
        if o.dtype != dt:
            raise ValueError(f"{name} must have dtype {dt} (the dtype of values), got {o.dtype}")
        if o.shape != shape:
            raise ValueError(f"{name} must have shape {shape}, got {o.shape}")
        if not o.flags.writeable:
            raise ValueError(f"{name} is read-only")
        for iname, i in inputs:
            if overlaps(o, i):
                raise ValueError(f"{name} overlaps the input {iname}; use separate buffers")
    if overlaps(adv, ret):
        raise ValueError("out[0] and out[1] overlap; use separate buffers")
    ks = []
    for name, o in zip(names, out):
        if not kernel_ready(o):
            ks.append(np.empty(shape, dt))  # written through a temporary
            continue
        if shape[0] > 1 and shape[1] > 0 and abs(o.strides[0]) < shape[1] * o.itemsize:
            raise ValueError(f"{name} has overlapping rows (row stride {o.strides[0]} bytes)")
        ks.append(o)
    return adv, ret, ks[0], ks[1]


def finish(adv, ret, adv_k, ret_k):
    if adv_k is not adv:
        np.copyto(adv, adv_k)
    if ret_k is not ret:
        np.copyto(ret, ret_k)
    return adv, ret
