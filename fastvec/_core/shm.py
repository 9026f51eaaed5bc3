"""Shared-memory segments: created once by the parent, attached by workers.

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
from multiprocessing import shared_memory

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
