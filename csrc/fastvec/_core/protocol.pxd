# The wire protocol between the parent and its workers, declared once: Cython modules
# cimport these names, Python imports them from ``fastvec._core.protocol``.
#
# A message is a 16-byte header of four int32 (code, slot, argument, payload length),
# optionally followed by a pickled payload, on a socketpair per worker. For the hot
# commands the header fields also sit in the shared control block (see channel.pyx),
# and the socket carries only a WAKE header when the receiver sleeps.

cpdef enum:
    # Commands, parent -> worker (closing is the parent closing its end of the socket).
    CMD_STEP = 1
    CMD_RESET = 2
    CMD_CALL = 3
    CMD_SPACES = 6
    CMD_PING = 7  # only asks for an empty REPLY_DONE: is the channel up? (fastvec.ray)
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
