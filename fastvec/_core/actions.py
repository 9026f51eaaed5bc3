"""Validation of batched actions before anything is dispatched to a worker.

A bad action raises ``ValueError`` in the caller's process, with nothing sent, so the
vector env stays usable. Actions are written into shared memory in the space's dtype.
Two rules (``EngineOptions.action_check``): "bounds" checks the values against the
space; "dtype" lets through whatever the space's dtype holds exactly, as gymnasium
passes actions to its envs unchecked. A pickled leaf's batch must be a sequence of one
value per env; the values themselves go to the envs as they are.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from ..errors import ActionTypeError
from .bounds import in_bounds
from .segment import Leaf, get_path, leaves_of

# dtypes the compiled bounds check reads; anything else takes the numpy path.
_FAST_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.int64, np.int32, np.int16, np.int8, np.uint8))
# Bounds compared as doubles are exact below this magnitude.
_EXACT = 2.0**52


def _where(leaf: Leaf) -> str:
    return "actions" + "".join(f"[{k!r}]" for k in leaf.path)


def _as_array(value, where: str) -> np.ndarray:
    if isinstance(value, (str, bytes)):
        raise ActionTypeError(f"{where} must be numeric, got a {type(value).__name__}")
    try:
        arr = np.asarray(value)
    except Exception as exc:  # e.g. a CUDA tensor, ragged lists
        raise ValueError(f"{where} could not be converted to a numpy array: {exc}") from None
    if arr.dtype.kind not in "biuf":
        raise ActionTypeError(f"{where} must be numeric, got dtype {arr.dtype}")
    return arr


def _wrong_shape(where: str, shape: tuple, expected: tuple) -> ValueError:
    if shape == () and expected != ():  # gymnasium raises TypeError here: both, then
        return ActionTypeError(
            f"{where} is a single value, but a vector env takes a batch of shape {expected} (num_envs, *action_shape)"
        )
    return ValueError(f"{where} has shape {shape}, expected {expected} (num_envs, *action_shape)")


class _PickledCheck:
    """A pickled leaf's batch: one value per env, in a tuple, list or 1-d array."""

    pickled = True
    fast = None

    def __init__(self, leaf: Leaf, num_envs: int):
        self.leaf = leaf
        self.where = _where(leaf)
        self.num_envs = num_envs

    def check(self, value):
        if isinstance(value, np.ndarray):
            if value.ndim == 0:
                raise _wrong_shape(self.where, (), (self.num_envs,))
            value = list(value)
        if not isinstance(value, (tuple, list)):
            raise ActionTypeError(
                f"{self.where} must be a tuple or list of {self.num_envs} values "
                f"(one per env) for {self.leaf.space}, got {type(value).__name__}"
            )
        if len(value) != self.num_envs:
            raise ValueError(f"{self.where} has {len(value)} values, expected one per env ({self.num_envs})")
        return value


class _ArrayCheck:
    """What both checks of a fixed-size leaf know: where it is, its batch's shape, its dtype."""

    pickled = False

    def __init__(self, leaf: Leaf, num_envs: int):
        self.leaf = leaf
        self.where = _where(leaf)
        self.shape = (num_envs,) + leaf.shape
        self.dtype = leaf.dtype


class _DtypeCheck(_ArrayCheck):
    """Checks one leaf's batch under the "dtype" rule: numbers, the shape, and that the
    leaf's dtype holds them exactly (floats round to a float dtype's precision)."""

    fast = True  # the engine's fused step may take an array that passes fast_in_bounds

    def fast_in_bounds(self, arr: np.ndarray) -> bool:
        """No bounds here: an array of the leaf's dtype (any float for a float leaf)
        needs no check."""
        return arr.dtype == self.dtype or (arr.dtype.kind == "f" and self.dtype.kind == "f")

    def check(self, value) -> np.ndarray:
        if type(value) is np.ndarray and value.shape == self.shape and self.fast_in_bounds(value):
            return value
        arr = _as_array(value, self.where)
        if arr.shape != self.shape:
            raise _wrong_shape(self.where, arr.shape, self.shape)
        if self.dtype.kind == "f" or arr.dtype == self.dtype:
            return arr
        if arr.dtype.kind == "f" and not (np.isfinite(arr).all() and np.array_equal(arr, np.round(arr))):
            raise ValueError(
                f"{self.where} must hold whole numbers for {self.leaf.space} (dtype {self.dtype}); "
                "the shared memory would change the value"
            )
        with np.errstate(invalid="ignore", over="ignore"):
            cast = arr.astype(self.dtype)
        if not np.array_equal(cast, arr):
            bad = np.argwhere(cast != arr)[0]
            raise ValueError(
                f"{self.where} for env {int(bad[0])} does not fit dtype {self.dtype} of "
                f"{self.leaf.space}: {arr[tuple(bad)]!r} would become {cast[tuple(bad)]!r}"
            )
        return arr


class _LeafCheck(_ArrayCheck):
    """Checks one leaf's batch: dtype kind, shape and bounds, precomputed once."""

    def __init__(self, leaf: Leaf, num_envs: int):
        super().__init__(leaf, num_envs)
        space = leaf.space
        self.low = self.high = None
        if isinstance(space, spaces.Box) and space.dtype == np.bool_:
            self.kinds = "b"
            self.integral = True
        elif isinstance(space, spaces.Box):
            self.kinds = "iuf"
            low = np.asarray(space.low, dtype=np.float64)
            high = np.asarray(space.high, dtype=np.float64)
            if np.isfinite(low).any() or np.isfinite(high).any():
                self.low, self.high = low, high
            self.integral = space.dtype.kind in "iu"
        elif isinstance(space, spaces.Discrete):
            self.kinds = "iu"
            self.low, self.high = int(space.start), int(space.start + space.n - 1)
            self.integral = True
        elif isinstance(space, spaces.MultiDiscrete):
            self.kinds = "iu"
            self.low, self.high = space.start, space.start + space.nvec - 1
            self.integral = True
        elif isinstance(space, spaces.MultiBinary):
            self.kinds = "biu"
            self.low, self.high = 0, 1
            self.integral = True
        else:  # pragma: no cover - leaves_of rejects other spaces
            raise ValueError(f"unsupported action space {space}")
        # The fast path: one compiled pass over [num_envs, m] against per-column bounds.
        m = int(np.prod(leaf.shape, dtype=np.int64))
        self.fast = None
        if m > 0:
            if self.low is None:
                lo, hi = np.full(m, -np.inf), np.full(m, np.inf)
            else:
                lo = np.broadcast_to(np.asarray(self.low, dtype=np.float64), leaf.shape).reshape(m).copy()
                hi = np.broadcast_to(np.asarray(self.high, dtype=np.float64), leaf.shape).reshape(m).copy()
            finite = np.concatenate([lo[np.isfinite(lo)], hi[np.isfinite(hi)]])
            if not (np.abs(finite) >= _EXACT).any():
                # Integer spaces take float batches only through the checks below.
                ok = frozenset(d for d in _FAST_DTYPES if not (self.integral and d.kind == "f"))
                self.fast = (num_envs, m, lo, hi, ok)

    def fast_in_bounds(self, arr: np.ndarray) -> bool:
        """The compiled bounds check, where it applies. In bounds as given implies in
        bounds in the space's dtype (rounding is monotonic and the bounds are values of
        that dtype). False also means "not decided": the numpy path decides and words
        the error."""
        fast = self.fast
        return (
            fast is not None
            and arr.dtype in fast[4]
            and arr.flags.c_contiguous
            and in_bounds(arr.reshape(fast[0], fast[1]), fast[2], fast[3])
        )

    def check(self, value) -> np.ndarray:
        # The usual batch first, in as few steps as possible.
        if type(value) is np.ndarray and value.shape == self.shape and self.fast_in_bounds(value):
            return value
        arr = _as_array(value, self.where)
        if arr.dtype.kind not in self.kinds:
            raise ValueError(
                f"{self.where} has dtype {arr.dtype}, but {type(self.leaf.space).__name__} actions "
                f"need {dict(b='booleans', iuf='numbers').get(self.kinds, 'integers')}"
                + (" (NaN is not an action)" if arr.dtype.kind == "f" else "")
            )
        if arr.shape != self.shape:
            raise _wrong_shape(self.where, arr.shape, self.shape)
        if self.fast_in_bounds(arr):
            return arr
        if arr.dtype.kind == "f":
            if np.isnan(arr).any():
                raise ValueError(f"{self.where} contains NaN")
            if self.integral:  # an integer Box: floats must be whole (and finite) numbers
                if not (np.isfinite(arr).all() and np.array_equal(arr, np.round(arr))):
                    raise ValueError(f"{self.where} must hold whole numbers for dtype {self.dtype}")
        if self.low is not None:
            # Compare in the space's dtype: what the env will actually receive.
            cast = arr.astype(self.dtype, copy=False) if arr.dtype.kind == "f" else arr
            bad = (cast < self.low) | (cast > self.high)
            if bad.any():
                env = int(np.argwhere(bad)[0][0])
                raise ValueError(
                    f"{self.where} for env {env} is out of range: {arr[env]!r} not within "
                    f"[{np.min(self.low)}, {np.max(self.high)}] of {self.leaf.space}"
                )
        return arr


class ActionWriter:
    """Validates a batch of actions for ``space`` and writes it into ``leaves[slot]``
    (``check``: "bounds" or "dtype", see the module's docstring)."""

    def __init__(self, space: spaces.Space, num_envs: int, check: str = "bounds"):
        self.space = space
        self.leaves = leaves_of(space, pickled=True)
        plain = _LeafCheck if check == "bounds" else _DtypeCheck
        self.checks = [(_PickledCheck if leaf.pickled else plain)(leaf, num_envs) for leaf in self.leaves]
        self.nested = isinstance(space, (spaces.Dict, spaces.Tuple))

    def validate(self, actions) -> list[np.ndarray]:
        """Return one checked array per leaf, or raise ValueError."""
        if actions is None:
            raise ValueError("actions must not be None")
        if not self.nested:
            return [self.checks[0].check(actions)]
        out = []
        for chk in self.checks:
            try:
                value = get_path(actions, chk.leaf.path)
            except (KeyError, IndexError, TypeError):
                raise ValueError(f"{chk.where} is missing: actions must be batched like {self.space}") from None
            out.append(chk.check(value))
        return out

    def write(self, arrays: list, dest_leaves: list[np.ndarray], slot: int, start: int = 0) -> None:
        """Write checked ``arrays`` into ``dest_leaves[.][slot]``, from env ``start`` on
        (a batch's rows; 0 and every env for a whole step)."""
        for chk, arr, dest in zip(self.checks, arrays, dest_leaves):
            row = dest[slot, start : start + len(arr)]
            if chk.pickled:  # one object per env (a value may itself be a sequence)
                for i, value in enumerate(arr):
                    row[i] = value
            else:
                row[...] = arr
