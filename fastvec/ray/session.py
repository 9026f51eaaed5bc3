"""This process's connection to Ray: joined, or a local instance started and stopped.

With no ``ray_address`` and no Ray connection in this process, fastvec starts a local
Ray instance that listens on 127.0.0.1 only, shared by every fastvec vector env of the
process and stopped when the last of them closes.
"""

from __future__ import annotations

import contextlib
import logging
import threading

import ray

__all__ = ["loopback_only", "connect", "disconnect", "client_mode"]


@contextlib.contextmanager
def loopback_only():
    """Within this block, a Ray node started in this process (``ray.init`` of a local
    instance, ``ray.cluster_utils.Cluster.add_node``) given ``127.0.0.1`` as its address
    keeps it, so that every Ray process listens on the loopback interface only.

    Ray normally swaps a loopback node address for the machine's outward address, so
    that other machines can join. fastvec's own local instance serves this process only.
    """
    from ray._private import ray_constants

    missing = object()
    before = getattr(ray_constants, "ENABLE_RAY_CLUSTER", missing)
    ray_constants.ENABLE_RAY_CLUSTER = False  # read by services.get_node_ip_address()
    try:
        yield
    finally:
        if before is missing:
            del ray_constants.ENABLE_RAY_CLUSTER
        else:
            ray_constants.ENABLE_RAY_CLUSTER = before


_session_lock = threading.Lock()
_session = {"owners": 0, "generation": 0}


def connect(address, init_kwargs) -> int | None:
    """Make sure this process is connected to Ray. Returns the generation of the
    connection fastvec made when the caller took a share of it (to release with
    ``disconnect``), None when the connection is the user's."""
    with _session_lock:
        if _session["owners"] and not ray.is_initialized():
            _session["owners"] = 0  # someone called ray.shutdown(): those shares are void
            _session["generation"] += 1
        if ray.is_initialized():
            if address not in (None, "auto"):
                current = ray.get_runtime_context().gcs_address
                if address.split("://")[-1] != current:
                    raise ValueError(
                        f"Ray is already initialized in this process (connected to {current}); "
                        f"ray_address={address!r} differs: call ray.shutdown() first or drop ray_address"
                    )
            if _session["owners"] == 0:
                return None  # the user's connection: theirs to shut down
            _session["owners"] += 1
            return _session["generation"]
        kwargs = {"log_to_driver": False, "logging_level": logging.ERROR}
        if address is None:
            kwargs.update(include_dashboard=False, _node_ip_address="127.0.0.1")
            kwargs.update(init_kwargs or {})
            with loopback_only():
                ray.init(address="local", **kwargs)
        else:
            kwargs.update(init_kwargs or {})
            ray.init(address=address, **kwargs)
        _session["owners"] = 1
        _session["generation"] += 1
        return _session["generation"]


def disconnect(generation: int) -> None:
    with _session_lock:
        if _session["owners"] <= 0 or generation != _session["generation"]:
            return
        _session["owners"] -= 1
        if _session["owners"] == 0 and ray.is_initialized():
            ray.shutdown()


def client_mode() -> bool:
    try:
        from ray.util.client import ray as client_ray

        return bool(client_ray.is_connected())
    except Exception:
        return False
