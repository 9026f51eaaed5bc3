"""The parent's waits name how they ended: ``WaitResult`` (Python) and the compiled
``Controller`` agree on every outcome, driven on a bare control block."""

import socket

import numpy as np
import pytest
from fastvec._core.channel import Controller
from fastvec._core.protocol import WaitResult

from fastvec._core import protocol as P

DONE_SEQ, CMD_SEQ = 8, 0  # control-block columns (protocol.pxd)


@pytest.fixture
def block():
    """A control block for two workers, their socketpairs, and a Controller that sleeps
    at once (no spin) after a step was issued to both."""
    ctl = np.zeros((3, P.CTL_COLS), dtype=np.int64)
    pairs = [socket.socketpair() for _ in range(2)]
    fds = np.array([a.fileno() for a, _b in pairs], dtype=np.intc)
    c = Controller(ctl, fds, 0.0)
    c.issue_all(P.CMD_STEP, 0)
    yield ctl, pairs, c
    for a, b in pairs:
        a.close()
        b.close()


def test_the_values_are_the_wire_protocols():
    assert [(r.name, int(r)) for r in WaitResult] == [("DONE", 0), ("TIMEOUT", 1), ("DIED", 2), ("GARBLED", 3)]


def test_done(block):
    ctl, _pairs, c = block
    ctl[:2, DONE_SEQ] = ctl[:2, CMD_SEQ]  # both workers answered
    assert c.wait(np.array([0, 1], dtype=np.intc), 1.0) == (WaitResult.DONE, -1)


def test_timeout_names_a_silent_worker(block):
    ctl, _pairs, c = block
    ctl[0, DONE_SEQ] = ctl[0, CMD_SEQ]
    assert c.wait(np.array([0, 1], dtype=np.intc), 0.05) == (WaitResult.TIMEOUT, 1)


def test_died_and_garbled_name_their_worker(block):
    _ctl, pairs, c = block
    pairs[0][1].close()  # worker 0's end of its socket: it died
    assert c.wait(np.array([0], dtype=np.intc), 1.0) == (WaitResult.DIED, 0)
    pairs[1][1].send(np.array([12345, 0, 0, 0], dtype=np.int32).tobytes())  # no such reply code
    assert c.wait(np.array([1], dtype=np.intc), 1.0) == (WaitResult.GARBLED, 1)
