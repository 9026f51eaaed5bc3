"""Exceptions raised by fastvec.

Where gymnasium's ``AsyncVectorEnv`` raises an error class of its own, fastvec's is an
instance of it too (``ClosedError`` is a ``gymnasium.error.ClosedEnvironmentError``,
...), so code written against gymnasium catches what it expects. An env's exception
reaches the caller as a ``WorkerError`` that is also an instance of the env's exception
type (``cause_class``), the way Ray makes a remote task's error an instance of its cause:
``except ValueError`` around ``reset()`` catches an env's ``ValueError``.
"""

from __future__ import annotations

import pickle
from typing import cast

from gymnasium import error as _gym_error


class WorkerError(RuntimeError):
    """A worker process failed: its env raised, it died, it hung, or it sent garbage.

    Attributes
    ----------
    worker : int or None
        Index of the worker process.
    env_indices : tuple of int
        Global indices of the envs that worker hosts.
    env_index : int or None
        Global index of the env that raised, when one did.
    exc_type : str or None
        Qualified name of the exception raised in the worker.
    exc_message : str or None
        ``str()`` of that exception.
    worker_traceback : str or None
        The traceback text, as formatted inside the worker.
    reset_envs : tuple of int
        With ``restart_on_error=True``: the envs that were restarted and reset.
    cause_class : type or None
        The env's exception class, when it could be sent to this process; the error is
        then an instance of it as well (see ``worker_error``).
    """

    cause_class: type[BaseException] | None = None

    def __init__(
        self,
        message: str,
        *,
        worker: int | None = None,
        env_indices=(),
        env_index: int | None = None,
        exc_type: str | None = None,
        exc_message: str | None = None,
        worker_traceback: str | None = None,
        reset_envs=(),
    ):
        super().__init__(message)
        self.worker = worker
        self.env_indices = tuple(env_indices)
        self.env_index = env_index
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.worker_traceback = worker_traceback
        self.reset_envs = tuple(reset_envs)

    def __str__(self) -> str:
        text = BaseException.__str__(self)  # not the cause class's (KeyError quotes its message)
        if self.worker_traceback:
            text += "\n\nTraceback in the worker:\n" + self.worker_traceback.rstrip()
        return text


class ActionTypeError(ValueError, TypeError):
    """Actions that are not a batch of values at all (a scalar for a vector env, text
    for numbers): a ValueError, as fastvec's other action checks, and a TypeError, as
    gymnasium raises for them."""


class ClosedError(RuntimeError, _gym_error.ClosedEnvironmentError):
    """An operation was attempted on a vector env that is closed."""


class SpaceMismatchError(ValueError, RuntimeError):
    """The envs' spaces do not agree (a ValueError; gymnasium raises RuntimeError)."""


class PendingCallError(RuntimeError, _gym_error.AlreadyPendingCallError):
    """A call was made while another one (``name``) still waits for its ``*_wait``."""

    # gymnasium declares ``name: str``; fastvec's default is None (every call of its own names one).
    name: str | None  # type: ignore[assignment]

    def __init__(self, message: str, name: str | None = None):
        RuntimeError.__init__(self, message)
        self.name = name


class NoPendingCallError(RuntimeError, _gym_error.NoAsyncCallError):
    """A ``*_wait`` was called with no matching ``*_async`` call in flight."""

    name: str | None  # type: ignore[assignment]  # as PendingCallError's

    def __init__(self, message: str, name: str | None = None):
        RuntimeError.__init__(self, message)
        self.name = name


_DUAL: dict[type, type[WorkerError]] = {}


def _dual_class(cause: type) -> type[WorkerError]:
    """``WorkerError`` and ``cause`` in one class (cached), or ``WorkerError`` where they
    cannot be combined (a base that is not an ``Exception``, incompatible layouts)."""
    if cause in _DUAL:
        return _DUAL[cause]
    cls: type[WorkerError] = WorkerError
    if isinstance(cause, type) and issubclass(cause, Exception) and not issubclass(cause, WorkerError):
        try:
            body = {"__module__": __name__, "__reduce__": _dual_reduce, "cause_class": cause}
            cls = cast("type[WorkerError]", type(f"WorkerError[{cause.__qualname__}]", (WorkerError, cause), body))
            cls.__new__(cls)  # OSError and its kin: their C layout cannot be built this way
        except TypeError:
            cls = WorkerError
    _DUAL[cause] = cls
    return cls


def _dual_reduce(self):
    return _rebuild, (type(self).cause_class, BaseException.__str__(self), dict(self.__dict__))


def _rebuild(cause, message, state):
    exc = worker_error(message, cause_class=cause)
    exc.__dict__.update(state)
    return exc


def worker_error(message: str, *, cause_class: type | None = None, **attrs) -> WorkerError:
    """A ``WorkerError`` (same keywords); an instance of ``cause_class`` too where given."""
    cls = WorkerError if cause_class is None else _dual_class(cause_class)
    exc = cls.__new__(cls)
    WorkerError.__init__(exc, message, **attrs)
    return exc


def cause_class_blob(exc: BaseException) -> bytes | None:
    """The class of ``exc`` pickled by reference, for the parent (None if it does not
    pickle): for a ``WorkerError`` that is its env's class, ``cause_class``."""
    cls = exc.cause_class if isinstance(exc, WorkerError) else type(exc)
    if cls is None:
        return None
    try:
        return pickle.dumps(cls)
    except Exception:
        return None


def load_cause_class(blob) -> type | None:
    """The class from ``cause_class_blob``, or None if this process cannot import it."""
    if not blob:
        return None
    try:
        cls = pickle.loads(blob)
    except Exception:
        return None
    return cls if isinstance(cls, type) and issubclass(cls, BaseException) else None
