"""Pickling what crosses a process boundary: payloads of commands and replies."""

from __future__ import annotations

import pickle

import cloudpickle


def dumps(obj) -> bytes:
    """``pickle`` (fast) where it can, ``cloudpickle`` (lambdas, local classes) where not."""
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return cloudpickle.dumps(obj)


def pickle_payloads(targets: dict, what: str) -> dict:
    """``{key: cloudpickled payload}``, all or nothing: a payload that cannot be pickled
    raises ValueError before anything is sent, so no worker is left with a command."""
    blobs = {}
    for key, payload in targets.items():
        try:
            blobs[key] = cloudpickle.dumps(payload)
        except Exception as exc:
            raise ValueError(f"could not pickle the {what}: {exc}") from None
    return blobs
