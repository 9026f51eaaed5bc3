# cython: language_level=3
"""Compiled hot paths of the engine: control messages and the worker's step loop.

Control messages are fixed 16-byte headers (four int32: command, slot, argument,
payload length) on a socketpair per worker, optionally followed by a pickled payload.
A step costs one header each way and no pickling unless an env returned an info.

The step loop runs every env of a worker, writes observations, rewards and flags
straight into the shared arrays, and handles autoreset, all without leaving C for
anything but the env's own Python code.
"""
import pickle
import time

import numpy as np

from fastvec.infos import encode_columns

cimport cython
cimport numpy as cnp
from cpython.exc cimport PyErr_CheckSignals
from libc.errno cimport ECONNRESET, EINTR, EPIPE, errno
from libc.string cimport memcpy
from posix.unistd cimport read, write

cnp.import_array()

cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    enum:
        POLLIN
        POLLERR
        POLLHUP
        POLLNVAL

# Commands, parent -> worker.
CMD_STEP = 1
CMD_RESET = 2
CMD_CALL = 3
CMD_SET_ATTR = 4
CMD_CLOSE = 5
CMD_SPACES = 6
# Replies, worker -> parent.
REPLY_DONE = 16
REPLY_RESULT = 17
REPLY_ERROR = 18
REPLY_READY = 19
HEADER_BYTES = 16
# Largest payload accepted from a peer: a garbled header must not make us allocate 2 GiB.
MAX_PAYLOAD = 1 << 30

# Autoreset modes of the step loop.
AUTORESET_SAME_STEP = 0
AUTORESET_NEXT_STEP = 1
AUTORESET_DISABLED = 2

cdef enum:
    _CMD_STEP = 1
    _REPLY_DONE = 16
    _REPLY_RESULT = 17
    _REPLY_ERROR = 18
    _MODE_SAME_STEP = 0
    _MODE_NEXT_STEP = 1


class PeerClosed(EOFError):
    """The other end of a control socket closed (its process exited or died)."""


cdef int _write_all(int fd, const char *buf, Py_ssize_t n) except -1:
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


cdef int _read_all(int fd, char *buf, Py_ssize_t n) except -1:
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


cdef extern from "<sys/socket.h>" nogil:
    ssize_t recv(int fd, void *buf, size_t n, int flags)
    enum:
        MSG_DONTWAIT
cdef extern from "<errno.h>":
    enum:
        EAGAIN  # == EWOULDBLOCK on Linux and macOS

# A worker writes each message with one write, so its bytes arrive together; a message
# that stops half way is garbage, and waiting for the rest must not hang the parent.
cdef int _PARTIAL_MS = 2000


cdef int _read_bounded(int fd, char *buf, Py_ssize_t n) except -1:
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
            pr = poll(&p, 1, _PARTIAL_MS)
        if pr == 0:
            raise ValueError(f"malformed control message: stopped after {done} of {n} bytes")
        if pr < 0 and errno == EINTR:
            PyErr_CheckSignals()
    return 0


cdef tuple _recv_message(int fd):
    """One (header, payload) from an untrusted peer, skipping spare WAKE headers."""
    cdef int hdr[4]
    while True:
        _read_bounded(fd, <char *>hdr, HEADER_BYTES)
        if hdr[0] != _WAKE:
            break
    if hdr[0] not in (_REPLY_DONE, _REPLY_RESULT, _REPLY_ERROR):
        raise ValueError(f"malformed control message: unknown reply code {hdr[0]}")
    if hdr[3] < 0 or hdr[3] > MAX_PAYLOAD:
        raise ValueError(f"malformed control message: payload length {hdr[3]}")
    buf = bytearray(hdr[3])
    if hdr[3]:
        _read_bounded(fd, <char *>buf, hdr[3])
    return (hdr[0], hdr[1], hdr[2], hdr[3]), bytes(buf)


def send_header(int fd, int cmd, int slot=0, int arg=0, bytes payload=None):
    """Send one header (and its payload, if any)."""
    cdef int hdr[4]
    cdef Py_ssize_t n = 0 if payload is None else len(payload)
    hdr[0] = cmd
    hdr[1] = slot
    hdr[2] = arg
    hdr[3] = <int>n
    if n == 0:
        _write_all(fd, <char *>hdr, HEADER_BYTES)
    else:
        _write_all(fd, <bytes>(((<char *>hdr)[:HEADER_BYTES]) + payload), HEADER_BYTES + n)


def recv_header(int fd):
    """Block until one header arrives; returns (cmd, slot, arg, payload_len)."""
    cdef int hdr[4]
    _read_all(fd, <char *>hdr, HEADER_BYTES)
    return hdr[0], hdr[1], hdr[2], hdr[3]


def recv_payload(int fd, Py_ssize_t n):
    """Read a payload of exactly n bytes."""
    if n < 0 or n > MAX_PAYLOAD:
        raise ValueError(f"malformed control message: payload length {n}")
    buf = bytearray(n)
    cdef char *p = buf
    if n:
        _read_all(fd, p, n)
    return bytes(buf)



# ---------------------------------------------------------------------------
# Doorbells: spin briefly on a shared-memory sequence number, then sleep on the socket.
#
# A wake-up through a socket costs ~25 us one way on a small VM; a step of 8 cheap envs
# costs about twice that. So the receiver of a message first spins (with a CPU pause and
# sched_yield, so a busy core is handed over) on a sequence number in shared memory, and
# only after ``spin_us`` declares itself asleep and blocks on its socket. The sender
# bumps the sequence number and sends a 16-byte WAKE header only if the receiver said
# it sleeps. Both sides store-then-load with sequentially consistent atomics (Dekker),
# so no wake-up is lost; a spare WAKE header is skipped by the reader.
#
# Payloads (pickled infos, errors, call results, commands with arguments) still travel
# on the socket, written *before* the sequence number is published.
#
# Only the *last* worker the parent waits for rings it: the parent marks the workers it
# waits on (``waited``) before it sleeps, and a worker that finishes while the parent
# sleeps sends WAKE only if every marked worker is done. One wake-up per step instead
# of one per worker: on a 2-core VM each costs ~40 us of a core the envs need.
#
# Control block: int64[num_workers + 1, 16]; per worker one cache line written by the
# parent [cmd_seq, cmd, slot, arg, waited] and one written by the worker [done_seq,
# reply, reply_slot, reply_arg, sleeping]; the last row holds main_sleeping.
# ---------------------------------------------------------------------------
cdef extern from *:
    """
    #include <sched.h>
    #include <time.h>
    static inline long long fv_load(long long *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
    static inline void fv_store(long long *p, long long v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
    static inline void fv_relax(void) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
    #elif defined(__aarch64__)
        __asm__ __volatile__("yield");
    #endif
    }
    static inline long long fv_now_ns(void) {
        struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
        return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }
    """
    long long fv_load(long long *p) nogil
    void fv_store(long long *p, long long v) nogil
    void fv_relax() nogil
    long long fv_now_ns() nogil
    int sched_yield() nogil

# Columns: a parent-written cache line, then a worker-written one.
cdef enum:
    C_CMD_SEQ = 0
    C_CMD = 1
    C_SLOT = 2
    C_ARG = 3
    C_WAITED = 4
    C_DONE_SEQ = 8
    C_REPLY = 9
    C_REPLY_SLOT = 10
    C_REPLY_ARG = 11
    C_SLEEPING = 12
    _CTL_COLS = 16
    _WAKE = 99
    _NO_PAYLOAD = 0
    _HAS_PAYLOAD = 1
    _IN_TABLE = 2  # reply flag: the step's infos are in the shared info table
    _INFO_COLS = 16
CTL_COLS = _CTL_COLS
WAKE = _WAKE
INFO_COLS = _INFO_COLS  # numeric info keys per worker that fit the shared table
IN_TABLE = _IN_TABLE
HAS_PAYLOAD = _HAS_PAYLOAD


cdef int _read_header_skip_wake(int fd, int *hdr) except -1:
    while True:
        _read_all(fd, <char *>hdr, HEADER_BYTES)
        if hdr[0] != _WAKE:
            return 0


cdef int _send_wake(int fd) except -1:
    cdef int hdr[4]
    hdr[0] = _WAKE
    hdr[1] = 0
    hdr[2] = 0
    hdr[3] = 0
    _write_all(fd, <char *>hdr, HEADER_BYTES)
    return 0


class DoorbellError(OSError):
    """A worker's doorbell could not be rung (its socket is gone)."""


cdef class Controller:
    """The parent's side of the doorbells: issue commands, wait for replies."""
    cdef long long *ctl
    cdef object ctl_array
    cdef int n
    cdef int[::1] fds
    cdef long long spin_ns
    cdef long long[::1] expected
    cdef list stash

    def __init__(self, object ctl_array, int[::1] fds, double spin_us):
        cdef cnp.ndarray arr = ctl_array
        if arr.dtype != np.int64 or arr.ndim != 2 or arr.shape[1] != _CTL_COLS or not arr.flags.c_contiguous:
            raise ValueError("control block must be a C-contiguous int64 [n + 1, 16] array")
        self.ctl_array = arr
        self.ctl = <long long *>cnp.PyArray_DATA(arr)
        self.n = fds.shape[0]
        self.fds = fds
        self.spin_ns = <long long>(spin_us * 1000.0)
        self.expected = np.zeros(self.n, dtype=np.int64)
        self.stash = [None] * self.n

    cdef inline long long *row(self, int w) noexcept nogil:
        return self.ctl + w * _CTL_COLS

    def issue(self, int w, int cmd, int slot=0, bytes payload=None):
        """Send one command to worker w (payload first, then the doorbell)."""
        cdef long long *r = self.row(w)
        if payload is not None:
            send_header(self.fds[w], cmd, slot, 0, payload)
        r[C_CMD] = cmd
        r[C_SLOT] = slot
        r[C_ARG] = _NO_PAYLOAD if payload is None else _HAS_PAYLOAD
        self.expected[w] = fv_load(&r[C_CMD_SEQ]) + 1
        fv_store(&r[C_CMD_SEQ], self.expected[w])
        if fv_load(&r[C_SLEEPING]):
            _send_wake(self.fds[w])

    def issue_all(self, int cmd, int slot=0):
        """The step's wake-up: the same payload-less command to every worker."""
        cdef int w
        cdef long long *r
        for w in range(self.n):
            r = self.row(w)
            r[C_CMD] = cmd
            r[C_SLOT] = slot
            r[C_ARG] = _NO_PAYLOAD
            self.expected[w] = fv_load(&r[C_CMD_SEQ]) + 1
            fv_store(&r[C_CMD_SEQ], self.expected[w])
        for w in range(self.n):
            if fv_load(&self.row(w)[C_SLEEPING]):
                try:
                    _send_wake(self.fds[w])
                except PeerClosed:
                    pass  # a dead worker: the wait that follows names it

    def issue_all_wait(self, int cmd, int slot, int[::1] workers, double timeout):
        """``issue_all`` then ``wait``, with nothing in between: a worker sharing the
        parent's CPU gets it as soon as the parent starts waiting. A failed doorbell
        raises ``DoorbellError``."""
        try:
            self.issue_all(cmd, slot)
        except OSError as exc:
            raise DoorbellError(*exc.args) from None
        return self.wait(workers, timeout)

    cdef bint _done(self, int w) noexcept nogil:
        return fv_load(&self.row(w)[C_DONE_SEQ]) == self.expected[w]

    def is_done(self, int w):
        return bool(self._done(w))

    def forget(self, int w):
        """Worker w was replaced: drop what we kept from the old process."""
        cdef long long *r = self.row(w)
        self.stash[w] = None
        fv_store(&r[C_SLEEPING], 0)
        self.expected[w] = fv_load(&r[C_CMD_SEQ])
        fv_store(&r[C_DONE_SEQ], self.expected[w])

    def wait(self, int[::1] workers, double timeout):
        """Wait until every worker in ``workers`` has answered its last command.

        Returns ``(0, -1)`` when all did, ``(1, w)`` on timeout (w silent), ``(2, w)``
        when w's socket closed (it died) and ``(3, w)`` when w sent garbage.
        ``timeout`` < 0 waits forever.
        """
        cdef Py_ssize_t m = workers.shape[0], k
        cdef int w, r, wait_ms, pending
        cdef long long t0 = fv_now_ns(), spin_end = t0 + self.spin_ns, now
        cdef long long deadline = t0 + <long long>(timeout * 1e9) if timeout >= 0 else -1
        cdef long long *main_sleeping = self.row(self.n)
        cdef int hdr[4]
        cdef pollfd *pfds
        for w in range(self.n):
            fv_store(&self.row(w)[C_WAITED], 0)
        for k in range(m):
            fv_store(&self.row(workers[k])[C_WAITED], 1)
        # Spin: the common case for cheap envs.
        with nogil:
            while True:
                pending = 0
                for k in range(m):
                    if not self._done(workers[k]):
                        pending = 1
                        break
                if not pending:
                    break
                now = fv_now_ns()
                if now >= spin_end or (deadline >= 0 and now >= deadline):
                    break
                fv_relax()
                sched_yield()
        if not pending:
            return 0, -1
        pfd_bytes = bytearray(m * sizeof(pollfd))
        pfds = <pollfd *><char *>pfd_bytes
        while True:
            fv_store(main_sleeping, 1)
            pending = 0
            for k in range(m):
                w = workers[k]
                if self._done(w):
                    pfds[k].fd = -1
                else:
                    pfds[k].fd = self.fds[w]
                    pending += 1
                pfds[k].events = POLLIN
                pfds[k].revents = 0
            if pending == 0:
                fv_store(main_sleeping, 0)
                return 0, -1
            if deadline >= 0:
                now = fv_now_ns()
                if now >= deadline:
                    fv_store(main_sleeping, 0)
                    for k in range(m):
                        if not self._done(workers[k]):
                            return 1, workers[k]
                wait_ms = <int>((deadline - now) // 1000000) + 1
            else:
                wait_ms = -1
            with nogil:
                r = poll(pfds, m, wait_ms)
            fv_store(main_sleeping, 0)
            if r < 0:
                if errno == EINTR:
                    PyErr_CheckSignals()
                    continue
                raise OSError(errno, "poll failed")
            for k in range(m):
                if pfds[k].fd < 0 or pfds[k].revents == 0:
                    continue
                w = workers[k]
                try:
                    _read_bounded(self.fds[w], <char *>hdr, HEADER_BYTES)
                    if hdr[0] == _WAKE:
                        continue
                    # A reply payload written ahead of its doorbell: keep it.
                    if self.stash[w] is not None or hdr[0] not in (_REPLY_DONE, _REPLY_RESULT, _REPLY_ERROR) \
                            or hdr[3] < 0 or hdr[3] > MAX_PAYLOAD:
                        return 3, w  # garbage on the socket
                    buf = bytearray(hdr[3])
                    if hdr[3]:
                        _read_bounded(self.fds[w], <char *>buf, hdr[3])
                    self.stash[w] = ((hdr[0], hdr[1], hdr[2], hdr[3]), bytes(buf))
                except PeerClosed:
                    if self._done(w) and self.stash[w] is None:
                        continue
                    return 2, w
                except ValueError:
                    return 3, w

    def plain_step_replies(self, int slot):
        """After a step every worker answered: the number of workers whose infos are in
        the info table when every reply is a payload-less DONE for ``slot`` (nothing to
        read off a socket), else -1 (the caller reads the replies one by one)."""
        cdef int w, n_table = 0
        cdef long long *r
        for w in range(self.n):
            r = self.row(w)
            if self.stash[w] is not None or not self._done(w):
                return -1
            if r[C_REPLY] != _REPLY_DONE or r[C_REPLY_SLOT] != slot or r[C_REPLY_ARG] & ~_IN_TABLE:
                return -1
            if r[C_REPLY_ARG] & _IN_TABLE:
                n_table += 1
        return n_table

    def reply(self, int w):
        """The reply of worker w to its last command: (code, slot, arg, payload or None)."""
        cdef long long *r = self.row(w)
        cdef int hdr[4]
        cdef int code = <int>r[C_REPLY]
        cdef int arg = <int>r[C_REPLY_ARG]
        payload = None
        if arg & ~(_HAS_PAYLOAD | _IN_TABLE):
            self.stash[w] = None
            raise ValueError(f"malformed control message: reply flags {arg}")
        if arg & _HAS_PAYLOAD:
            if self.stash[w] is not None:
                header, payload = self.stash[w]
                self.stash[w] = None
            else:
                header, payload = _recv_message(self.fds[w])
            if header[0] != code:
                raise ValueError(f"malformed control message: reply {code} but payload header {header}")
        elif self.stash[w] is not None:
            self.stash[w] = None
            raise ValueError("malformed control message: a payload nobody announced")
        return code, <int>r[C_REPLY_SLOT], arg, payload


cdef class WorkerChannel:
    """A worker's side of the doorbells."""
    cdef long long *ctl
    cdef long long *base
    cdef int n_rows
    cdef long long *main_row
    cdef object ctl_array
    cdef public int fd
    cdef long long spin_ns
    cdef public long long seen
    cdef object stash

    def __init__(self, object ctl_array, int w, int fd, double spin_us):
        cdef cnp.ndarray arr = ctl_array
        self.ctl_array = arr
        self.base = <long long *>cnp.PyArray_DATA(arr)
        self.n_rows = <int>arr.shape[0] - 1
        self.ctl = self.base + w * _CTL_COLS
        self.main_row = <long long *>cnp.PyArray_DATA(arr) + (arr.shape[0] - 1) * _CTL_COLS
        self.fd = fd
        self.spin_ns = <long long>(spin_us * 1000.0)
        self.seen = fv_load(&self.ctl[C_CMD_SEQ])
        self.stash = None

    cdef int _wait(self) except -1:
        """Block until the command sequence number moves past ``seen``."""
        cdef long long *r = self.ctl
        cdef long long spin_end = fv_now_ns() + self.spin_ns
        cdef int hdr[4]
        cdef bint got = False
        with nogil:
            while True:
                if fv_load(&r[C_CMD_SEQ]) != self.seen:
                    got = True
                    break
                if fv_now_ns() >= spin_end:
                    break
                fv_relax()
                sched_yield()
        while not got:
            fv_store(&r[C_SLEEPING], 1)
            if fv_load(&r[C_CMD_SEQ]) != self.seen:
                fv_store(&r[C_SLEEPING], 0)
                break
            _read_all(self.fd, <char *>hdr, HEADER_BYTES)  # PeerClosed when the parent is gone
            fv_store(&r[C_SLEEPING], 0)
            if hdr[0] != _WAKE:
                # A command's payload, sent just before its doorbell.
                self.stash = ((hdr[0], hdr[1], hdr[2], hdr[3]), recv_payload(self.fd, hdr[3]))
                spin_end = fv_now_ns() + 5000000000
                while fv_load(&r[C_CMD_SEQ]) == self.seen:
                    if fv_now_ns() > spin_end:
                        raise ValueError(f"malformed control message: header {self.stash[0]} without a doorbell")
                    sched_yield()
            if fv_load(&r[C_CMD_SEQ]) != self.seen:
                break
        self.seen = fv_load(&r[C_CMD_SEQ])
        return 0

    def next_command(self):
        """Wait for the next command: (cmd, slot, arg, payload or None)."""
        self._wait()
        return self.current_command()

    def current_command(self):
        """The command last waited for, with its payload read off the socket."""
        cdef int hdr[4]
        cdef long long *r = self.ctl
        cmd, slot, arg = <int>r[C_CMD], <int>r[C_SLOT], <int>r[C_ARG]
        payload = None
        if arg == _HAS_PAYLOAD:
            if self.stash is not None:
                header, payload = self.stash
                self.stash = None
            else:
                _read_header_skip_wake(self.fd, hdr)
                header = (hdr[0], hdr[1], hdr[2], hdr[3])
                payload = recv_payload(self.fd, hdr[3])
            if header[0] != cmd:
                raise ValueError(f"malformed control message: command {cmd} but payload header {header}")
        return cmd, slot, arg, payload

    cdef int _publish(self, int code, int slot, int has_payload) except -1:
        cdef long long *r = self.ctl
        r[C_REPLY] = code
        r[C_REPLY_SLOT] = slot
        r[C_REPLY_ARG] = has_payload
        fv_store(&r[C_DONE_SEQ], self.seen)
        if fv_load(self.main_row) and self._waited_all_done():
            _send_wake(self.fd)
        return 0

    cdef bint _waited_all_done(self) noexcept nogil:
        # Whether this worker is the last one the parent waits for (ties: both wake it).
        cdef int k
        cdef long long *rr
        for k in range(self.n_rows):
            rr = self.base + k * _CTL_COLS
            if fv_load(&rr[C_WAITED]) and fv_load(&rr[C_DONE_SEQ]) != fv_load(&rr[C_CMD_SEQ]):
                return False
        return True

    def reply(self, int code, int slot=0, bytes payload=None):
        """Answer the current command (payload first, then the doorbell)."""
        if payload is not None:
            send_header(self.fd, code, slot, 0, payload)
            self._publish(code, slot, _HAS_PAYLOAD)
        else:
            self._publish(code, slot, _NO_PAYLOAD)


cdef inline bint _fast_copy(object dest, Py_ssize_t row, object value):
    """memcpy ``value`` into row ``row`` of the 2-D-indexed leaf array ``dest`` when
    it is a C-contiguous array of exactly the leaf's dtype and size."""
    cdef cnp.ndarray d = <cnp.ndarray>dest
    cdef cnp.ndarray v
    cdef Py_ssize_t nbytes
    if not cnp.PyArray_CheckExact(value):
        return False
    v = <cnp.ndarray>value
    if not cnp.PyArray_IS_C_CONTIGUOUS(v):
        return False
    if cnp.PyArray_TYPE(v) != cnp.PyArray_TYPE(d) or not cnp.PyArray_ISNOTSWAPPED(v):
        return False
    # bytes per (slot, env) row of the leaf
    nbytes = cnp.PyArray_STRIDES(d)[1]
    if cnp.PyArray_NBYTES(v) != nbytes:
        return False
    memcpy(<char *>cnp.PyArray_DATA(d) + row * nbytes, cnp.PyArray_DATA(v), nbytes)
    return True


class InfoPicklingError(TypeError):
    """A step's infos could not be sent to the parent."""


def _dump_records(list records):
    """A step's report: ("cols", columns) for flat numeric infos, else ("recs", records)."""
    columns = encode_columns(records)
    if columns is not None:
        return pickle.dumps(("cols", columns), protocol=pickle.HIGHEST_PROTOCOL)
    try:
        return pickle.dumps(("recs", records), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        pass
    try:  # infos holding lambdas or local classes, as SyncVectorEnv would deliver them
        import cloudpickle
        return cloudpickle.dumps(("recs", records), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise InfoPicklingError(f"the infos of this step could not be pickled: {exc}") from exc


_TABLE_FLOATS = (float, np.float16, np.float32, np.float64)
_TABLE_INTS = (int, bool, np.int8, np.int16, np.int32, np.int64,
               np.uint8, np.uint16, np.uint32)


def _table_kind(kind):
    """True for types stored exactly as int64, False as float64, None otherwise."""
    if kind in _TABLE_FLOATS:
        return False
    if kind in _TABLE_INTS:
        return True
    return None


cdef class Stepper:
    """A worker's envs and its views of the shared arrays.

    ``obs_leaves``/``final_leaves``/``act_leaves`` are lists of arrays shaped
    ``[num_slots, num_envs, *leaf_shape]``; ``obs_paths`` gives each observation leaf's
    path inside a Dict/Tuple observation (empty for a plain Box etc.).
    """
    cdef public list envs
    cdef int n_local, offset, num_envs, mode
    cdef list obs_leaves, final_leaves, obs_paths, act_leaves
    cdef object act_space, build_nested
    cdef bint single_obs, act_simple, act_scalar
    cdef double[:, ::1] rewards
    cdef cnp.uint8_t[:, ::1] terminated, truncated
    cdef public object needs_reset
    cdef cnp.uint8_t[::1] _needs_reset
    cdef public int current  # global index of the env being called, for error reports
    # The info table: per slot and env, _INFO_COLS 8-byte cells (float64 or int64 by
    # column) and a bit mask of the cells set this step. ``schema`` maps key -> (column,
    # type, is_int); the parent learns new columns from ``schema_list`` sent once.
    cdef double[:, :, ::1] info_f
    cdef long long[:, :, ::1] info_i
    cdef cnp.uint16_t[:, ::1] info_mask
    cdef dict schema
    cdef public list schema_list
    cdef public bint schema_dirty

    def __init__(self, list envs, int offset, int num_envs, int mode, list obs_leaves,
                 list final_leaves, list obs_paths, list act_leaves, object act_space,
                 object build_nested, object rewards, object terminated, object truncated,
                 object info_table=None, object info_mask=None):
        self.envs = envs
        self.n_local = len(envs)
        self.offset = offset
        self.num_envs = num_envs
        self.mode = mode
        self.obs_leaves = obs_leaves
        self.final_leaves = final_leaves
        self.obs_paths = obs_paths
        self.single_obs = len(obs_leaves) == 1 and len(obs_paths[0]) == 0
        self.act_leaves = act_leaves
        self.act_space = act_space
        self.build_nested = build_nested
        # A single non-nested action leaf: hand the env a scalar (Discrete) or a row copy.
        self.act_simple = len(act_leaves) == 1 and (<cnp.ndarray>act_leaves[0]).ndim >= 2 \
            and not hasattr(act_space, "spaces")
        self.act_scalar = self.act_simple and (<cnp.ndarray>act_leaves[0]).ndim == 2
        self.rewards = rewards
        self.terminated = terminated.view(np.uint8)
        self.truncated = truncated.view(np.uint8)
        self.needs_reset = np.zeros(self.n_local, dtype=np.uint8)
        self._needs_reset = self.needs_reset
        self.current = -1
        self.schema = {}
        self.schema_list = []
        self.schema_dirty = False
        if info_table is not None:
            self.info_f = info_table
            self.info_i = info_table.view(np.int64)
            self.info_mask = info_mask

    cdef int _table(self, list records, int slot) except -1:
        """Write flat numeric step infos into the info table; 1 if every record fit,
        0 if this step's infos must travel pickled (nested, non-numeric, reset infos,
        more than _INFO_COLS keys, ints beyond int64)."""
        cdef int j, i, col
        cdef cnp.uint16_t bits
        cdef tuple entry
        if self.info_mask is None:
            return 0
        for j in range(self.n_local):
            self.info_mask[slot, self.offset + j] = 0
        for rec in records:
            j = <int>rec[0]
            info = rec[1]
            if rec[2] is not None or type(info) is not dict:
                return 0
            i = self.offset + j
            bits = 0
            for key, value in (<dict>info).items():
                kind = type(value)
                entry = self.schema.get(key)
                if entry is None or entry[1] is not kind:
                    entry = self._new_column(key, kind)
                    if entry is None:
                        return 0
                col = <int>entry[0]
                if entry[2]:
                    try:
                        self.info_i[slot, i, col] = <long long>value
                    except OverflowError:
                        return 0
                else:
                    self.info_f[slot, i, col] = <double>value
                bits |= <cnp.uint16_t>(1 << col)
            self.info_mask[slot, i] = bits
        return 1

    cdef object _new_column(self, object key, object kind):
        if key in self.schema:  # same key, another type this time: not a column
            return None
        if len(self.schema_list) >= _INFO_COLS:
            return None
        is_int = _table_kind(kind)
        if is_int is None:
            return None
        entry = (len(self.schema_list), kind, is_int)
        self.schema[key] = entry
        self.schema_list.append((key, kind))
        self.schema_dirty = True
        return entry

    cdef object _action(self, int slot, int i):
        cdef cnp.ndarray a
        if self.act_scalar:
            return (<cnp.ndarray>self.act_leaves[0])[slot, i]
        if self.act_simple:
            return (<cnp.ndarray>self.act_leaves[0])[slot, i].copy()
        parts = [np.array(leaf[slot, i]) if (<cnp.ndarray>leaf).ndim > 2 else leaf[slot, i]
                 for leaf in self.act_leaves]
        return self.build_nested(self.act_space, parts)[0]

    cdef int _write_obs(self, list leaves, int slot, int i, object obs) except -1:
        cdef Py_ssize_t row = <Py_ssize_t>slot * self.num_envs + i
        cdef Py_ssize_t k
        if self.single_obs:
            dest = leaves[0]
            if not _fast_copy(dest, row, obs):
                dest[slot, i] = obs
            return 0
        for k in range(len(leaves)):
            value = obs
            for key in <tuple>self.obs_paths[k]:
                value = value[key]
            dest = leaves[k]
            if not _fast_copy(dest, row, value):
                dest[slot, i] = value
        return 0

    def write_reset_obs(self, int slot, int j, object obs):
        """Write a reset observation of local env ``j`` (used by the Python reset path)."""
        self._write_obs(self.obs_leaves, slot, self.offset + j, obs)

    cpdef list step(self, int slot):
        """Step every env of this worker on the actions in ``slot``; write results there.

        Returns a list of ``(local_index, step_info, reset_info)`` for envs that produced
        a non-empty info or reset, or None when there is nothing to report.
        """
        cdef int j, i
        cdef list records = None
        cdef bint term, trunc
        for j in range(self.n_local):
            i = self.offset + j
            self.current = i
            env = self.envs[j]
            if self.mode == _MODE_NEXT_STEP and self._needs_reset[j]:
                # gymnasium's NEXT_STEP: the step after an episode ended resets instead.
                obs, reset_info = env.reset()
                self._needs_reset[j] = 0
                self.rewards[slot, i] = 0.0
                self.terminated[slot, i] = 0
                self.truncated[slot, i] = 0
                if reset_info:
                    if records is None:
                        records = []
                    records.append((j, None, reset_info))
            else:
                obs, rew, term_obj, trunc_obj, info = env.step(self._action(slot, i))
                term = True if term_obj else False
                trunc = True if trunc_obj else False
                self.rewards[slot, i] = rew
                self.terminated[slot, i] = term
                self.truncated[slot, i] = trunc
                if term or trunc:
                    if self.mode == _MODE_SAME_STEP:
                        self._write_obs(self.final_leaves, slot, i, obs)
                        obs, reset_info = env.reset()
                        # An end with empty infos on both sides sends nothing: the flags
                        # and the final observation in the segment say it all, and the
                        # step stays on the payload-less path (CartPole ends every ~20 steps).
                        if not (type(info) is dict and not info and type(reset_info) is dict and not reset_info):
                            if records is None:
                                records = []
                            records.append((j, info, reset_info))
                    else:
                        if self.mode == _MODE_NEXT_STEP:
                            self._needs_reset[j] = 1
                        if info:
                            if records is None:
                                records = []
                            records.append((j, info, None))
                elif info:
                    if records is None:
                        records = []
                    records.append((j, info, None))
            self._write_obs(self.obs_leaves, slot, i, obs)
        self.current = -1
        return records

    def serve(self, WorkerChannel chan):
        """Answer STEP commands until another command arrives; then return None and
        leave that command to ``chan.current_command()``.

        Exceptions from envs propagate to the caller (the worker's Python loop), which
        reports them; ``self.current`` then names the env that raised.
        """
        cdef list records
        cdef long long *r
        cdef int slot
        while True:
            chan._wait()
            r = chan.ctl
            if r[C_CMD] != _CMD_STEP:
                return None  # the caller reads it with chan.current_command()
            slot = <int>r[C_SLOT]
            records = self.step(slot)
            if records is None:
                chan._publish(_REPLY_DONE, slot, _NO_PAYLOAD)
            elif self._table(records, slot):
                if self.schema_dirty:
                    self.schema_dirty = False
                    send_header(chan.fd, _REPLY_DONE, slot, 0,
                                pickle.dumps(("schema", self.schema_list), protocol=pickle.HIGHEST_PROTOCOL))
                    chan._publish(_REPLY_DONE, slot, _IN_TABLE | _HAS_PAYLOAD)
                else:
                    chan._publish(_REPLY_DONE, slot, _IN_TABLE)
            else:
                chan.reply(_REPLY_DONE, slot, _dump_records(records))


@cython.boundscheck(False)
@cython.wraparound(False)
def mask_full(const cnp.uint16_t[:, ::1] mask, Py_ssize_t slot, int k):
    """True if every env of ``slot`` set all of the first ``k`` info table columns."""
    cdef Py_ssize_t i
    cdef cnp.uint16_t full = <cnp.uint16_t>((1 << k) - 1)
    if not 0 <= slot < mask.shape[0]:
        raise IndexError(f"slot {slot} out of range")
    if k <= 0 or k > _INFO_COLS:
        return False
    for i in range(mask.shape[1]):
        if mask[slot, i] != full:
            return False
    return True



cdef int _check_table(const long long[:, :, ::1] info_i, const double[:, :, ::1] info_f,
                      const cnp.uint16_t[:, ::1] mask, Py_ssize_t slot, Py_ssize_t k) except -1:
    if not 0 <= slot < mask.shape[0]:
        raise IndexError(f"slot {slot} out of range")
    if k == 0 or k > _INFO_COLS or k > info_i.shape[2] or info_i.shape[2] != info_f.shape[2]:
        raise ValueError(f"{k} columns for an info table of {info_i.shape[2]}")
    if info_i.shape[0] != mask.shape[0] or info_i.shape[1] != mask.shape[1] \
            or info_f.shape[0] != mask.shape[0] or info_f.shape[1] != mask.shape[1]:
        raise ValueError("info table and mask disagree in shape")
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
cdef bint _table_full(const cnp.uint16_t[:, ::1] mask, Py_ssize_t slot, Py_ssize_t k) noexcept:
    cdef Py_ssize_t i
    cdef cnp.uint16_t full = <cnp.uint16_t>((1 << k) - 1)
    for i in range(mask.shape[1]):
        if mask[slot, i] != full:
            return False
    return True


# The two builders below turn a step's info table into what a front door returns, for
# the common step where every env set every column. Why compiled: the parent runs this
# once per step with caches cold from the envs that just ran on its core, between the
# workers' reply and its own return; fewer Python objects and frames, less time.
# ``cols``: ``[(key, mask_key, is_int, dtype, kind), ...]`` for columns 0, 1, ...;
# ``kind`` is the Python type the env gave, ``dtype`` what gymnasium's merge makes of it
# (None: the table's own int64/float64).

@cython.boundscheck(False)
@cython.wraparound(False)
def table_vector_infos(const long long[:, :, ::1] info_i, const double[:, :, ::1] info_f,
                       const cnp.uint16_t[:, ::1] mask, Py_ssize_t slot, list cols):
    """gymnasium's vector infos ``{key: values, "_key": all-True mask, ...}`` in column
    order, as ``fastvec.infos.columns_to_vector_infos`` builds them from the same table;
    None when some env lacks some column (the caller takes the general path)."""
    cdef Py_ssize_t i, n = mask.shape[1], k = len(cols), c
    cdef cnp.ndarray row, ones = None
    cdef long long[::1] ri
    cdef double[::1] rf
    _check_table(info_i, info_f, mask, slot, k)
    if not _table_full(mask, slot, k):
        return None
    infos = {}
    for c in range(k):
        key, mask_key, is_int, dtype, _kind = cols[c]
        if is_int:
            row = np.empty(n, dtype=np.int64)
            ri = row
            for i in range(n):
                ri[i] = info_i[slot, i, c]
        else:
            row = np.empty(n, dtype=np.float64)
            rf = row
            for i in range(n):
                rf[i] = info_f[slot, i, c]
        infos[key] = row if dtype is None else row.astype(dtype)
        if ones is None:
            ones = np.ones(n, dtype=np.bool_)
            infos[mask_key] = ones
        else:
            infos[mask_key] = ones.copy()
    return infos


@cython.boundscheck(False)
@cython.wraparound(False)
def table_env_infos(const long long[:, :, ::1] info_i, const double[:, :, ::1] info_f,
                    const cnp.uint16_t[:, ::1] mask, Py_ssize_t slot, list cols):
    """One info dict per env, ``{key: kind(value), ...}`` in column order: the values and
    types the envs returned, as ``fastvec.infos.columns_to_records`` rebuilds them; None
    when some env lacks some column."""
    cdef Py_ssize_t i, n = mask.shape[1], k = len(cols), c
    cdef list keys = [], kinds = [], out = []
    cdef cnp.uint8_t[16] ints, how  # how: 0 the stored int/float itself, 1 bool, 2 kind(value)
    cdef dict d
    _check_table(info_i, info_f, mask, slot, k)
    if not _table_full(mask, slot, k):
        return None
    for c in range(k):
        key, _mask_key, is_int, _dtype, kind = cols[c]
        keys.append(key)
        kinds.append(kind)
        ints[c] = 1 if is_int else 0
        how[c] = 0 if (kind is int if is_int else kind is float) else (1 if kind is bool else 2)
    for i in range(n):
        d = {}
        for c in range(k):
            if ints[c]:  # two branches: one C expression would make both a double
                value = info_i[slot, i, c]
            else:
                value = info_f[slot, i, c]
            if how[c] == 1:
                value = value != 0
            elif how[c] == 2:
                value = kinds[c](value)
            d[keys[c]] = value
        out.append(d)
    return out


# ---------------------------------------------------------------------------
# Action bounds: one typed pass over a batch, no temporaries. The Python side
# (fastvec.actions) checks dtype and shape first and, when this says no, finds the
# offending env and words the error.
# ---------------------------------------------------------------------------
ctypedef fused action_t:
    float
    double
    cnp.int64_t
    cnp.int32_t
    cnp.int16_t
    cnp.int8_t
    cnp.uint8_t


@cython.boundscheck(False)
@cython.wraparound(False)
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
