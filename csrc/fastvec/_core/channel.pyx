# cython: language_level=3
"""The control channel between the parent and one worker: socket framing and doorbells.

Framing: fixed 16-byte headers (four int32: code, slot, argument, payload length) on a
socketpair per worker, optionally followed by a pickled payload (protocol.pxd).

Doorbells: the hot commands and their replies go through a control block in shared
memory; the socket only wakes a side that went to sleep (see the section below).
"""
cimport numpy as cnp
from cpython.exc cimport PyErr_CheckSignals
from libc.errno cimport ECONNRESET, EINTR, EPIPE, errno
from posix.unistd cimport read, write

from fastvec._core.protocol cimport (
    CMD_STEP, CTL_COLS, HAS_PAYLOAD, HEADER_BYTES, IN_TABLE, MAX_PAYLOAD, NO_PAYLOAD, REPLY_DONE, REPLY_ERROR,
    REPLY_RESULT, WAKE,
)

import numpy as np

cnp.import_array()

cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    enum:
        POLLIN

cdef extern from "<sys/socket.h>" nogil:
    ssize_t recv(int fd, void *buf, size_t n, int flags)
    enum:
        MSG_DONTWAIT
cdef extern from "<errno.h>":
    enum:
        EAGAIN  # == EWOULDBLOCK on Linux and macOS


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
        if hdr[0] != WAKE:
            break
    if hdr[0] not in (REPLY_DONE, REPLY_RESULT, REPLY_ERROR):
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

# Columns of a worker's control-block row: a parent-written cache line, then a
# worker-written one.
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


cdef int _read_header_skip_wake(int fd, int *hdr) except -1:
    while True:
        _read_all(fd, <char *>hdr, HEADER_BYTES)
        if hdr[0] != WAKE:
            return 0


cdef int _send_wake(int fd) except -1:
    cdef int hdr[4]
    hdr[0] = WAKE
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
        if arr.dtype != np.int64 or arr.ndim != 2 or arr.shape[1] != CTL_COLS or not arr.flags.c_contiguous:
            raise ValueError("control block must be a C-contiguous int64 [n + 1, 16] array")
        self.ctl_array = arr
        self.ctl = <long long *>cnp.PyArray_DATA(arr)
        self.n = fds.shape[0]
        self.fds = fds
        self.spin_ns = <long long>(spin_us * 1000.0)
        self.expected = np.zeros(self.n, dtype=np.int64)
        self.stash = [None] * self.n

    cdef inline long long *row(self, int w) noexcept nogil:
        return self.ctl + w * CTL_COLS

    def issue(self, int w, int cmd, int slot=0, bytes payload=None):
        """Send one command to worker w (payload first, then the doorbell)."""
        cdef long long *r = self.row(w)
        if payload is not None:
            send_header(self.fds[w], cmd, slot, 0, payload)
        r[C_CMD] = cmd
        r[C_SLOT] = slot
        r[C_ARG] = NO_PAYLOAD if payload is None else HAS_PAYLOAD
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
            r[C_ARG] = NO_PAYLOAD
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
                    if hdr[0] == WAKE:
                        continue
                    # A reply payload written ahead of its doorbell: keep it.
                    if self.stash[w] is not None or hdr[0] not in (REPLY_DONE, REPLY_RESULT, REPLY_ERROR) \
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
            if r[C_REPLY] != REPLY_DONE or r[C_REPLY_SLOT] != slot or r[C_REPLY_ARG] & ~IN_TABLE:
                return -1
            if r[C_REPLY_ARG] & IN_TABLE:
                n_table += 1
        return n_table

    def reply(self, int w):
        """The reply of worker w to its last command: (code, slot, arg, payload or None)."""
        cdef long long *r = self.row(w)
        cdef int hdr[4]
        cdef int code = <int>r[C_REPLY]
        cdef int arg = <int>r[C_REPLY_ARG]
        payload = None
        if arg & ~(HAS_PAYLOAD | IN_TABLE):
            self.stash[w] = None
            raise ValueError(f"malformed control message: reply flags {arg}")
        if arg & HAS_PAYLOAD:
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
    """A worker's side of the doorbells (attributes in channel.pxd)."""

    def __init__(self, object ctl_array, int w, int fd, double spin_us):
        cdef cnp.ndarray arr = ctl_array
        self.ctl_array = arr
        self.base = <long long *>cnp.PyArray_DATA(arr)
        self.n_rows = <int>arr.shape[0] - 1
        self.ctl = self.base + w * CTL_COLS
        self.main_row = <long long *>cnp.PyArray_DATA(arr) + (arr.shape[0] - 1) * CTL_COLS
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
            if hdr[0] != WAKE:
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

    cdef int _step_slot(self) noexcept:
        """The slot of the command last waited for if it is a step, else -1."""
        return <int>self.ctl[C_SLOT] if self.ctl[C_CMD] == CMD_STEP else -1

    def current_command(self):
        """The command last waited for, with its payload read off the socket."""
        cdef int hdr[4]
        cdef long long *r = self.ctl
        cmd, slot, arg = <int>r[C_CMD], <int>r[C_SLOT], <int>r[C_ARG]
        payload = None
        if arg == HAS_PAYLOAD:
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

    cdef int _publish(self, int code, int slot, int flags) except -1:
        cdef long long *r = self.ctl
        r[C_REPLY] = code
        r[C_REPLY_SLOT] = slot
        r[C_REPLY_ARG] = flags
        fv_store(&r[C_DONE_SEQ], self.seen)
        if fv_load(self.main_row) and self._waited_all_done():
            _send_wake(self.fd)
        return 0

    cdef bint _waited_all_done(self) noexcept nogil:
        # Whether this worker is the last one the parent waits for (ties: both wake it).
        cdef int k
        cdef long long *rr
        for k in range(self.n_rows):
            rr = self.base + k * CTL_COLS
            if fv_load(&rr[C_WAITED]) and fv_load(&rr[C_DONE_SEQ]) != fv_load(&rr[C_CMD_SEQ]):
                return False
        return True

    def reply(self, int code, int slot=0, bytes payload=None):
        """Answer the current command (payload first, then the doorbell)."""
        if payload is not None:
            send_header(self.fd, code, slot, 0, payload)
            self._publish(code, slot, HAS_PAYLOAD)
        else:
            self._publish(code, slot, NO_PAYLOAD)
