# cython: language_level=3
"""The control channel between the parent and its workers, for Python code: one import
point for the pieces, each in a module of its own.

- ``framing.pyx``: 16-byte headers and payloads on a socketpair per worker
  (``send_header``, ``recv_header``, ``recv_payload``, ``PeerClosed``);
- ``controller.pyx``: the parent's side of the doorbells (``Controller``,
  ``DoorbellError``);
- ``worker_channel.pyx``: a worker's side (``WorkerChannel``);
- ``forecast.pxd``, ``tuning.pxd``, ``sync.pxd``: how the waits learn the loop, their
  machine-tuned numbers, and the atomics and clock underneath (inlined C);
- ``protocol.pxd``: the commands, replies, control-block columns and wait results.
"""
from fastvec._core.controller import Controller, DoorbellError
from fastvec._core.framing import PeerClosed, recv_header, recv_payload, send_header
from fastvec._core.worker_channel import WorkerChannel

__all__ = [
    "Controller", "DoorbellError", "PeerClosed", "WorkerChannel", "recv_header", "recv_payload", "send_header",
]
