# Socket framing, for the doorbells (controller.pyx, worker_channel.pyx): what they
# cimport from framing.pyx.

cdef int write_all(int fd, const char *buf, Py_ssize_t n) except -1
cdef int read_all(int fd, char *buf, Py_ssize_t n) except -1
cdef int read_bounded(int fd, char *buf, Py_ssize_t n) except -1
cdef tuple recv_message(int fd)
cdef tuple read_payload_bounded(int fd, int *hdr)
cdef int read_header_skip_wake(int fd, int *hdr) except -1
cdef int send_wake(int fd) except -1
