"""Page-locked host memory, for asynchronous copies between the rollout and a GPU.

- ``alloc(shape, dtype, pin)``: a numpy array, page-locked by torch's pinned allocator
  with ``pin`` (the learner's own arrays, a copying storage's buffers);
- ``HostPin(arrays)``: page-locks memory allocated elsewhere (the engine's shared
  segment) with ``cudaHostRegister``, until ``release()``.

The CUDA calls go through ``cuda`` (``torch.cuda`` unless given): the tests pass a fake
one, so this code runs on machines without a GPU too.
"""

from __future__ import annotations

import mmap
import warnings

import numpy as np
import torch

__all__ = ["HostPin", "alloc"]


def _pinned_empty(shape, dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.from_numpy(np.zeros(0, dtype)).dtype, pin_memory=True)


def alloc(shape, dtype, pin: bool) -> np.ndarray:
    """A host array of ``shape`` and ``dtype``: zeros, or (``pin``) page-locked and
    uninitialised."""
    if pin:
        return _pinned_empty(shape, dtype).numpy()
    return np.zeros(shape, dtype)


def _code(err) -> int:
    """A cudart call's result as an int (an enum with ``.value``, or an int)."""
    return int(getattr(err, "value", err))


class HostPin:
    """Page-locks the memory under ``arrays`` with ``cudaHostRegister``, as one region:
    the engine's arrays are carved out of one segment and share pages, and CUDA refuses
    to register a page twice. ``release()`` unregisters it (before the engine closes).

    ``cuda``: the module the CUDA calls go to (``cudart()``, ``synchronize()``);
    ``torch.cuda`` when None. A failed registration warns and leaves ``pinned`` False:
    copies then still work, synchronously."""

    def __init__(self, arrays, cuda=None):
        self.ptr: int | None = None
        self.nbytes = 0
        self._cuda = torch.cuda if cuda is None else cuda
        arrays = [a for a in arrays if a is not None and a.nbytes]
        if not arrays:
            return
        page = mmap.PAGESIZE
        lo = min(a.ctypes.data for a in arrays)
        hi = max(a.ctypes.data + a.nbytes for a in arrays)
        start, end = lo - lo % page, -(-hi // page) * page
        code = _code(self._cuda.cudart().cudaHostRegister(start, end - start, 0))
        if code != 0:
            warnings.warn(
                f"cudaHostRegister failed (error {code}); rollout copies will not be asynchronous", stacklevel=2
            )
            return
        self.ptr, self.nbytes = start, end - start

    @property
    def pinned(self) -> bool:
        return self.ptr is not None

    def release(self) -> None:
        if self.ptr is not None:
            self._cuda.synchronize()  # no copy from these pages may still be in flight
            code = _code(self._cuda.cudart().cudaHostUnregister(self.ptr))
            self.ptr = None
            if code != 0:
                warnings.warn(f"cudaHostUnregister failed (error {code})", stacklevel=2)
