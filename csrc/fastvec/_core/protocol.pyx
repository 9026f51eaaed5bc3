# cython: language_level=3
"""The wire protocol's constants (declared in protocol.pxd), for Python code."""
import enum


class WaitResult(enum.IntEnum):
    """How a wait for the workers' replies ended: the first of the ``(result, worker)``
    pair ``Controller.wait`` and ``Controller.wait_any`` return (plain ints, equal to
    these)."""

    DONE = WAIT_DONE  #: every worker waited for answered (``wait_any``: one did); worker -1
    TIMEOUT = WAIT_TIMEOUT  #: the timeout passed; the worker is one still silent
    DIED = WAIT_DIED  #: the worker's socket closed: it died
    GARBLED = WAIT_GARBLED  #: the worker sent garbage
