"""The collector-learner wire of the async pipeline: one socket pair, one message per
rollout each way (``learn`` and ``done``), each a plain pickle; and the learner's own
interpreter, where it is not a fork (``learner_command``).

Messages: collector to learner ``("spec", spec)`` once, ``("learn", k, r, collector part,
rng)`` per rollout, ``("stop",)``, and to a fork ``("exec", env)`` (become a fresh
interpreter); learner to collector ``("ready",)``, ``("done", r, info)`` per update,
``("error", text)``.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys

__all__ = ["POLL_S", "dumps", "learner_command", "learner_env", "ignore_sigint", "restore_sigint"]

POLL_S = 0.1  # how often a wait looks at the other process's health


def dumps(msg) -> bytes:
    """Messages are plain pickles (multiprocessing's pickler would send torch tensors
    as shared-memory handles, which need its authentication)."""
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def learner_command(fd: int) -> list[str]:
    """``python -I -c ...``: isolated (no current directory, no ``PYTHONPATH``), with this
    interpreter's ``sys.path`` (``learner_env``), so that it imports the same fastvec as
    this one: a source checkout in the current directory must not shadow an installed
    build (``-m`` would put the directory first)."""
    code = (
        "import json, os, sys; sys.path[:] = json.loads(os.environ['FASTVEC_LEARNER_PATH']); "
        f"from fastvec.train.learner import main; main({int(fd)})"
    )
    return [sys.executable, "-I", "-c", code]


def learner_env() -> dict:
    """The learner interpreter's environment: this one's, and its import path."""
    return {
        **os.environ,
        "FASTVEC_LEARNER_PATH": json.dumps([os.path.abspath(p) if p else os.getcwd() for p in sys.path]),
    }


def ignore_sigint():
    try:
        return signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: signals are not ours to change
        return None


def restore_sigint(old) -> None:
    if old is not None:
        signal.signal(signal.SIGINT, old)
