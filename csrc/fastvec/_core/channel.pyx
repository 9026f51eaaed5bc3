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
# of one per worker: on a 2-core VM each costs ~40 us of a core the envs need. A wait
# for *any* of them (``wait_any``: batches of the first workers to finish) sets
# ``main_any``; then the first marked worker to finish rings.
#
# Control block: int64[num_workers + 1, 16]; per worker one cache line written by the
# parent [cmd_seq, cmd, slot, arg, waited, issued_ns] and one written by the worker
# [done_seq, reply, reply_slot, reply_arg, sleeping, published_ns]; the last row holds
# main_sleeping and main_any. The two clock readings (CLOCK_MONOTONIC, the same in every process)
# let each side time the other without its own wake-up in the measurement.
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
    #include <poll.h>
    #ifdef __linux__
    #include <sys/prctl.h>
    #endif
    /* poll with a timeout in nanoseconds (ppoll where there is one; else whole ms). */
    static inline int fv_poll_ns(struct pollfd *fds, unsigned long n, long long timeout_ns) {
    #ifdef __linux__
        struct timespec ts;
        ts.tv_sec = (time_t)(timeout_ns / 1000000000LL);
        ts.tv_nsec = (long)(timeout_ns % 1000000000LL);
        return ppoll(fds, (nfds_t)n, &ts, NULL);
    #else
        return poll(fds, (nfds_t)n, (int)(timeout_ns / 1000000LL));
    #endif
    }
    /* Timed naps of this thread end within ~1 us of when asked (Linux's default slack is 50 us). */
    static inline void fv_precise_timers(void) {
    #ifdef __linux__
        prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    #endif
    }
    """
    long long fv_load(long long *p) nogil
    void fv_store(long long *p, long long v) nogil
    void fv_relax() nogil
    long long fv_now_ns() nogil
    int sched_yield() nogil
    int fv_poll_ns(pollfd *fds, unsigned long n, long long timeout_ns) nogil
    void fv_precise_timers() nogil


# ---------------------------------------------------------------------------
# Waits that learn the loop (the default; a fixed ``spin_us``/``main_spin_us`` overrides).
#
# A side that sleeps on its socket pays a wake-up when the message comes: on this kind
# of VM a halted virtual CPU takes ~40 us to wake (measured: a socket round trip is
# 25 us between busy processes, 55 us after the receiver idled 1 ms), and a step pays
# two of them (parent -> workers, last worker -> parent). A side that spins instead
# burns a core that the caller's policy (torch) or another worker needs.
#
# So each side forecasts when its message will come from how long it took the last
# times: a worker, the parent's gap between its reply and the next command (the
# caller's policy, the other workers' step, a learner update); the parent, the workers'
# step time. It naps on its socket (with its "sleeping" flag set, so a message that
# comes early still wakes it) until shortly before the forecast, spins through a window
# around it, and only then sleeps for good. One forecast per side, so a learner's long
# pause is an outlier: it ends one window of spinning, it does not teach the side to wait
# long. How late a nap returns is learned too and taken off the next one.
#
# A wait forecast to end within SPIN_THROUGH_NS is not napped at all: the side spins
# from the start. Measured here (2 vCPUs, 2 workers; benchmarks/results/ab/spin_through):
# a nap's wake-up came late often enough that spinning through short gaps stepped
# HalfCheetah x8 1.97x SyncVectorEnv after a caller's 1 ms of work against 1.63x with
# naps, and the whole iteration, the caller's work included, was faster too (1.31x
# against 1.17x): the spin yields the core at every turn, so the caller runs first.
# ---------------------------------------------------------------------------
# Before anything is learned: spin as the fixed defaults do.
cdef double FIRST_MAIN_SPIN_US = 20.0
cdef double FIRST_WORKER_SPIN_US = 200.0

cdef long long MAIN_NAP_MARGIN_NS = 10000    # the parent wakes this much before its forecast ...
cdef long long MAIN_WINDOW_LO_NS = 20000     # ... and spins at least this long past it ...
cdef long long MAIN_WINDOW_HI_NS = 300000    # ... and at most this long
cdef long long WORKER_NAP_MARGIN_NS = 20000  # the same for a worker waiting for the next command
cdef long long WORKER_WINDOW_LO_NS = 100000
cdef long long WORKER_WINDOW_HI_NS = 1000000
cdef long long MIN_NAP_NS = 40000            # shorter naps cost more than they save: spin instead
cdef long long SPIN_THROUGH_NS = 3000000     # waits forecast this short are spun through, no nap
# A side that sleeps "for good" still looks at the flags this often: should a wake-up
# ever be lost, the wait ends this late instead of never, and is counted (``lost``).
cdef long long RECHECK_NS = 100000000
cdef long long LATE_RING_NS = 10000000  # a ring this late after the flag is a race, not lost

cdef enum:
    NAP_LATE0_NS = 60000        # first guess of how late a nap returns
    MAX_FORECAST_NS = 1000000000  # waits longer than 1 s are not forecast: plain sleep
    OUTLIER_NS = 2000000        # a wait this much above 4x the forecast is an outlier ...
    OUTLIERS_TO_RELEARN = 3     # ... unless it happens this many times in a row


cdef inline void fc_init(Forecast *f) noexcept nogil:
    f.expect = 0
    f.dev = 0
    f.late = NAP_LATE0_NS
    f.outliers = 0


cdef inline void fc_observe(Forecast *f, long long waited) noexcept nogil:
    """Learn from one wait of ``waited`` ns (an exponential average over ~8 waits)."""
    if waited <= 0 or waited > MAX_FORECAST_NS:
        return
    cdef long long d
    if f.expect == 0:
        f.expect = waited
        return
    if waited > 4 * f.expect + OUTLIER_NS:
        f.outliers += 1
        if f.outliers < OUTLIERS_TO_RELEARN:
            return
        f.expect = waited
        f.outliers = 0
        return
    f.outliers = 0
    d = waited - f.expect
    f.expect += d // 8
    f.dev += ((d if d >= 0 else -d) - f.dev) // 8


cdef inline void fc_nap_returned(Forecast *f, long long late) noexcept nogil:
    if late < 0:
        late = 0
    elif late > 500000:
        late = 500000
    f.late += (late - f.late) // 8


cdef inline long long fc_window(Forecast *f, long long lo, long long hi) noexcept nogil:
    """How long past the forecast to keep spinning: twice its usual error, within [lo, hi]."""
    cdef long long w = 2 * f.dev
    return lo if w < lo else (hi if w > hi else w)


cdef inline long long fc_nap_end(Forecast *f, long long target, long long margin) noexcept nogil:
    """When a nap towards ``target`` should end: early by how late naps return, the
    margin and twice the forecast's usual error; never for a short forecast (it is spun
    through)."""
    if f.expect + 2 * f.dev <= SPIN_THROUGH_NS:
        return 0
    return target - f.late - margin - 2 * f.dev

# Columns of a worker's control-block row: a parent-written cache line, then a
# worker-written one.
cdef enum:  # the last row's
    M_SLEEPING = 0
    M_ANY = 1

cdef enum:
    C_CMD_SEQ = 0
    C_CMD = 1
    C_SLOT = 2
    C_ARG = 3
    C_WAITED = 4
    C_ISSUED_NS = 5
    C_LOST = 7     # a worker's waits that found its command without the doorbell ringing (rare: in the parent's line)
    C_DONE_SEQ = 8
    C_REPLY = 9
    C_REPLY_SLOT = 10
    C_REPLY_ARG = 11
    C_SLEEPING = 12
    C_PUBLISHED_NS = 13
    C_NAPS = 14    # how many waits this worker napped in (diagnostics: Engine.wait_counts)
    C_SLEEPS = 15  # ... and slept in until the parent's doorbell


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
    """The parent's side of the doorbells: issue commands, wait for replies.

    ``spin_us`` < 0: waits for a step's replies learn the workers' step time (see
    "Waits that learn the loop"); otherwise every wait spins ``spin_us`` then sleeps.
    """
    cdef long long *ctl
    cdef object ctl_array
    cdef int n
    cdef int[::1] fds
    cdef long long spin_ns
    cdef long long[::1] expected
    cdef list stash
    cdef bint adaptive
    cdef Forecast fc
    cdef long long t_issue  # when the step being waited for was issued (0: not a step)
    # How many waits for replies napped, and slept until a worker rang (diagnostics);
    # ``lost``: sleeps that found every reply in without the doorbell (see RECHECK_NS).
    cdef public long long naps, sleeps, lost

    def __init__(self, object ctl_array, int[::1] fds, double spin_us):
        cdef cnp.ndarray arr = ctl_array
        if arr.dtype != np.int64 or arr.ndim != 2 or arr.shape[1] != CTL_COLS or not arr.flags.c_contiguous:
            raise ValueError("control block must be a C-contiguous int64 [n + 1, 16] array")
        self.ctl_array = arr
        self.ctl = <long long *>cnp.PyArray_DATA(arr)
        self.n = fds.shape[0]
        self.fds = fds
        self.adaptive = spin_us < 0
        self.spin_ns = <long long>(FIRST_MAIN_SPIN_US * 1000.0 if self.adaptive else spin_us * 1000.0)
        self.expected = np.zeros(self.n, dtype=np.int64)
        self.stash = [None] * self.n
        fc_init(&self.fc)
        self.t_issue = 0
        self.naps = self.sleeps = self.lost = 0

    def worker_waits(self, int w):
        """``(naps, sleeps, lost)``: how many of worker w's waits for a command napped,
        and slept until the parent's doorbell (the rest were spun through); ``lost``:
        sleeps that found the command in without the doorbell (see RECHECK_NS)."""
        cdef long long *r = self.row(w)
        return int(fv_load(&r[C_NAPS])), int(fv_load(&r[C_SLEEPS])), int(fv_load(&r[C_LOST]))

    @property
    def forecast_us(self):
        """The workers' expected step time in microseconds (0: not learned, or fixed spins)."""
        return self.fc.expect / 1000.0 if self.adaptive else 0.0

    cdef inline long long *row(self, int w) noexcept nogil:
        return self.ctl + w * CTL_COLS

    def issue(self, int w, int cmd, int slot=0, bytes payload=None):
        """Send one command to worker w (payload first, then the doorbell)."""
        cdef long long *r = self.row(w)
        self.t_issue = 0
        if payload is not None:
            send_header(self.fds[w], cmd, slot, 0, payload)
        r[C_ISSUED_NS] = fv_now_ns()
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
        cdef long long now = fv_now_ns()
        self.t_issue = now if cmd == CMD_STEP else 0
        for w in range(self.n):
            r = self.row(w)
            r[C_ISSUED_NS] = now
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

    cdef bint _pending(self, int[::1] workers) noexcept nogil:
        cdef Py_ssize_t k
        for k in range(workers.shape[0]):
            if not self._done(workers[k]):
                return True
        return False

    cdef bint _spin(self, int[::1] workers, long long until, long long deadline) noexcept nogil:
        """Spin until every worker answered (False) or ``until``/``deadline`` (True)."""
        cdef long long now
        while self._pending(workers):
            now = fv_now_ns()
            if now >= until or (deadline >= 0 and now >= deadline):
                return True
            fv_relax()
            sched_yield()
        return False

    cdef tuple _sleep(self, int[::1] workers, long long deadline, long long nap_until, bint any_done=False):
        """Sleep on the sockets of the workers still busy until one of them writes or
        ``deadline`` (< 0: none) passes, and read what came. ``nap_until`` >= 0: return
        by then at the latest. Returns None while workers are busy (the caller decides
        what next), else ``wait``'s answer; ``any_done``: ``(0, -1)`` as soon as one
        worker is done."""
        cdef Py_ssize_t m = workers.shape[0], k
        cdef int w, r, pending
        cdef long long now, timeout_ns, until
        cdef bint recheck
        cdef long long *main_sleeping = self.row(self.n)
        cdef int hdr[4]
        cdef pollfd *pfds
        pfd_bytes = bytearray(m * sizeof(pollfd))
        pfds = <pollfd *><char *>pfd_bytes
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
        if pending == 0 or (any_done and pending < m):
            fv_store(main_sleeping, 0)
            return 0, -1
        now = fv_now_ns()
        until = deadline
        if nap_until >= 0 and (until < 0 or nap_until < until):
            until = nap_until
        recheck = nap_until < 0 and (until < 0 or now + RECHECK_NS < until)
        if recheck:
            until = now + RECHECK_NS
        if deadline >= 0 and now >= deadline:
            fv_store(main_sleeping, 0)
            for k in range(m):
                if not self._done(workers[k]):
                    return 1, workers[k]
        timeout_ns = -1 if until < 0 else (until - now if until > now else 0)
        with nogil:
            if timeout_ns < 0:
                r = poll(pfds, m, -1)
            else:
                r = fv_poll_ns(pfds, m, timeout_ns)
        fv_store(main_sleeping, 0)
        if r == 0 and nap_until >= 0 and until == nap_until:
            fc_nap_returned(&self.fc, fv_now_ns() - nap_until)
        if r == 0 and recheck and (self._any_done(workers) if any_done else not self._pending(workers)):
            with nogil:  # a ring on its way (the worker was between its flag and its write)?
                r = fv_poll_ns(pfds, m, LATE_RING_NS)
            if r == 0:
                self.lost += 1  # the ring that should have ended this sleep never came
        if r < 0:
            if errno == EINTR:
                PyErr_CheckSignals()
                return None
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
        return None

    def wait(self, int[::1] workers, double timeout):
        """Wait until every worker in ``workers`` has answered its last command.

        Returns ``(0, -1)`` when all did, ``(1, w)`` on timeout (w silent), ``(2, w)``
        when w's socket closed (it died) and ``(3, w)`` when w sent garbage.
        ``timeout`` < 0 waits forever.
        """
        cdef long long t0 = fv_now_ns(), now, target, nap_until
        cdef long long deadline = t0 + <long long>(timeout * 1e9) if timeout >= 0 else -1
        cdef long long t_issue = self.t_issue
        cdef bint forecast = self.adaptive and t_issue > 0 and self.fc.expect > 0
        cdef int w
        cdef bint busy
        self.t_issue = 0  # a later wait (the rest of a failed step) is not forecast
        for w in range(self.n):
            fv_store(&self.row(w)[C_WAITED], 0)
        for w in range(workers.shape[0]):
            fv_store(&self.row(workers[w])[C_WAITED], 1)
        if not forecast:
            with nogil:
                busy = self._spin(workers, t0 + self.spin_ns, deadline)
        else:
            # Nap until just before the workers should be done, then spin through a
            # window around that; the last worker still rings if it is done early.
            target = t_issue + self.fc.expect
            nap_until = fc_nap_end(&self.fc, target, MAIN_NAP_MARGIN_NS)
            busy = True
            if nap_until - t0 > MIN_NAP_NS:
                self.naps += 1
                # (a spare WAKE ends a nap early while workers are busy: nap on)
                while fv_now_ns() < nap_until and self._pending(workers):
                    res = self._sleep(workers, deadline, nap_until)
                    if res is not None:
                        if res[0] == 0:
                            self._learn(workers, t_issue)
                        return res
            with nogil:
                now = fv_now_ns()
                busy = self._spin(workers, (target if target > now else now) + fc_window(&self.fc, MAIN_WINDOW_LO_NS,
                                                                                     MAIN_WINDOW_HI_NS), deadline)
        if busy:
            self.sleeps += 1
        while busy:
            res = self._sleep(workers, deadline, -1)
            if res is not None:
                if res[0] == 0 and self.adaptive and t_issue > 0:
                    self._learn(workers, t_issue)
                return res
        if self.adaptive and t_issue > 0:
            self._learn(workers, t_issue)
        return 0, -1

    def wait_any(self, int[::1] workers, double timeout):
        """Wait until at least one worker in ``workers`` has answered its last command
        (``is_done`` tells which). Returns ``wait``'s answers: ``(0, -1)`` when one did,
        ``(1, w)`` on timeout, ``(2, w)`` when w died, ``(3, w)`` when w sent garbage.
        Spins ``spin_us`` (or the first spin of learned waits), then sleeps until the
        first marked worker rings; nothing is learned (batches come in any order)."""
        cdef long long t0 = fv_now_ns()
        cdef long long deadline = t0 + <long long>(timeout * 1e9) if timeout >= 0 else -1
        cdef long long *main = self.row(self.n)
        cdef long long until = t0 + self.spin_ns
        cdef long long now
        cdef int w
        cdef bint none_done = True
        for w in range(self.n):
            fv_store(&self.row(w)[C_WAITED], 0)
        for w in range(workers.shape[0]):
            fv_store(&self.row(workers[w])[C_WAITED], 1)
        with nogil:
            while True:
                if self._any_done(workers):
                    none_done = False
                    break
                now = fv_now_ns()
                if now >= until or (deadline >= 0 and now >= deadline):
                    break
                fv_relax()
                sched_yield()
        if not none_done:
            return 0, -1
        fv_store(&main[M_ANY], 1)
        self.sleeps += 1
        try:
            while not self._any_done(workers):
                res = self._sleep(workers, deadline, -1, True)
                if res is not None:
                    return res
        finally:
            fv_store(&main[M_ANY], 0)
        return 0, -1

    cdef bint _any_done(self, int[::1] workers) noexcept nogil:
        cdef Py_ssize_t k
        for k in range(workers.shape[0]):
            if self._done(workers[k]):
                return True
        return False

    cdef void _learn(self, int[::1] workers, long long t_issue) noexcept:
        """A step issued at ``t_issue`` is done: learn when its last worker published."""
        cdef long long last = 0, t
        cdef Py_ssize_t k
        for k in range(workers.shape[0]):
            t = fv_load(&self.row(workers[k])[C_PUBLISHED_NS])
            if t > last:
                last = t
        fc_observe(&self.fc, last - t_issue)

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
        self.adaptive = spin_us < 0
        self.spin_ns = <long long>(FIRST_WORKER_SPIN_US * 1000.0 if self.adaptive else spin_us * 1000.0)
        self.seen = fv_load(&self.ctl[C_CMD_SEQ])
        self.stash = None
        fc_init(&self.fc)
        self.t_pub = 0
        self.ctl[C_NAPS] = 0
        self.ctl[C_SLEEPS] = 0
        self.ctl[C_LOST] = 0
        if self.adaptive:
            fv_precise_timers()  # this is the worker's own process
            self.fc.late = 0

    @property
    def forecast_us(self):
        """The expected gap until the next command in microseconds (0: none learned)."""
        return self.fc.expect / 1000.0 if self.adaptive else 0.0

    cdef int _take_header(self) except -1:
        """Read the header waiting on the socket: a WAKE, or a command's payload sent
        just before its doorbell (kept for ``current_command``)."""
        cdef long long *r = self.ctl
        cdef long long give_up
        cdef int hdr[4]
        _read_all(self.fd, <char *>hdr, HEADER_BYTES)  # PeerClosed when the parent is gone
        if hdr[0] == WAKE:
            return 0
        self.stash = ((hdr[0], hdr[1], hdr[2], hdr[3]), recv_payload(self.fd, hdr[3]))
        give_up = fv_now_ns() + 5000000000
        while fv_load(&r[C_CMD_SEQ]) == self.seen:
            if fv_now_ns() > give_up:
                raise ValueError(f"malformed control message: header {self.stash[0]} without a doorbell")
            sched_yield()
        return 0

    cdef int _nap(self, long long until) except -1:
        """Sleep on the socket until ``until`` or the next command, whichever comes
        first (a spare WAKE left by an earlier race is read and the nap goes on)."""
        cdef long long *r = self.ctl
        cdef pollfd p
        cdef int got
        cdef long long now = fv_now_ns()
        if now < until:
            fv_store(&r[C_NAPS], r[C_NAPS] + 1)
        while now < until:
            fv_store(&r[C_SLEEPING], 1)
            if fv_load(&r[C_CMD_SEQ]) != self.seen:
                fv_store(&r[C_SLEEPING], 0)
                return 0
            p.fd = self.fd
            p.events = POLLIN
            p.revents = 0
            with nogil:
                got = fv_poll_ns(&p, 1, until - now)
            fv_store(&r[C_SLEEPING], 0)
            if got == 0:
                fc_nap_returned(&self.fc, fv_now_ns() - until)
                return 0
            if got > 0:
                self._take_header()
                if fv_load(&r[C_CMD_SEQ]) != self.seen:
                    return 0
            elif errno == EINTR:
                PyErr_CheckSignals()
            now = fv_now_ns()
        return 0

    cdef int _wait(self) except -1:
        """Block until the command sequence number moves past ``seen``."""
        cdef long long *r = self.ctl
        cdef long long now = fv_now_ns(), target, nap_until
        cdef long long spin_end = now + self.spin_ns
        cdef pollfd p
        cdef int ready
        cdef bint got = fv_load(&r[C_CMD_SEQ]) != self.seen
        if not got and self.adaptive and self.fc.expect > 0 and self.t_pub > 0:
            # Nap until shortly before the parent's next command should come, then
            # spin through a window around it.
            target = self.t_pub + self.fc.expect
            nap_until = fc_nap_end(&self.fc, target, WORKER_NAP_MARGIN_NS)
            if nap_until - now > MIN_NAP_NS:
                self._nap(nap_until)
                now = fv_now_ns()
            spin_end = (target if target > now else now) + fc_window(&self.fc, WORKER_WINDOW_LO_NS,
                                                                     WORKER_WINDOW_HI_NS)
        with nogil:
            while True:
                if fv_load(&r[C_CMD_SEQ]) != self.seen:
                    got = True
                    break
                if fv_now_ns() >= spin_end:
                    break
                fv_relax()
                sched_yield()
        if not got:
            fv_store(&r[C_SLEEPS], r[C_SLEEPS] + 1)
        while not got:
            fv_store(&r[C_SLEEPING], 1)
            if fv_load(&r[C_CMD_SEQ]) != self.seen:
                fv_store(&r[C_SLEEPING], 0)
                break
            p.fd = self.fd
            p.events = POLLIN
            p.revents = 0
            with nogil:
                ready = fv_poll_ns(&p, 1, RECHECK_NS)
            if ready > 0:
                self._take_header()
            elif ready < 0 and errno == EINTR:
                PyErr_CheckSignals()
            fv_store(&r[C_SLEEPING], 0)
            if fv_load(&r[C_CMD_SEQ]) != self.seen:
                if ready == 0:  # a doorbell on its way (the parent between its flag and its write)?
                    with nogil:
                        ready = fv_poll_ns(&p, 1, LATE_RING_NS)
                    if ready > 0:
                        self._take_header()
                    else:  # it never came
                        fv_store(&r[C_LOST], r[C_LOST] + 1)
                break
        self.seen = fv_load(&r[C_CMD_SEQ])
        if self.adaptive and self.t_pub > 0:
            # The gap the caller left: from our reply to its command (its clock reading,
            # so our own wake-up is not in it).
            fc_observe(&self.fc, r[C_ISSUED_NS] - self.t_pub)
        return 0

    cdef int _step_slot(self) noexcept:
        """The slot of the command last waited for if it is a plain step, else -1 (a
        step whose actions travel pickled has a payload: the Python loop takes it)."""
        return <int>self.ctl[C_SLOT] if self.ctl[C_CMD] == CMD_STEP and self.ctl[C_ARG] == NO_PAYLOAD else -1

    def wait_command(self):
        """Wait for the next command as the step loop does (``_wait``), then return it
        as ``current_command`` does (the tests drive one side of the doorbells alone)."""
        self._wait()
        return self.current_command()

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
        self.t_pub = fv_now_ns()
        r[C_PUBLISHED_NS] = self.t_pub
        fv_store(&r[C_DONE_SEQ], self.seen)
        if fv_load(&self.main_row[M_SLEEPING]) and (
                (fv_load(&self.main_row[M_ANY]) and fv_load(&r[C_WAITED])) or self._waited_all_done()):
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
