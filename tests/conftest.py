"""Shared fixtures: every test must leave no fastvec shared-memory segment and no live
child process behind.

Other processes on this machine (another test run, a benchmark) may create and remove
``/dev/shm/fastvec_*`` segments at the same time, so a leak is only blamed on a test
when this process created the segment: every ``shm_open(..., O_CREAT)`` made here is
recorded by wrapping ``_posixshmem.shm_open`` (``SharedMemory`` calls it through the
module, so the wrapper sees segments made through it or directly).
"""

from __future__ import annotations

import _posixshmem
import gc
import os
import sys
import time

import psutil
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # `import envs` from any start method


def pytest_report_header(config):
    import fastvec

    return f"fastvec under test: {os.path.dirname(fastvec.__file__)}"


def pytest_sessionstart(session):
    # CI tests the installed package: fail at once if the source tree shadows it.
    if os.environ.get("FASTVEC_REQUIRE_INSTALLED"):
        import fastvec

        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        if os.path.abspath(fastvec.__file__).startswith(repo + os.sep):
            pytest.exit(
                f"fastvec was imported from the source tree ({fastvec.__file__}), not from the installed package",
                returncode=4,
            )


@pytest.fixture(autouse=True, scope="session")
def sb3_logs_in_tmp(tmp_path_factory):
    """SB3's default logger makes a folder /tmp/SB3-<time> for every model it trains
    (``$SB3_LOGDIR`` if set): keep them in pytest's own temporary directory."""
    patch = pytest.MonkeyPatch()
    patch.setenv("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3_logs")))
    yield
    patch.undo()


SHM_DIR = "/dev/shm"
SHM_PREFIX = "fastvec_"
GRACE_S = 3.0

_created: set[str] = set()
_real_shm_open = _posixshmem.shm_open


def _recording_shm_open(path, flags, mode=0o777):
    fd = _real_shm_open(path, flags, mode)
    if flags & os.O_CREAT:
        name = path.lstrip("/")
        if name.startswith(SHM_PREFIX):
            _created.add(name)
    return fd


_posixshmem.shm_open = _recording_shm_open


def _segments() -> set[str]:
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(SHM_PREFIX)}
    except FileNotFoundError:  # pragma: no cover - no /dev/shm (macOS)
        return set()


def _helper_pids() -> set[int]:
    """Long-lived helpers that multiprocessing keeps for the whole session."""
    pids = set()
    try:
        from multiprocessing import resource_tracker

        pid = getattr(resource_tracker._resource_tracker, "_pid", None)
        if pid:
            pids.add(pid)
    except Exception:  # pragma: no cover
        pass
    try:
        from multiprocessing import forkserver

        pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
        if pid:
            pids.add(pid)
    except Exception:  # pragma: no cover
        pass
    return pids


def _live_children() -> list[psutil.Process]:
    helpers = _helper_pids()
    out = []
    for p in psutil.Process().children(recursive=True):
        if p.pid in helpers:
            continue
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            continue
        out.append(p)
    return out


def _new_children(before: set[int]) -> list[psutil.Process]:
    """Live children started since ``before`` (pids from ``_live_children``)."""
    return [p for p in _live_children() if p.pid not in before]


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail the test if it leaves a fastvec segment or a child process behind."""
    before_children = {p.pid for p in _live_children()}
    _created.clear()
    yield
    deadline = time.monotonic() + GRACE_S
    collected = False
    while True:
        children = _new_children(before_children)
        leaked = sorted(_created & _segments())
        if (not children and not leaked) or time.monotonic() > deadline:
            break
        if not collected:
            # fastvec engines also shut down when collected (a full collection is slow
            # with torch loaded, so only when something is left)
            gc.collect()
            collected = True
        else:
            time.sleep(0.05)
    problems = []
    if children:
        desc = []
        for p in children:
            try:
                desc.append(f"{p.pid} {p.name()!r} {' '.join(p.cmdline())[:120]!r}")
            except psutil.Error:
                desc.append(str(p.pid))
            try:
                p.kill()  # started by this test: do not let it poison the next ones
            except psutil.Error:
                pass
        problems.append(f"child processes still alive {GRACE_S:g} s after the test: {desc}")
    if leaked:
        for name in leaked:
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except OSError:
                pass
        problems.append(f"shared-memory segments left behind: {leaked}")
    _created.clear()
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)
