"""How busy the learner's device is: the figure behind "GPU use from 15% to 85%".

``DeviceBusy.take(cpu_busy_s)`` returns the fraction of the wall time since the last
call that the device computed:

- CPU: the trainer's own compute (acting, targets, learning), which the caller passes
  in; the rest of the time it waits for the envs.
- CUDA: the spans between CUDA events recorded around each acting call, the targets
  and the update (``begin()``/``end()``): time the device had work queued, measured on
  the device (events add a few microseconds per acting call, CUDA only). The events come
  from ``cuda`` (``torch.cuda`` on a CUDA device): the tests pass a fake one to run
  this branch on the CPU. Where ``nvidia-ml-py`` is
  installed, ``nvml()`` also gives NVML's utilisation (the share of time any kernel ran,
  what ``nvidia-smi`` shows), sampled by a thread every 50 ms, averaged over the same
  interval.
"""

from __future__ import annotations

import threading
import time

import torch

__all__ = ["DeviceBusy"]


class DeviceBusy:
    """The busy fraction of ``device``'s computing (see the module docstring); ``cuda``:
    the module its events and ``synchronize()`` come from (``torch.cuda`` on a CUDA
    device, none on the CPU: there the caller's compute seconds count)."""

    def __init__(self, device: torch.device, cuda=None):
        if cuda is None and device.type == "cuda":
            cuda = torch.cuda
        self._cuda = cuda
        self.cuda = cuda is not None  # timed by events on the device
        self._spans: list = []  # (start, end) CUDA events not yet summed
        self._last = time.perf_counter()
        self.total_busy_s = 0.0
        self.total_wall_s = 0.0
        self._nvml = _NvmlSampler(device) if device.type == "cuda" else None

    def start(self) -> None:
        """Count from now (the run's start, after set-up)."""
        self._spans.clear()
        self._last = time.perf_counter()
        self.total_busy_s = self.total_wall_s = 0.0

    def begin(self):
        """Mark the start of device work (CUDA only; a no-op token on CPU)."""
        if self._cuda is None:
            return None
        ev = self._cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def end(self, start) -> None:
        if start is None:
            return
        ev = self._cuda.Event(enable_timing=True)
        ev.record()
        self._spans.append((start, ev))

    def synchronize(self) -> None:
        """Wait for the work queued on the device (CUDA only), so that a wall-clock
        interval counts it."""
        if self._cuda is not None:
            self._cuda.synchronize()

    def take(self, cpu_busy_s: float, now: float | None = None) -> float:
        """Busy fraction since the last ``take``; ``cpu_busy_s``: the trainer's compute
        seconds in that interval (used on CPU); ``now``: the ``time.perf_counter()`` the
        interval ends at (default: now), so that it can be the one the caller logs."""
        now = time.perf_counter() if now is None else now
        wall, self._last = now - self._last, now
        if self.cuda:
            if self._spans:
                self._spans[-1][1].synchronize()
            busy = sum(a.elapsed_time(b) for a, b in self._spans) / 1e3
            self._spans.clear()
        else:
            busy = cpu_busy_s
        self.total_busy_s += busy
        self.total_wall_s += wall
        return min(1.0, busy / wall) if wall > 0 else 0.0

    @property
    def fraction(self) -> float | None:
        """Over the whole run so far."""
        return min(1.0, self.total_busy_s / self.total_wall_s) if self.total_wall_s > 0 else None

    def nvml(self) -> float | None:
        """NVML's mean utilisation (0-1) since the last call; None without nvidia-ml-py."""
        return None if self._nvml is None else self._nvml.take()

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()


class _NvmlSampler:
    """A daemon thread reading NVML's GPU utilisation every 50 ms."""

    def __init__(self, device: torch.device):
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread = None
        try:
            import pynvml
        except ImportError:
            return
        try:
            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # no driver access (containers, MIG): leave it out
            return
        self._pynvml = pynvml
        self._thread = threading.Thread(target=self._run, name="fastvec-nvml", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self._samples.append(self._pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu / 100.0)
            except Exception:
                return

    def take(self) -> float | None:
        if self._thread is None or not self._samples:
            return None
        got, self._samples = self._samples, []
        return sum(got) / len(got)

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=1.0)
            self._thread = None
            try:
                self._pynvml.nvmlShutdown()
            except Exception:
                pass
