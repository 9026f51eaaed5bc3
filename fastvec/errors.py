"""Exceptions raised by fastvec."""
from __future__ import annotations


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
    """

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
        text = super().__str__()
        if self.worker_traceback:
            text += "\n\nTraceback in the worker:\n" + self.worker_traceback.rstrip()
        return text


class ClosedError(RuntimeError):
    """An operation was attempted on a vector env that is closed."""
