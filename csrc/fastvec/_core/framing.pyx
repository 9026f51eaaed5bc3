# cython: language_level=3
"""Socket framing: fixed 16-byte headers (four int32: code, slot, argument, payload
length) on a socketpair per worker, optionally followed by a pickled payload
(protocol.pxd).

The parent reads its workers with ``read_bounded``: a worker writes each message with
one write, so its bytes arrive together, and a message that stops half way is garbage
(``ValueError``), never a hang. A closed peer is ``PeerClosed``.
"""
from cpython.exc cimport PyErr_CheckSignals
from libc.errno cimport ECONNRESET, EINTR, EPIPE, errno
from posix.unistd cimport read, write

from fastvec._core.protocol cimport HEADER_BYTES, MAX_PAYLOAD, REPLY_DONE, REPLY_ERROR, REPLY_RESULT, WAKE
from fastvec._core.sync cimport POLLIN, poll, pollfd
from fastvec._core.tuning cimport PARTIAL_MESSAGE_MS

cdef extern from "<sys/socket.h>" nogil:
    ssize_t recv(int fd, void *buf, size_t n, int flags)
    enum:
        MSG_DONTWAIT
cdef extern from "<errno.h>":
    enum:
        EAGAIN  # == EWOULDBLOCK on Linux and macOS


class PeerClosed(EOFError):
    """The other end of a control socket closed (its process exited or died)."""


cdef int write_all(int fd, const char *buf, Py_ssize_t n) except -1:
    cdef Py_ssize_t done = 0, r
    while done < n:
        with nogil:
            r = write(fd, buf + done, n - done)
        if r < 0:
            if errno == EINTR:
                PyErr_CheckSignals()
                continue
            if errno == EPIPE or errno == ECONNRESET:
                raise PeerClosed("control socket closed by peer")
            raise OSError(errno, "write to control socket failed")
        done += r
    return 0


cdef int read_all(int fd, char *buf, Py_ssize_t n) except -1:
    """Read exactly n bytes; raises PeerClosed on end of file."""
    cdef Py_ssize_t done = 0, r
    while done < n:
        with nogil:
            r = read(fd, buf + done, n - done)
        if r == 0:
            raise PeerClosed("control socket closed by peer")
        if r < 0:
            if errno == EINTR:
                PyErr_CheckSignals()  # raises KeyboardInterrupt etc. where due
                continue
            if errno == ECONNRESET:  # closed with unread bytes (e.g. a spare WAKE)
                raise PeerClosed("control socket closed by peer")
            raise OSError(errno, "read from control socket failed")
        done += r
    return 0


cdef int read_bounded(int fd, char *buf, Py_ssize_t n) except -1:
    """Read exactly n bytes from a peer we do not trust to finish its message."""
    cdef Py_ssize_t done = 0, r
    cdef pollfd p
    cdef int pr
    while done < n:
        with nogil:
            r = recv(fd, buf + done, n - done, MSG_DONTWAIT)
        if r > 0:
            done += r
            continue
        if r == 0:
            raise PeerClosed("control socket closed by peer")
        if errno == EINTR:
            PyErr_CheckSignals()
            continue
        if errno == ECONNRESET:
            raise PeerClosed("control socket closed by peer")
        if errno != EAGAIN:
            raise OSError(errno, "read from control socket failed")
        p.fd = fd
        p.events = POLLIN
        p.revents = 0
        with nogil:
            pr = poll(&p, 1, PARTIAL_MESSAGE_MS)
        if pr == 0:
            raise ValueError(f"malformed control message: stopped after {done} of {n} bytes")
        if pr < 0 and errno == EINTR:
            PyErr_CheckSignals()
    return 0


cdef tuple read_payload_bounded(int fd, int *hdr):
    """The rest of a reply whose header ``hdr`` was read: ``(header, payload bytes)``;
    ``ValueError`` for an unknown reply code or a payload length out of range."""
    if hdr[0] not in (REPLY_DONE, REPLY_RESULT, REPLY_ERROR):
        raise ValueError(f"malformed control message: unknown reply code {hdr[0]}")
    if hdr[3] < 0 or hdr[3] > MAX_PAYLOAD:
        raise ValueError(f"malformed control message: payload length {hdr[3]}")
    buf = bytearray(hdr[3])
    if hdr[3]:
        read_bounded(fd, <char *>buf, hdr[3])
    return (hdr[0], hdr[1], hdr[2], hdr[3]), bytes(buf)


cdef tuple recv_message(int fd):
    """One (header, payload) from an untrusted peer, skipping spare WAKE headers."""
    cdef int hdr[4]
    while True:
        read_bounded(fd, <char *>hdr, HEADER_BYTES)
        if hdr[0] != WAKE:
            break
    return read_payload_bounded(fd, hdr)


cdef int read_header_skip_wake(int fd, int *hdr) except -1:
    """Read headers into ``hdr`` until one is not a spare WAKE."""
    while True:
        read_all(fd, <char *>hdr, HEADER_BYTES)
        if hdr[0] != WAKE:
            return 0


cdef int send_wake(int fd) except -1:
    """Ring: a header with nothing behind it ("look at the control block")."""
    cdef int hdr[4]
    hdr[0] = WAKE
    hdr[1] = 0
    hdr[2] = 0
    hdr[3] = 0
    write_all(fd, <char *>hdr, HEADER_BYTES)
    return 0


def send_header(int fd, int cmd, int slot=0, int arg=0, bytes payload=None):
    """Send one header (and its payload, if any)."""
    cdef int hdr[4]
    cdef Py_ssize_t n = 0 if payload is None else len(payload)
    hdr[0] = cmd
    hdr[1] = slot
    hdr[2] = arg
    hdr[3] = <int>n
    if n == 0:
        write_all(fd, <char *>hdr, HEADER_BYTES)
    else:
        write_all(fd, <bytes>(((<char *>hdr)[:HEADER_BYTES]) + payload), HEADER_BYTES + n)


def recv_header(int fd):
    """Block until one header arrives; returns (cmd, slot, arg, payload_len)."""
    cdef int hdr[4]
    read_all(fd, <char *>hdr, HEADER_BYTES)
    return hdr[0], hdr[1], hdr[2], hdr[3]


def recv_payload(int fd, Py_ssize_t n):
    """Read a payload of exactly n bytes."""
    if n < 0 or n > MAX_PAYLOAD:
        raise ValueError(f"malformed control message: payload length {n}")
    buf = bytearray(n)
    cdef char *p = buf
    if n:
        read_all(fd, p, n)
    return bytes(buf)
