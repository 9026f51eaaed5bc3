# The wire protocol between the parent and its workers, declared once: Cython modules
# cimport these names, Python imports them from ``fastvec._core.protocol``.
#
# A message is a 16-byte header of four int32 (code, slot, argument, payload length),
# optionally followed by a pickled payload, on a socketpair per worker (framing.pyx). For
# the hot commands the header fields also sit in the shared control block (its columns
# below; controller.pyx and worker_channel.pyx ring the doorbells), and the socket
# carries only a WAKE header when the receiver sleeps.

cpdef enum:
    # Commands, parent -> worker (closing is the parent closing its end of the socket).
    CMD_STEP = 1
    CMD_RESET = 2
    CMD_CALL = 3
    CMD_SPACES = 6
    CMD_PING = 7  # only asks for an empty REPLY_DONE: is the channel up? (fastvec.ray)
    CMD_BUILD = 8  # after a placement probe: the envs to build (payload: indices, factories)
    # Replies, worker -> parent.
    REPLY_DONE = 16
    REPLY_RESULT = 17
    REPLY_ERROR = 18
    REPLY_READY = 19
    # A doorbell with nothing behind it: "look at the control block".
    WAKE = 99
    # Reply (and command) flags, in the argument field.
    NO_PAYLOAD = 0
    HAS_PAYLOAD = 1
    IN_TABLE = 2  # the step's infos are in the shared info table
    # Sizes.
    HEADER_BYTES = 16
    MAX_PAYLOAD = 1073741824  # 1 GiB: a garbled header must not make us allocate more
    CTL_COLS = 16  # int64 cells per control-block row
    INFO_COLS = 16  # numeric info keys per env that fit the shared info table
    # What a worker does when an episode ends.
    AUTORESET_SAME_STEP = 0
    AUTORESET_NEXT_STEP = 1
    AUTORESET_DISABLED = 2


# What a wait for replies ends with (``Controller.wait``/``wait_any`` return
# ``(result, worker)``); Python code reads them as ``fastvec._core.protocol.WaitResult``.
cdef enum:
    WAIT_DONE = 0     # every worker waited for answered (wait_any: at least one); worker -1
    WAIT_TIMEOUT = 1  # the timeout passed; the worker is one still silent
    WAIT_DIED = 2     # the worker's socket closed: it died
    WAIT_GARBLED = 3  # the worker sent garbage

# The control block: int64[num_workers + 1, CTL_COLS], in shared memory. Per worker one
# cache line the parent writes, then one the worker writes; clock readings are
# CLOCK_MONOTONIC (the same in every process), so each side times the other without its
# own wake-up in the measurement.
cdef enum:
    # the parent's line
    C_CMD_SEQ = 0   # bumped once per command: the doorbell
    C_CMD = 1
    C_SLOT = 2
    C_ARG = 3
    C_WAITED = 4    # the parent waits for this worker's reply
    C_ISSUED_NS = 5  # when the command was issued
    C_LONG = 6      # the worker's waits forecast long (to nap towards; Engine.wait_counts)
    C_LOST = 7      # the worker's waits that found a command without its doorbell (rare)
    # the worker's line
    C_DONE_SEQ = 8  # == C_CMD_SEQ once the worker answered
    C_REPLY = 9
    C_REPLY_SLOT = 10
    C_REPLY_ARG = 11
    C_SLEEPING = 12  # the worker sleeps on its socket: ring with a WAKE header
    C_PUBLISHED_NS = 13  # when the reply was published
    C_NAPS = 14     # the worker's waits that napped (diagnostics: Engine.wait_counts) ...
    C_SLEEPS = 15   # ... and that slept until the parent's doorbell
    # the last row: the parent's own
    M_SLEEPING = 0  # the parent sleeps: the last worker it waits for rings
    M_ANY = 1       # ... or, in a wait for any of them, the first
