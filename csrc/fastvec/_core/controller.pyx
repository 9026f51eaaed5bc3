# cython: language_level=3
"""The parent's side of the doorbells: issue commands, wait for replies.

Doorbells: the hot commands and their replies go through the control block in shared
memory (its columns in protocol.pxd); the socket only wakes a side that went to sleep.
A socket wake-up costs ~25 us one way on a small VM, a step of 8 cheap envs about twice
that, so the receiver of a message first spins (with a CPU pause and sched_yield, so a
busy core is handed over) on a sequence number, and only then declares itself asleep
and blocks on its socket. The sender bumps the sequence number and sends a 16-byte WAKE
header only if the receiver said it sleeps. Both sides store-then-load with sequentially
consistent atomics (Dekker), so no wake-up is lost; a spare WAKE header is skipped by
the reader. Payloads (pickled infos, errors, call results, commands with arguments)
still travel on the socket, written *before* the sequence number is published.

Only the *last* worker the parent waits for rings it: the parent marks the workers it
waits on (``C_WAITED``) before it sleeps, and a worker that finishes while the parent
sleeps rings only if every marked worker is done: one wake-up per step instead of one
per worker (on a 2-core VM each costs ~40 us of a core the envs need). A wait for *any*
of them (``wait_any``: batches of the first workers to finish) sets ``M_ANY``; then the
first marked worker to finish rings.

How long each side spins and naps is learned (forecast.pxd) unless ``spin_us`` fixes it.
"""
cimport numpy as cnp
from cpython.exc cimport PyErr_CheckSignals
from libc.errno cimport EINTR, errno

from fastvec._core.forecast cimport Forecast, fc_init, fc_long, fc_nap_end, fc_nap_returned, fc_observe, fc_window
from fastvec._core.framing cimport read_bounded, read_payload_bounded, recv_message, send_wake
from fastvec._core.protocol cimport (
    C_ARG, C_CMD, C_CMD_SEQ, C_DONE_SEQ, C_ISSUED_NS, C_LONG, C_LOST, C_NAPS, C_PUBLISHED_NS, C_REPLY, C_REPLY_ARG,
    C_REPLY_SLOT, C_SLEEPING, C_SLEEPS, C_SLOT, C_WAITED, CMD_STEP, CTL_COLS, HAS_PAYLOAD, HEADER_BYTES, IN_TABLE,
    M_ANY, M_SLEEPING, NO_PAYLOAD, REPLY_DONE, WAIT_DIED, WAIT_DONE, WAIT_GARBLED, WAIT_TIMEOUT, WAKE,
)
from fastvec._core.sync cimport (
    POLLIN, fv_load, fv_now_ns, fv_poll_ns, fv_relax, fv_store, poll, pollfd, sched_yield,
)
from fastvec._core.tuning cimport (
    FIRST_MAIN_SPIN_NS, LATE_RING_NS, MAIN_NAP_MARGIN_NS, MAIN_WINDOW_HI_NS, MAIN_WINDOW_LO_NS, MIN_NAP_NS,
    RECHECK_NS, SPIN_THROUGH_NS, WINDOW_DEVS,
)

import numpy as np

from fastvec._core.framing import PeerClosed, send_header

cnp.import_array()

# What a wait returns when every worker it waited for answered: one object, built once
# (a step's hot path allocates no tuple for it).
cdef tuple ALL_DONE = (WAIT_DONE, -1)


class DoorbellError(OSError):
    """A worker's doorbell could not be rung (its socket is gone)."""


# The forecast's rule in numbers, for the tests: a wait forecast to end within
# ``spin_through_ns`` (forecast + ``window_devs`` x its error) is spun through, no nap.
FORECAST_RULE = {"spin_through_ns": SPIN_THROUGH_NS, "window_devs": WINDOW_DEVS}


def forecast_of(waits_ns):
    """The forecast (forecast.pxd) a side holds after waits of ``waits_ns`` nanoseconds,
    learned in order: ``(expect_ns, dev_ns, long)``, ``long`` whether its next wait is
    forecast past the spin-through (napped towards) or spun through from the start. The
    tests check the rule on known waits with it; what the engine's own waits chose is
    counted in ``Engine.wait_counts``."""
    cdef Forecast f
    fc_init(&f)
    for w in waits_ns:
        fc_observe(&f, <long long>w)
    return int(f.expect), int(f.dev), bool(fc_long(&f))


cdef class Controller:
    """The parent's side of the doorbells: issue commands, wait for replies.

    ``spin_us`` < 0: waits for a step's replies learn the workers' step time
    (forecast.pxd); otherwise every wait spins ``spin_us`` then sleeps.
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
    # ``lost``: sleeps that found every reply in without the doorbell (see RECHECK_NS);
    # ``longs``: waits forecast past SPIN_THROUGH_NS (fc_long), the only ones that may nap.
    cdef public long long naps, sleeps, lost, longs

    def __init__(self, object ctl_array, int[::1] fds, double spin_us):
        cdef cnp.ndarray arr = ctl_array
        if arr.dtype != np.int64 or arr.ndim != 2 or arr.shape[1] != CTL_COLS or not arr.flags.c_contiguous:
            raise ValueError("control block must be a C-contiguous int64 [n + 1, 16] array")
        self.ctl_array = arr
        self.ctl = <long long *>cnp.PyArray_DATA(arr)
        self.n = fds.shape[0]
        self.fds = fds
        self.adaptive = spin_us < 0
        self.spin_ns = FIRST_MAIN_SPIN_NS if self.adaptive else <long long>(spin_us * 1000.0)
        self.expected = np.zeros(self.n, dtype=np.int64)
        self.stash = [None] * self.n
        fc_init(&self.fc)
        self.t_issue = 0
        self.naps = self.sleeps = self.lost = self.longs = 0

    def worker_waits(self, int w):
        """``(naps, sleeps, lost, long)``: how many of worker w's waits for a command
        napped, and slept until the parent's doorbell (the rest were spun through);
        ``lost``: sleeps that found the command in without the doorbell (see
        RECHECK_NS); ``long``: waits forecast past SPIN_THROUGH_NS (only they may nap)."""
        cdef long long *r = self.row(w)
        return (int(fv_load(&r[C_NAPS])), int(fv_load(&r[C_SLEEPS])), int(fv_load(&r[C_LOST])),
                int(fv_load(&r[C_LONG])))

    @property
    def forecast_us(self):
        """The workers' expected step time in microseconds (0: not learned, or fixed spins)."""
        return self.fc.expect / 1000.0 if self.adaptive else 0.0

    cdef inline long long *row(self, int w) noexcept nogil:
        return self.ctl + w * CTL_COLS

    # ------------------------------------------------------------------ issuing
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
            send_wake(self.fds[w])

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
                    send_wake(self.fds[w])
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

    # ------------------------------------------------------------------ state
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

    cdef bint _any_done(self, int[::1] workers) noexcept nogil:
        cdef Py_ssize_t k
        for k in range(workers.shape[0]):
            if self._done(workers[k]):
                return True
        return False

    cdef void _mark_waited(self, int[::1] workers) noexcept nogil:
        """The workers this wait is for (the last, or with M_ANY the first, rings)."""
        cdef Py_ssize_t k
        for k in range(self.n):
            fv_store(&self.row(<int>k)[C_WAITED], 0)
        for k in range(workers.shape[0]):
            fv_store(&self.row(workers[k])[C_WAITED], 1)

    # ------------------------------------------------------------------ waiting
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

    cdef int _fill_pollfds(self, int[::1] workers, pollfd *pfds) noexcept nogil:
        """One entry per worker waited for (fd -1 for those done); returns how many are busy."""
        cdef Py_ssize_t k
        cdef int w, pending = 0
        for k in range(workers.shape[0]):
            w = workers[k]
            if self._done(w):
                pfds[k].fd = -1
            else:
                pfds[k].fd = self.fds[w]
                pending += 1
            pfds[k].events = POLLIN
            pfds[k].revents = 0
        return pending

    cdef tuple _sleep(self, int[::1] workers, long long deadline, long long nap_until, bint any_done=False):
        """Sleep on the sockets of the workers still busy until one of them writes or
        ``deadline`` (< 0: none) passes, and read what came. ``nap_until`` >= 0: return
        by then at the latest. Returns None while workers are busy (the caller decides
        what next), else ``wait``'s answer; ``any_done``: ``(WAIT_DONE, -1)`` as soon as
        one worker is done."""
        cdef Py_ssize_t m = workers.shape[0], k
        cdef int r, pending
        cdef long long now, timeout_ns, until
        cdef bint recheck
        cdef long long *main_sleeping = &self.row(self.n)[M_SLEEPING]
        pfd_bytes = bytearray(m * sizeof(pollfd))
        cdef pollfd *pfds = <pollfd *><char *>pfd_bytes
        fv_store(main_sleeping, 1)
        pending = self._fill_pollfds(workers, pfds)
        if pending == 0 or (any_done and pending < m):
            fv_store(main_sleeping, 0)
            return ALL_DONE
        now = fv_now_ns()
        until = deadline
        if nap_until >= 0 and (until < 0 or nap_until < until):
            until = nap_until
        # Asleep for good, still look at the flags every RECHECK_NS (a lost ring).
        recheck = nap_until < 0 and (until < 0 or now + RECHECK_NS < until)
        if recheck:
            until = now + RECHECK_NS
        if deadline >= 0 and now >= deadline:
            fv_store(main_sleeping, 0)
            for k in range(m):
                if not self._done(workers[k]):
                    return WAIT_TIMEOUT, workers[k]
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
        return self._read_woken(workers, pfds)

    cdef tuple _read_woken(self, int[::1] workers, pollfd *pfds):
        """Read the header on each socket that woke the parent: a WAKE, or a reply's
        payload written ahead of its doorbell (kept for ``reply``). None, or the first
        worker that died or sent garbage."""
        cdef Py_ssize_t k
        cdef int w
        cdef int hdr[4]
        for k in range(workers.shape[0]):
            if pfds[k].fd < 0 or pfds[k].revents == 0:
                continue
            w = workers[k]
            try:
                read_bounded(self.fds[w], <char *>hdr, HEADER_BYTES)
                if hdr[0] == WAKE:
                    continue
                if self.stash[w] is not None:
                    return WAIT_GARBLED, w  # a second payload before the first was read
                self.stash[w] = read_payload_bounded(self.fds[w], hdr)
            except PeerClosed:
                if self._done(w) and self.stash[w] is None:
                    continue
                return WAIT_DIED, w
            except ValueError:
                return WAIT_GARBLED, w
        return None

    def wait(self, int[::1] workers, double timeout):
        """Wait until every worker in ``workers`` has answered its last command.

        Returns ``(result, worker)``, ``result`` a ``WaitResult``'s value: ``(DONE, -1)``
        when all did, ``(TIMEOUT, w)`` on timeout (w silent), ``(DIED, w)`` when w's
        socket closed and ``(GARBLED, w)`` when w sent garbage. ``timeout`` < 0 waits
        forever.
        """
        cdef long long t0 = fv_now_ns()
        cdef long long deadline = t0 + <long long>(timeout * 1e9) if timeout >= 0 else -1
        cdef long long t_issue = self.t_issue
        cdef bint busy
        self.t_issue = 0  # a later wait (the rest of a failed step) is not forecast
        self._mark_waited(workers)
        if not (self.adaptive and t_issue > 0 and self.fc.expect > 0):
            with nogil:
                busy = self._spin(workers, t0 + self.spin_ns, deadline)
        else:
            res = self._nap_and_spin(workers, t0, t_issue, deadline)
            if res is not None:
                return res
            busy = True
        if busy:
            self.sleeps += 1
        while busy:
            res = self._sleep(workers, deadline, -1)
            if res is not None:
                if res[0] == WAIT_DONE and self.adaptive and t_issue > 0:
                    self._learn(workers, t_issue)
                return res
        if self.adaptive and t_issue > 0:
            self._learn(workers, t_issue)
        return ALL_DONE

    cdef tuple _nap_and_spin(self, int[::1] workers, long long t0, long long t_issue, long long deadline):
        """A forecast step: nap until just before the workers should be done, then spin
        through a window around that; the last worker still rings if it is done early.
        Returns ``wait``'s answer if the nap ended the wait, ``(DONE, -1)`` if the
        spin did (learned), else None (sleep on)."""
        cdef long long target = t_issue + self.fc.expect
        cdef long long nap_until = fc_nap_end(&self.fc, target, MAIN_NAP_MARGIN_NS)
        cdef long long now
        cdef bint busy
        if fc_long(&self.fc):  # counted: only these may nap (Engine.wait_counts' `long`)
            self.longs += 1
        if nap_until - t0 > MIN_NAP_NS:
            self.naps += 1
            # (a spare WAKE ends a nap early while workers are busy: nap on)
            while fv_now_ns() < nap_until and self._pending(workers):
                res = self._sleep(workers, deadline, nap_until)
                if res is not None:
                    if res[0] == WAIT_DONE:
                        self._learn(workers, t_issue)
                    return res
        with nogil:
            now = fv_now_ns()
            busy = self._spin(workers, (target if target > now else now)
                              + fc_window(&self.fc, MAIN_WINDOW_LO_NS, MAIN_WINDOW_HI_NS), deadline)
        if busy:
            return None
        self._learn(workers, t_issue)
        return ALL_DONE

    def wait_any(self, int[::1] workers, double timeout):
        """Wait until at least one worker in ``workers`` has answered its last command
        (``is_done`` tells which). Returns ``wait``'s answers (``(DONE, -1)`` when one
        did). Spins ``spin_us`` (or the first spin of learned waits), then sleeps until
        the first marked worker rings; nothing is learned (batches come in any order)."""
        cdef long long t0 = fv_now_ns()
        cdef long long deadline = t0 + <long long>(timeout * 1e9) if timeout >= 0 else -1
        cdef long long *main = self.row(self.n)
        cdef long long until = t0 + self.spin_ns
        cdef long long now
        cdef bint none_done = True
        self._mark_waited(workers)
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
            return ALL_DONE
        fv_store(&main[M_ANY], 1)
        self.sleeps += 1
        try:
            while not self._any_done(workers):
                res = self._sleep(workers, deadline, -1, True)
                if res is not None:
                    return res
        finally:
            fv_store(&main[M_ANY], 0)
        return ALL_DONE

    cdef void _learn(self, int[::1] workers, long long t_issue) noexcept:
        """A step issued at ``t_issue`` is done: learn when its last worker published."""
        cdef long long last = 0, t
        cdef Py_ssize_t k
        for k in range(workers.shape[0]):
            t = fv_load(&self.row(workers[k])[C_PUBLISHED_NS])
            if t > last:
                last = t
        fc_observe(&self.fc, last - t_issue)

    # ------------------------------------------------------------------ replies
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
                header, payload = recv_message(self.fds[w])
            if header[0] != code:
                raise ValueError(f"malformed control message: reply {code} but payload header {header}")
        elif self.stash[w] is not None:
            self.stash[w] = None
            raise ValueError("malformed control message: a payload nobody announced")
        return code, <int>r[C_REPLY_SLOT], arg, payload
