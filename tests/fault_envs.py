"""Envs and helpers that inject faults into fastvec workers (used by test_faults.py).

``FaultyEnv`` wraps ``CartPole-v1`` and behaves exactly like it until a fault is armed
through an attribute (``set_attr`` / ``set_wrapper_attr`` from the parent):

- ``arm_step``: what the *next* ``step`` does instead of stepping (one shot):
  ``"raise"`` (ValueError from ``_raise_in_step``), ``"hang"`` (``time.sleep(60)``),
  ``"hang_ignore_term"`` (ignores SIGTERM, then sleeps), ``"slow"`` (sleeps 1 s, then
  steps; ``slow_span`` keeps the sleep's start and end on ``time.monotonic()``, one clock
  for every process of the machine), or one of ``GARBAGE`` (write garbage to the worker's control socket, wait so
  the parent is asleep on that socket, then step normally), or ``"bad_info"`` (step
  normally but return an info the parent cannot unpickle).
- ``arm_reset``: the next ``reset`` raises ValueError from ``_raise_in_reset``.
- ``explosive``: ``explode()`` raises ValueError from ``_raise_in_method``.

Everything here runs inside worker processes; factories are module-level so cloudpickle
sends them by reference (the forked workers already imported this module).
"""

from __future__ import annotations

import os
import signal
import stat
import struct
import sys
import time

import gymnasium as gym

HEADER = struct.Struct("<4i")  # fastvec's control header: cmd, slot, arg, payload length
REPLY_DONE = 16  # fastvec._core.protocol.REPLY_DONE

GARBAGE = {
    # A reply header whose payload length is absurd (2 GiB - 1).
    "huge_length": HEADER.pack(REPLY_DONE, 0, 0, 0x7FFFFFFF),
    # Sixteen bytes of junk: cmd and length come out negative.
    "junk_header": b"\xde\xad\xbe\xef" * 4,
    # An unknown reply code carrying a payload that is not a pickle.
    "bad_code": HEADER.pack(12345, 0, 0, 8) + b"notapkl!",
    # Fewer bytes than one header: the stream is out of step from here on.
    "partial_header": b"\x01\x02\x03\x04\x05\x06\x07",
}


def _raise_in_step(index):
    raise ValueError(f"injected step fault in env {index}")


def _raise_in_reset(index):
    raise ValueError(f"injected reset fault in env {index}")


def _raise_in_method(index):
    raise ValueError(f"injected method fault in env {index}")


def _explode_on_unpickle():
    raise RuntimeError("this object cannot be unpickled outside the worker")


class Unpicklable:
    """Pickles fine in the worker; unpickling it in the parent raises."""

    def __reduce__(self):
        return (_explode_on_unpickle, ())


def control_fd() -> int:
    """The worker's control-socket fd, found from the calling frames (the worker loop
    holds it as ``chan.fd`` / ``fd``); falls back to the only socket in /proc/self/fd."""
    frame = sys._getframe(1)
    while frame is not None:
        loc = frame.f_locals
        chan = loc.get("chan")
        if chan is not None and isinstance(getattr(chan, "fd", None), int):
            return chan.fd
        if frame.f_code.co_name == "worker_main" and isinstance(loc.get("fd"), int):
            return loc["fd"]
        frame = frame.f_back
    socks = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                socks.append(int(name))
        except OSError:
            pass
    if len(socks) != 1:
        raise RuntimeError(f"cannot tell the control socket among {socks}")
    return socks[0]


class FaultyEnv(gym.Wrapper):
    def __init__(self, env, index):
        super().__init__(env)
        self.index = index
        self.arm_step = None
        self.arm_reset = False
        self.explosive = False
        self.steps = 0
        self.slow_span = None

    def step(self, action):
        self.steps += 1
        mode, self.arm_step = self.arm_step, None
        if mode == "raise":
            _raise_in_step(self.index)
        elif mode == "hang":
            time.sleep(60)
        elif mode == "hang_ignore_term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(60)
        elif mode == "slow":
            t0 = time.monotonic()
            time.sleep(1.0)
            self.slow_span = (t0, time.monotonic())
        elif mode in GARBAGE:
            os.write(control_fd(), GARBAGE[mode])
            time.sleep(0.3)  # the parent is now asleep in poll() on this socket
        obs, rew, term, trunc, info = self.env.step(action)
        if mode == "bad_info":
            info = dict(info, bomb=Unpicklable())
        return obs, rew, term, trunc, info

    def reset(self, **kwargs):
        if self.arm_reset:
            self.arm_reset = False
            _raise_in_reset(self.index)
        return self.env.reset(**kwargs)

    def explode(self):
        if self.explosive:
            _raise_in_method(self.index)
        return self.index

    def pid(self):
        return os.getpid()


def make_cartpole():
    return gym.make("CartPole-v1")


def make_faulty(index):
    return FaultyEnv(gym.make("CartPole-v1"), index)


def make_pendulum():
    return gym.make("Pendulum-v1")
