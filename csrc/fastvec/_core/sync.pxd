# The C the doorbells are built on, inlined into each module that cimports it:
# sequentially consistent loads and stores on the shared control block, a CPU pause,
# the monotonic clock (the same in every process, so each side can time the other),
# a poll with a timeout in nanoseconds and the thread's timer slack.

cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    enum:
        POLLIN

cdef extern from *:
    """
    #include <poll.h>
    #include <sched.h>
    #include <time.h>
    #ifdef __linux__
    #include <sys/prctl.h>
    #endif
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
    /* Timed naps of this thread end within slack_ns of when asked (Linux's default is 50 us). */
    static inline void fv_timer_slack(unsigned long slack_ns) {
    #ifdef __linux__
        prctl(PR_SET_TIMERSLACK, slack_ns, 0UL, 0UL, 0UL);
    #endif
    }
    """
    long long fv_load(long long *p) nogil
    void fv_store(long long *p, long long v) nogil
    void fv_relax() nogil
    long long fv_now_ns() nogil
    int sched_yield() nogil
    int fv_poll_ns(pollfd *fds, unsigned long n, long long timeout_ns) nogil
    void fv_timer_slack(unsigned long slack_ns) nogil
