# cython: language_level=3
"""A seqlock over shared memory: one writer publishes versions of a block of bytes,
readers copy it out without ever blocking the writer.

The header is an int64 array: ``[0]`` the sequence number (odd while a write is under
way), ``[1]`` the version the block holds. The writer bumps the sequence to odd,
fences, writes, and publishes the version and an even sequence; a reader takes the
sequence, copies, fences and reads it again: the copy is whole when both readings are
equal and even. Sequentially consistent atomics and fences (``sync.pxd``) make this
hold on weakly ordered CPUs too, not just on x86.

The trainer's async pipeline publishes its learner's weights through one
(``fastvec.train.pipelines.collector``): the collector looks at ``version`` between env steps
(one atomic load) and copies only when it moved.
"""

from fastvec._core.sync cimport fv_load, fv_store

cdef extern from *:
    """
    static inline void fv_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
    """
    void fv_fence() nogil


def version(long long[::1] header):
    """The version the block holds (possibly mid-write: confirm with ``read_end``)."""
    return fv_load(&header[1])


def write_begin(long long[::1] header):
    """Start a write: readers that overlap it will see a torn copy and retry."""
    cdef long long seq = fv_load(&header[0])
    if seq & 1:
        raise RuntimeError("seqlock: a write is already under way (one writer only)")
    fv_store(&header[0], seq + 1)
    fv_fence()


def write_end(long long[::1] header, long long new_version):
    """Publish the block written since ``write_begin`` as ``new_version``."""
    fv_fence()
    fv_store(&header[1], new_version)
    fv_store(&header[0], fv_load(&header[0]) + 1)


def read_begin(long long[::1] header):
    """The sequence number to hand to ``read_end``; odd: a write is under way."""
    cdef long long seq = fv_load(&header[0])
    fv_fence()
    return seq


def read_end(long long[::1] header, long long seq):
    """True when what was copied since ``read_begin`` is one whole version."""
    fv_fence()
    return (seq & 1) == 0 and fv_load(&header[0]) == seq
