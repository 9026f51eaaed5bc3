"""How spaces map onto shared memory: one typed array per leaf of a space.

A *leaf* is a Box, Discrete, MultiDiscrete or MultiBinary space, possibly nested inside
Dict and Tuple spaces. Every leaf gets an array of shape ``[num_slots, num_envs, *shape]``
carved out of one segment; the nesting is kept as a list of access paths so that a
batched Dict/Tuple value can be rebuilt from views without copying.

A space without a fixed size (Graph, Sequence, Text, OneOf, a custom ``Space``) can be a
*pickled leaf* instead, where the caller allows it (``leaves_of(.., pickled=True)``): it
is held in an object array ``[num_slots, num_envs]`` of its own in each process, outside
the segment, and its values travel pickled with the commands and replies that concern
them (``PickledRows``); its batched value is a tuple of per-env values, as
``gymnasium.vector.utils.batch_space`` makes it.

Shared-memory segments: created once by the parent, attached by workers.

The parent owns the segment: it creates it with an unguessable name (mode 0600, set by
``SharedMemory``), registers it with multiprocessing's resource tracker (so a SIGKILLed
parent still gets it unlinked once its workers are gone) and unlinks it on close.
Workers map the segment directly, *without* ``SharedMemory``: on Python < 3.13 attaching
through it registers the name with the resource tracker again, and a tracker that thinks
a worker owns the segment may warn about a leak or unlink it while others still use it.
"""

from __future__ import annotations

import _posixshmem
import mmap
import os
import secrets
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np
from gymnasium import spaces

ALIGN = 64  # cache-line alignment of every array in the segment


OBJECT = np.dtype(object)  # the dtype of a pickled leaf's arrays


@dataclass(frozen=True)
class Leaf:
    path: tuple  # keys (Dict) and indices (Tuple) from the root to this leaf
    space: spaces.Space
    shape: tuple
    dtype: np.dtype  # OBJECT for a pickled leaf

    @property
    def pickled(self) -> bool:
        return self.dtype == OBJECT


def leaves_of(space: spaces.Space, path: tuple = (), pickled: bool = False) -> list[Leaf]:
    """The leaves of ``space`` in a fixed depth-first order. A space that cannot live in
    shared memory raises ``ValueError``, or with ``pickled`` is a pickled leaf."""
    if isinstance(space, spaces.Dict):
        out = []
        for key, sub in space.spaces.items():
            out += leaves_of(sub, path + (key,), pickled)
        return out
    if isinstance(space, spaces.Tuple):
        out = []
        for idx, sub in enumerate(space.spaces):
            out += leaves_of(sub, path + (idx,), pickled)
        return out
    if isinstance(space, spaces.Box):
        return [Leaf(path, space, tuple(space.shape), np.dtype(space.dtype))]
    if isinstance(space, spaces.Discrete):
        return [Leaf(path, space, (), np.dtype(space.dtype))]
    if isinstance(space, spaces.MultiDiscrete):
        return [Leaf(path, space, tuple(space.nvec.shape), np.dtype(space.dtype))]
    if isinstance(space, spaces.MultiBinary):
        return [Leaf(path, space, tuple(np.atleast_1d(space.shape)), np.dtype(space.dtype))]
    if pickled and isinstance(space, spaces.Space):
        return [Leaf(path, space, (), OBJECT)]
    where = "/".join(map(str, path)) or "the space"
    raise ValueError(
        f"fastvec cannot lay out {type(space).__name__} (at {where}) in shared memory here; "
        "supported leaves are Box, Discrete, MultiDiscrete and MultiBinary inside Dict and Tuple "
        "(fastvec.AsyncVectorEnv carries other spaces pickled; gymnasium.wrappers.FilterObservation leaves one out)"
    )


def layout_of(space: spaces.Space) -> list | None:
    """What the ring needs of a space: its leaves' paths, shapes and dtypes, a pickled
    leaf's type (None for what is not a space)."""
    try:
        return [
            (leaf.path, leaf.shape, type(leaf.space) if leaf.pickled else leaf.dtype)
            for leaf in leaves_of(space, pickled=True)
        ]
    except (TypeError, ValueError):
        return None


def get_path(value, path: tuple):
    for key in path:
        value = value[key]
    return value


def build_nested(space: spaces.Space, arrays: list, start: int = 0):
    """Rebuild a Dict/Tuple-shaped value from per-leaf values in ``leaves_of`` order.

    Returns ``(value, next_index)``.
    """
    if isinstance(space, spaces.Dict):
        out = {}
        for key, sub in space.spaces.items():
            out[key], start = build_nested(sub, arrays, start)
        return out, start
    if isinstance(space, spaces.Tuple):
        items = []
        for sub in space.spaces:
            item, start = build_nested(sub, arrays, start)
            items.append(item)
        return tuple(items), start
    return arrays[start], start + 1


def map_nested(fn, value):
    """Apply ``fn`` to every array of a Dict/Tuple-shaped value."""
    if isinstance(value, dict):
        return {k: map_nested(fn, v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(map_nested(fn, v) for v in value)
    return fn(value)


def leaf_batch(buf: np.ndarray, slot: int, copy: bool, writable: bool = False):
    """What a door hands out for one leaf of ``slot``: a copy or a view of a shared
    array (read-only unless ``writable``), or the tuple of per-env values of a pickled
    leaf."""
    if buf.dtype == OBJECT:
        return tuple(buf[slot])
    if copy:
        return buf[slot].copy()
    return buf[slot] if writable else readonly_view(buf[slot])


def leaf_value(buf: np.ndarray, slot: int, i: int, leaf: Leaf, as_int: bool = False):
    """A copy of env ``i``'s value of one leaf in ``slot``: a pickled leaf's value itself,
    a Discrete's a Python int where the env gave one (``as_int``) or else a numpy
    integer, an array otherwise."""
    if buf.dtype == OBJECT:
        return buf[slot, i]
    if isinstance(leaf.space, spaces.Discrete):
        return int(buf[slot, i]) if as_int else buf[slot, i]
    return np.array(buf[slot, i])


def readonly_view(arr: np.ndarray) -> np.ndarray:
    """Views handed to users are read-only: writing into the ring would corrupt it."""
    view = arr.view()
    view.flags.writeable = False
    return view


class SegmentPlan:
    """Byte offsets of named arrays inside one segment, computed before allocation."""

    def __init__(self):
        self.entries: list[tuple[str, tuple, np.dtype, int]] = []
        self.size = 0

    def add(self, name: str, shape: tuple, dtype) -> None:
        dtype = np.dtype(dtype)
        offset = -(-self.size // ALIGN) * ALIGN
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.entries.append((name, tuple(shape), dtype, offset))
        self.size = offset + nbytes

    @classmethod
    def from_entries(cls, entries: list) -> SegmentPlan:
        """The plan another process laid out, from its ``entries``."""
        plan = cls()
        plan.entries = list(entries)
        return plan

    def arrays(self, buf) -> dict[str, np.ndarray]:
        """Numpy views of every planned array over ``buf`` (a memoryview)."""
        out = {}
        for name, shape, dtype, offset in self.entries:
            count = int(np.prod(shape, dtype=np.int64))
            out[name] = np.frombuffer(buf, dtype=dtype, count=count, offset=offset).reshape(shape)
        return out


def plan_segment(
    obs_space, act_space, num_slots: int, num_envs: int, *, num_workers: int = 0, ctl_cols: int = 0, info_cols: int = 0
) -> SegmentPlan:
    """Lay out the ring (observations, final observations, actions, rewards, flags),
    after the control block of ``num_workers`` workers and each env's measured cost
    (none when 0) and before the info table (``info_cols`` numeric info cells per env
    and slot; none when 0)."""
    plan = SegmentPlan()
    if num_workers:
        plan.add("ctl", (num_workers + 1, ctl_cols), np.int64)
        # per env: [nanoseconds, steps] in its worker's step loop (fastvec._core.placement)
        plan.add("env_cost", (num_envs, 2), np.int64)
        # per env: 1 while it is paused (``Engine.pause``): its worker leaves it unstepped
        plan.add("paused", (num_envs,), np.uint8)
    for i, leaf in enumerate(leaves_of(obs_space, pickled=True)):
        if not leaf.pickled:
            plan.add(f"obs{i}", (num_slots, num_envs) + leaf.shape, leaf.dtype)
            plan.add(f"final{i}", (num_slots, num_envs) + leaf.shape, leaf.dtype)
    for i, leaf in enumerate(leaves_of(act_space, pickled=True)):
        if not leaf.pickled:
            plan.add(f"act{i}", (num_slots, num_envs) + leaf.shape, leaf.dtype)
    if any(isinstance(leaf.space, spaces.Discrete) for leaf in leaves_of(obs_space, pickled=True)):
        # same_step: bit k says the k-th Discrete leaf of a final observation was a Python int
        plan.add("final_pytype", (num_slots, num_envs), np.uint32)
    plan.add("rewards", (num_slots, num_envs), np.float64)
    plan.add("terminated", (num_slots, num_envs), np.bool_)
    plan.add("truncated", (num_slots, num_envs), np.bool_)
    if info_cols:
        plan.add("info_table", (num_slots, num_envs, info_cols), np.float64)
        plan.add("info_mask", (num_slots, num_envs), np.uint16)
    return plan


def pickled_arrays(obs_space, act_space, num_slots: int, num_envs: int) -> dict[str, np.ndarray]:
    """The object arrays of the pickled leaves (outside the segment, one set per
    process), named as ``plan_segment`` names the others: merge them into its arrays."""
    out = {}
    for i, leaf in enumerate(leaves_of(obs_space, pickled=True)):
        if leaf.pickled:
            out[f"obs{i}"] = np.full((num_slots, num_envs), None, dtype=OBJECT)
            out[f"final{i}"] = np.full((num_slots, num_envs), None, dtype=OBJECT)
    for i, leaf in enumerate(leaves_of(act_space, pickled=True)):
        if leaf.pickled:
            out[f"act{i}"] = np.full((num_slots, num_envs), None, dtype=OBJECT)
    return out


@dataclass
class Ring:
    """The ring's arrays by role, as ``plan_segment`` names them; ``envs`` narrows every
    one to a ``[start, stop)`` range of envs (a worker's or an actor's share)."""

    obs: list
    final: list
    act: list
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray

    @classmethod
    def of(cls, arrays: dict, envs: tuple | None = None) -> Ring:
        part = (lambda a: a) if envs is None else (lambda a: a[:, envs[0] : envs[1]])
        n_obs = sum(1 for name in arrays if name.startswith("obs"))
        n_act = sum(1 for name in arrays if name.startswith("act"))
        return cls(
            obs=[part(arrays[f"obs{i}"]) for i in range(n_obs)],
            final=[part(arrays[f"final{i}"]) for i in range(n_obs)],
            act=[part(arrays[f"act{i}"]) for i in range(n_act)],
            rewards=part(arrays["rewards"]),
            terminated=part(arrays["terminated"]),
            truncated=part(arrays["truncated"]),
        )


PREFIX = "fastvec_"


def create_segment(size: int) -> shared_memory.SharedMemory:
    """Create a new segment of at least ``size`` bytes with a random name."""
    size = max(int(size), 1)
    for _ in range(8):
        name = PREFIX + secrets.token_hex(12)
        try:
            return shared_memory.SharedMemory(name=name, create=True, size=size)
        except FileExistsError:  # pragma: no cover - 96 random bits
            continue
    raise RuntimeError("could not find a free shared-memory name")  # pragma: no cover


def attach_segment(name: str) -> mmap.mmap:
    """Map an existing segment, bypassing ``SharedMemory`` (and so the resource tracker).

    Workers only map the segment; the mapping lives as long as the views made from it,
    so no explicit close is needed (and none can fail with exported buffers).
    """
    fd = _posixshmem.shm_open("/" + name if not name.startswith("/") else name, os.O_RDWR, mode=0o600)
    try:
        size = os.fstat(fd).st_size
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def release_segment(segment: shared_memory.SharedMemory | None, *, unlink: bool) -> None:
    """Close (and unlink, for the owner) a segment; safe to call twice."""
    if segment is None:
        return
    try:
        segment.close()
    except (BufferError, OSError):
        # Views are still alive (a user kept a zero-copy observation): the mapping goes
        # away with the last of them. Drop our handles so __del__ does not retry noisily.
        segment._buf = None
        segment._mmap = None
    if unlink:
        try:
            segment.unlink()
        except FileNotFoundError:
            pass
