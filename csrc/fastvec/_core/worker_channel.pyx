# cython: language_level=3
"""A worker's side of the doorbells (controller.pyx tells how they ring): wait for the
parent's next command (spin, or nap towards the forecast gap, then sleep) and publish
the reply, ringing the parent only if this worker is the last one it waits for."""
cimport numpy as cnp
from cpython.exc cimport PyErr_CheckSignals
from libc.errno cimport EINTR, errno

from fastvec._core.forecast cimport fc_init, fc_long, fc_nap_end, fc_nap_returned, fc_observe, fc_window
from fastvec._core.framing cimport read_all, read_header_skip_wake, send_wake
from fastvec._core.protocol cimport (
    C_ARG, C_CMD, C_CMD_SEQ, C_DONE_SEQ, C_ISSUED_NS, C_LONG, C_LOST, C_NAPS, C_PUBLISHED_NS, C_REPLY, C_REPLY_ARG,
    C_REPLY_SLOT, C_SLEEPING, C_SLEEPS, C_SLOT, C_WAITED, CMD_STEP, CTL_COLS, HAS_PAYLOAD, HEADER_BYTES, M_ANY,
    M_SLEEPING, NO_PAYLOAD, WAKE,
)
from fastvec._core.sync cimport (
    POLLIN, fv_load, fv_now_ns, fv_poll_ns, fv_relax, fv_store, fv_timer_slack, pollfd, sched_yield,
)
from fastvec._core.tuning cimport (
    FIRST_WORKER_SPIN_NS, LATE_RING_NS, MIN_NAP_NS, PAYLOAD_DOORBELL_MS, RECHECK_NS, TIMER_SLACK_NS,
    WORKER_NAP_MARGIN_NS, WORKER_WINDOW_HI_NS, WORKER_WINDOW_LO_NS,
)

from fastvec._core.framing import recv_payload, send_header

cnp.import_array()


cdef class WorkerChannel:
    """A worker's side of the doorbells (attributes in worker_channel.pxd).

    ``spin_us`` < 0: waits for the next command learn the caller's gap between steps
    (forecast.pxd); otherwise every wait spins ``spin_us`` then sleeps.
    """

    def __init__(self, object ctl_array, int w, int fd, double spin_us):
        cdef cnp.ndarray arr = ctl_array
        self.ctl_array = arr
        self.base = <long long *>cnp.PyArray_DATA(arr)
        self.n_rows = <int>arr.shape[0] - 1
        self.ctl = self.base + w * CTL_COLS
        self.main_row = <long long *>cnp.PyArray_DATA(arr) + (arr.shape[0] - 1) * CTL_COLS
        self.fd = fd
        self.adaptive = spin_us < 0
        self.spin_ns = FIRST_WORKER_SPIN_NS if self.adaptive else <long long>(spin_us * 1000.0)
        self.seen = fv_load(&self.ctl[C_CMD_SEQ])
        self.stash = None
        fc_init(&self.fc)
        self.t_pub = 0
        self.ctl[C_NAPS] = 0
        self.ctl[C_LONG] = 0
        self.ctl[C_SLEEPS] = 0
        self.ctl[C_LOST] = 0
        if self.adaptive:
            fv_timer_slack(TIMER_SLACK_NS)  # this is the worker's own process
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
        read_all(self.fd, <char *>hdr, HEADER_BYTES)  # PeerClosed when the parent is gone
        if hdr[0] == WAKE:
            return 0
        self.stash = ((hdr[0], hdr[1], hdr[2], hdr[3]), recv_payload(self.fd, hdr[3]))
        give_up = fv_now_ns() + <long long>PAYLOAD_DOORBELL_MS * 1000000
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

    cdef long long _spin_end(self) except -1:
        """When to stop spinning for the next command: after ``spin_ns``, or, with a
        forecast gap, after a window around it (napping until shortly before first)."""
        cdef long long now = fv_now_ns(), target, nap_until
        if not (self.adaptive and self.fc.expect > 0 and self.t_pub > 0):
            return now + self.spin_ns
        target = self.t_pub + self.fc.expect
        nap_until = fc_nap_end(&self.fc, target, WORKER_NAP_MARGIN_NS)
        if fc_long(&self.fc):  # counted: only these may nap (Engine.wait_counts' `long`)
            fv_store(&self.ctl[C_LONG], self.ctl[C_LONG] + 1)
        if nap_until - now > MIN_NAP_NS:
            self._nap(nap_until)
            now = fv_now_ns()
        return (target if target > now else now) + fc_window(&self.fc, WORKER_WINDOW_LO_NS, WORKER_WINDOW_HI_NS)

    cdef int _sleep(self) except -1:
        """Sleep on the socket until the parent rings; look at the flags every
        RECHECK_NS all the same, and count a command found there without its ring."""
        cdef long long *r = self.ctl
        cdef pollfd p
        cdef int ready
        fv_store(&r[C_SLEEPS], r[C_SLEEPS] + 1)
        while True:
            fv_store(&r[C_SLEEPING], 1)
            if fv_load(&r[C_CMD_SEQ]) != self.seen:
                fv_store(&r[C_SLEEPING], 0)
                return 0
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
                return 0

    cdef int _wait(self) except -1:
        """Block until the command sequence number moves past ``seen``."""
        cdef long long *r = self.ctl
        cdef long long spin_end
        cdef bint got = fv_load(&r[C_CMD_SEQ]) != self.seen
        if got:
            spin_end = 0
        else:
            spin_end = self._spin_end()
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
            self._sleep()
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
                read_header_skip_wake(self.fd, hdr)
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
            send_wake(self.fd)
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
