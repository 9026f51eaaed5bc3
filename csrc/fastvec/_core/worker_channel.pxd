# The worker's side of the doorbells, for the step loop (stepper.pyx).
from fastvec._core.forecast cimport Forecast


cdef class WorkerChannel:
    cdef long long *ctl
    cdef long long *base
    cdef int n_rows
    cdef long long *main_row
    cdef object ctl_array
    cdef public int fd
    cdef long long spin_ns
    cdef public long long seen
    cdef object stash
    cdef bint adaptive
    cdef Forecast fc
    cdef long long t_pub  # when the last reply was published

    cdef int _take_header(self) except -1
    cdef int _nap(self, long long until) except -1
    cdef long long _spin_end(self) except -1
    cdef int _sleep(self) except -1

    cdef int _wait(self) except -1
    cdef int _step_slot(self) noexcept
    cdef int _publish(self, int code, int slot, int flags) except -1
    cdef bint _waited_all_done(self) noexcept nogil
