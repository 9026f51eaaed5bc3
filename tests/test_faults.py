"""Fault injection: fastvec must turn every worker failure into a prompt, precise error
and leave nothing behind (no processes, no /dev/shm/fastvec_* segments).

Faults are injected into real worker processes (SIGKILL, envs that raise, hang or write
garbage to their control socket, a SIGKILLed or Ctrl-C'd main process) through both
front doors, ``fastvec.AsyncVectorEnv`` ("gym") and ``fastvec.SubprocVecEnv`` ("sb3").
The fault envs live in ``tests/fault_envs.py``.

Layout used throughout: 4 envs in 2 workers (fork); worker 1 hosts envs 2 and 3, and
env 2 is the one that misbehaves.

Assumptions about behaviour not yet in docs/ENGINE_API.md
---------------------------------------------------------
* ``restart_on_error=True`` (keyword of Engine, AsyncVectorEnv and SubprocVecEnv): the
  step that hits a dead, hung or failed worker *returns normally*; that worker is
  replaced (new pid, old one gone), its envs are reset and report an ended episode
  (truncated / done) with ``info["fastvec_restarted"]``, a ``RuntimeWarning`` names
  them and ``engine.restarts`` records them; later steps work without any extra call.
* A malformed control message from a worker (garbage bytes on its control socket, or a
  reply payload the parent cannot unpickle) must surface as ``WorkerError`` within a
  few steps; a bare ValueError/OSError, a hang, or silently ignoring it all fail.
* Every "does not hang" check runs the call in a thread with a generous deadline; on a
  hang the env's workers are SIGKILLed to unblock it and the test fails (the message
  shows where the call was stuck).

Child-process scripts (main SIGKILLed, Ctrl-C, 200 cycles) hide stable_baselines3 so
they skip importing torch (SB3 is optional for fastvec.SubprocVecEnv): forking a process
that holds torch is several times slower on this 2-core box. The in-process tests use the
real SB3-derived class.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import select
import signal
import string
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from multiprocessing import shared_memory

import fault_envs as fe
import gymnasium as gym
import numpy as np
import psutil
import pytest

import fastvec
from fastvec import WorkerError

DOORS = ["gym", "sb3"]
N_ENVS = 4
N_WORKERS = 2
VICTIM = 1  # worker index that fails
VICTIM_ENVS = (2, 3)  # envs of worker 1
FAULTY = 2  # env index that misbehaves
SHM_DIR = "/dev/shm"
ACTS = np.random.default_rng(0).integers(0, 2, size=(512, N_ENVS)).astype(np.int64)
HERE = os.path.dirname(os.path.abspath(__file__))


# --------------------------------------------------------------------------- helpers
def faulty_fns(n=N_ENVS):
    return [functools.partial(fe.make_faulty, i) for i in range(n)]


def make_vec(door, fns=None, *, num_workers=N_WORKERS, step_timeout=None, **extra):
    fns = faulty_fns() if fns is None else fns
    if door == "gym":
        return fastvec.AsyncVectorEnv(fns, num_workers=num_workers, context="fork", step_timeout=step_timeout, **extra)
    return fastvec.SubprocVecEnv(fns, start_method="fork", num_workers=num_workers, step_timeout=step_timeout, **extra)


def vec_reset(vec, door, seed=None):
    if door == "gym":
        return vec.reset(seed=seed)[0]
    if seed is not None:
        vec.seed(seed)
    return vec.reset()


def vec_step(vec, door, actions):
    """(obs, rewards, dones) from either door."""
    if door == "gym":
        obs, rew, term, trunc, _info = vec.step(actions)
        return obs, rew, term | trunc
    obs, rew, dones, _infos = vec.step(actions)
    return obs, rew, dones


def vec_get(vec, name):
    return list(vec.get_attr(name))


def arm(vec, door, name, value, index=FAULTY):
    """Set attribute ``name`` of env ``index`` only (arms a fault in fault_envs.FaultyEnv)."""
    if door == "gym":
        values = vec_get(vec, name)
        values[index] = value
        vec.set_attr(name, values)
    else:
        vec.set_attr(name, value, indices=[index])


class Outcome:
    def __init__(self, value, exc, elapsed):
        self.value, self.exc, self.elapsed = value, exc, elapsed


def guarded(fn, seconds, vec=None, what="call"):
    """Run ``fn`` in a thread; fail the test (after SIGKILLing ``vec``'s workers to
    unblock it) if it has not returned within ``seconds``."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            box["exc"] = exc

    pids = []
    if vec is not None:
        try:
            pids = list(vec.worker_pids)
        except Exception:
            pids = []
    t0 = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    elapsed = time.monotonic() - t0
    if thread.is_alive():
        frame = sys._current_frames().get(thread.ident)
        stack = "".join(traceback.format_stack(frame)[-6:]) if frame is not None else "?"
        if vec is not None:
            try:
                pids = list(set(pids) | set(vec.worker_pids))
            except Exception:
                pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        thread.join(10)
        pytest.fail(
            f"{what} hung: no return within {seconds:g} s"
            + ("" if not thread.is_alive() else " (still stuck after SIGKILLing the workers)")
            + f"; stuck in:\n{stack}"
        )
    return Outcome(box.get("value"), box.get("exc"), elapsed)


def close_checked(vec, seconds=15.0):
    out = guarded(vec.close, seconds, vec, "close()")
    assert out.exc is None, f"close() raised {out.exc!r}"
    return out


def is_dead(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_dead(pids, timeout):
    """Wait until every pid is gone (or a zombie, i.e. exited); return the live ones."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if not is_dead(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def wait_segment_gone(name, timeout):
    deadline = time.monotonic() + timeout
    while os.path.exists(os.path.join(SHM_DIR, name)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def assert_worker_error(exc, *, worker=VICTIM, envs=VICTIM_ENVS):
    assert exc is not None, "expected WorkerError, but the call returned normally"
    assert isinstance(exc, WorkerError), f"expected WorkerError, got {type(exc).__name__}: {exc}"
    assert exc.worker == worker, f"err.worker={exc.worker}, expected {worker}; message: {exc}"
    assert tuple(exc.env_indices) == tuple(envs), f"err.env_indices={exc.env_indices}, expected {envs}"


def our_children():
    """Descendants of this process, less multiprocessing's resource tracker/forkserver."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.ZombieProcess:
            cmd = ""
        except psutil.NoSuchProcess:
            continue
        if "resource_tracker" in cmd or "forkserver" in cmd:
            continue
        out.append(p)
    return out


class Leftovers:
    """What a test created that must be gone afterwards (besides our own children)."""

    def __init__(self, created):
        self.segments = created  # names of segments created in this process
        self.pids = set()  # e.g. workers of a child script (not our descendants)

    def add(self, *, pids=(), segment=None):
        self.pids.update(int(p) for p in pids)
        if segment:
            self.segments.append(segment.lstrip("/"))


@pytest.fixture(autouse=True)
def leftovers(monkeypatch):
    """Fails the test if a worker process or a fastvec segment outlives it."""
    created: list[str] = []
    orig_init = shared_memory.SharedMemory.__init__

    def init(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        if kwargs.get("create") or (len(args) > 1 and args[1]):
            created.append(self.name.lstrip("/"))

    monkeypatch.setattr(shared_memory.SharedMemory, "__init__", init)
    before = {p.pid for p in our_children()}
    track = Leftovers(created)
    yield track

    deadline = time.monotonic() + 5.0
    while True:
        procs = [p for p in our_children() if p.pid not in before]
        foreign = [pid for pid in track.pids if not is_dead(pid)]
        segs = [n for n in set(track.segments) if os.path.exists(os.path.join(SHM_DIR, n))]
        if (not procs and not foreign and not segs) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    problems = []
    for p in procs:
        try:
            desc = f"pid {p.pid} {p.status()} {p.cmdline()[:3]}"
        except psutil.Error:
            desc = f"pid {p.pid}"
        problems.append(f"child process left: {desc}")
        try:
            p.kill()
            p.wait(2)
        except psutil.Error:
            pass
    for pid in foreign:
        problems.append(f"worker process left: pid {pid}")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for name in segs:
        problems.append(f"segment left: {SHM_DIR}/{name}")
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except OSError:
            pass
    if problems:
        pytest.fail("left behind after the test:\n  " + "\n  ".join(problems))


# =========================================================================== SIGKILL
@pytest.mark.parametrize("spin_us", [None, 0.0], ids=["spin", "sleep"])
@pytest.mark.parametrize("step_timeout", [None, 30.0])
@pytest.mark.parametrize("door", DOORS)
def test_worker_sigkill_between_steps(door, step_timeout, spin_us):
    # spin_us=0: the victim sleeps on its socket, so the next step's doorbell is
    # written to a dead peer; that must still name the dead worker.
    vec = make_vec(door, step_timeout=step_timeout, **({} if spin_us is None else {"spin_us": spin_us}))
    pids = vec.worker_pids
    try:
        vec_reset(vec, door, seed=0)
        for k in range(5):
            vec_step(vec, door, ACTS[k])
        os.kill(pids[VICTIM], signal.SIGKILL)
        assert not wait_dead([pids[VICTIM]], 5)
        out = guarded(lambda: vec_step(vec, door, ACTS[5]), 20, vec, "step after SIGKILL")
        assert_worker_error(out.exc)
        # Noticed, not waited out: far below step_timeout (and no hang without one).
        assert out.elapsed < 10.0, f"death noticed only after {out.elapsed:.1f} s"
        again = guarded(lambda: vec_step(vec, door, ACTS[6]), 20, vec, "second step after SIGKILL")
        assert isinstance(again.exc, WorkerError), f"the next step gave {again.exc!r} instead of WorkerError"
    finally:
        closed = close_checked(vec)
    assert closed.elapsed < 10.0
    assert not wait_dead(pids, 5), "workers still alive after close()"


@pytest.mark.parametrize("door", DOORS)
def test_worker_sigkill_before_a_command(door):
    # A sleeping worker killed between calls: the command's doorbell meets a dead peer.
    vec = make_vec(door, spin_us=0.0)
    pids = vec.worker_pids
    try:
        vec_reset(vec, door, seed=0)
        vec_step(vec, door, ACTS[0])
        os.kill(pids[VICTIM], signal.SIGKILL)
        assert not wait_dead([pids[VICTIM]], 5)
        out = guarded(lambda: vec_get(vec, "spec"), 20, vec, "get_attr after SIGKILL")
        assert_worker_error(out.exc)
        assert "killed by signal 9" in str(out.exc), str(out.exc)
    finally:
        close_checked(vec)
    assert not wait_dead(pids, 5), "workers still alive after close()"


@pytest.mark.parametrize("door", DOORS)
def test_worker_sigkill_during_step(door):
    vec = make_vec(door)  # step_timeout=None: only death detection can end the wait
    pids = vec.worker_pids
    try:
        vec_reset(vec, door, seed=0)
        vec_step(vec, door, ACTS[0])
        arm(vec, door, "arm_step", "slow", index=3)  # worker 1 is busy for 1 s
        vec.step_async(ACTS[1])
        time.sleep(0.3)
        os.kill(pids[VICTIM], signal.SIGKILL)
        out = guarded(vec.step_wait, 20, vec, "step_wait() with a worker killed mid-step")
        assert_worker_error(out.exc)
        assert out.elapsed < 10.0, f"death noticed only after {out.elapsed:.1f} s"
    finally:
        close_checked(vec)
    assert not wait_dead(pids, 5)


# =========================================================================== env raises
def reference(door):
    fns = [fe.make_cartpole] * N_ENVS
    if door == "gym":
        return gym.vector.SyncVectorEnv(fns)
    from stable_baselines3.common.vec_env import DummyVecEnv

    return DummyVecEnv(fns)


def assert_consistent_with_fresh_run(vec, door, steps=60):
    """After a full seeded reset, every env (in particular those of the healthy worker 0)
    matches a fresh in-process reference run step for step."""
    ref = reference(door)
    try:
        obs = vec_reset(vec, door, seed=123)
        robs = vec_reset(ref, door, seed=123)
        np.testing.assert_array_equal(obs, robs, err_msg="observations after reset differ")
        for k in range(steps):
            obs, rew, done = vec_step(vec, door, ACTS[k])
            robs, rrew, rdone = vec_step(ref, door, ACTS[k])
            for name, a, b in (("obs", obs, robs), ("reward", rew, rrew), ("done", done, rdone)):
                np.testing.assert_array_equal(
                    np.asarray(a), np.asarray(b), err_msg=f"{name} differs from the reference at step {k}"
                )
    finally:
        ref.close()


def assert_env_error(exc, func_name):
    assert_worker_error(exc)
    assert exc.env_index == FAULTY, f"err.env_index={exc.env_index}, expected {FAULTY}"
    assert exc.exc_type and "ValueError" in exc.exc_type, f"err.exc_type={exc.exc_type!r}"
    assert exc.exc_message and f"env {FAULTY}" in exc.exc_message, f"err.exc_message={exc.exc_message!r}"
    assert exc.worker_traceback and func_name in exc.worker_traceback, (
        f"{func_name} not in the worker traceback:\n{exc.worker_traceback}"
    )


@pytest.mark.parametrize("door", DOORS)
def test_env_raises_in_step(door):
    vec = make_vec(door, step_timeout=30.0)
    try:
        vec_reset(vec, door, seed=0)
        vec_step(vec, door, ACTS[0])
        arm(vec, door, "arm_step", "raise")
        out = guarded(lambda: vec_step(vec, door, ACTS[1]), 20, vec, "step with a raising env")
        assert_env_error(out.exc, "_raise_in_step")
        assert_consistent_with_fresh_run(vec, door)
    finally:
        close_checked(vec)


@pytest.mark.parametrize("door", DOORS)
def test_env_raises_in_reset(door):
    vec = make_vec(door, step_timeout=30.0)
    try:
        vec_reset(vec, door, seed=0)
        vec_step(vec, door, ACTS[0])
        arm(vec, door, "arm_reset", True)
        out = guarded(lambda: vec_reset(vec, door, seed=1), 20, vec, "reset with a raising env")
        assert_env_error(out.exc, "_raise_in_reset")
        assert_consistent_with_fresh_run(vec, door)
    finally:
        close_checked(vec)


@pytest.mark.parametrize("indices", [None, [FAULTY], [3, FAULTY, 0]])
def test_env_raises_in_env_method_sb3(indices):
    door = "sb3"
    vec = make_vec(door, step_timeout=30.0)
    try:
        vec_reset(vec, door, seed=0)
        arm(vec, door, "explosive", True)
        out = guarded(lambda: vec.env_method("explode", indices=indices), 20, vec, "env_method")
        assert_env_error(out.exc, "_raise_in_method")
        arm(vec, door, "explosive", False)
        assert vec.env_method("explode") == list(range(N_ENVS))
        assert_consistent_with_fresh_run(vec, door)
    finally:
        close_checked(vec)


def test_env_raises_in_call_gym():
    door = "gym"
    vec = make_vec(door, step_timeout=30.0)
    try:
        vec_reset(vec, door, seed=0)
        arm(vec, door, "explosive", True)
        out = guarded(lambda: vec.call("explode"), 20, vec, "call")
        assert_env_error(out.exc, "_raise_in_method")
        arm(vec, door, "explosive", False)
        assert vec.call("explode") == tuple(range(N_ENVS))
        assert_consistent_with_fresh_run(vec, door)
    finally:
        close_checked(vec)


# =========================================================================== env hangs
@pytest.mark.parametrize("door,mode", [("gym", "hang"), ("sb3", "hang"), ("gym", "hang_ignore_term")])
def test_env_stuck_in_step(door, mode):
    vec = make_vec(door, step_timeout=1.0)
    pids = vec.worker_pids
    try:
        vec_reset(vec, door, seed=0)
        vec_step(vec, door, ACTS[0])
        arm(vec, door, "arm_step", mode)
        out = guarded(lambda: vec_step(vec, door, ACTS[1]), 20, vec, "step with a stuck env")
        assert_worker_error(out.exc)
        assert out.elapsed < 8.0, f"step_timeout=1.0 but the step took {out.elapsed:.1f} s to fail"
        again = guarded(lambda: vec_step(vec, door, ACTS[2]), 20, vec, "second step after the timeout")
        assert isinstance(again.exc, WorkerError), f"the next step gave {again.exc!r} instead of WorkerError"
    finally:
        closed = close_checked(vec, 20)
    # Grace, then SIGTERM, then (ignored SIGTERM) SIGKILL: a few seconds at most.
    assert closed.elapsed < 12.0, f"close() took {closed.elapsed:.1f} s"
    assert not wait_dead(pids, 2), "the stuck worker survived close()"


# =========================================================================== main dies
CHILD_SCRIPT = textwrap.dedent(
    """
    import json, signal, sys, time
    # Ctrl-C as in a terminal, even when this test runs where SIGINT is ignored (a
    # background job of a non-interactive shell): Python leaves an inherited SIG_IGN alone.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.modules["stable_baselines3"] = None  # SB3 is optional; skipping torch keeps this fast
    import numpy as np
    import gymnasium as gym
    import fastvec

    door, mode = sys.argv[1], sys.argv[2]
    fns = [lambda: gym.make("CartPole-v1")] * 4
    if door == "gym":
        vec = fastvec.AsyncVectorEnv(fns, num_workers=2, context="fork")
        vec.reset(seed=0)
    else:
        vec = fastvec.SubprocVecEnv(fns, start_method="fork", num_workers=2)
        vec.reset()
    acts = np.zeros(4, dtype=np.int64)
    for _ in range(20):
        vec.step(acts)
    print(json.dumps({"pids": vec.worker_pids, "shm": vec.engine.shm_name}), flush=True)
    if mode == "sleep":
        time.sleep(300)
    else:
        k = 0
        while True:
            acts[:] = k % 2
            vec.step(acts)
            k += 1
    """
)


def start_child(tmp_path, door, mode):
    script = tmp_path / "child.py"
    script.write_text(CHILD_SCRIPT)
    err_path = tmp_path / "stderr.txt"
    err = open(err_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, str(script), door, mode],
        stdout=subprocess.PIPE,
        stderr=err,
        start_new_session=True,
        cwd=str(tmp_path),
    )
    err.close()
    return proc, err_path


def read_ready(proc, err_path, timeout=60.0):
    buf = b""
    deadline = time.monotonic() + timeout
    fd = proc.stdout.fileno()
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            proc.kill()
            proc.wait()
            pytest.fail(
                f"child script never got ready (rc={proc.returncode}); stderr:\n"
                + err_path.read_text(errors="replace")[-3000:]
            )
        r, _, _ = select.select([fd], [], [], min(left, 0.5))
        if r:
            chunk = os.read(fd, 4096)
            if chunk:
                buf += chunk
    return json.loads(buf.split(b"\n")[0])


@pytest.mark.parametrize("door", DOORS)
def test_main_process_sigkill(door, tmp_path, leftovers):
    proc, err_path = start_child(tmp_path, door, "sleep")
    try:
        info = read_ready(proc, err_path)
        leftovers.add(pids=info["pids"], segment=info["shm"])
        assert os.path.exists(os.path.join(SHM_DIR, info["shm"]))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        t0 = time.monotonic()
        alive = wait_dead(info["pids"], 5.0)
        assert not alive, f"workers {alive} still running 5 s after the main process was SIGKILLed"
        gone = wait_segment_gone(info["shm"], 10.0 - (time.monotonic() - t0))
        assert gone, f"{SHM_DIR}/{info['shm']} still exists 10 s after the main process was SIGKILLed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


@pytest.mark.parametrize("door,target", [("gym", "process"), ("sb3", "process"), ("gym", "group")])
def test_main_process_ctrl_c(door, target, tmp_path, leftovers):
    proc, err_path = start_child(tmp_path, door, "loop")
    try:
        info = read_ready(proc, err_path)
        leftovers.add(pids=info["pids"], segment=info["shm"])
        time.sleep(0.3)  # well inside the stepping loop
        if target == "process":
            proc.send_signal(signal.SIGINT)
        else:  # what a terminal does: the whole foreground process group
            os.killpg(proc.pid, signal.SIGINT)
        try:
            rc = proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(
                "the main process did not exit within 20 s of SIGINT; stderr:\n"
                + err_path.read_text(errors="replace")[-3000:]
            )
        t0 = time.monotonic()
        alive = wait_dead(info["pids"], 5.0)
        gone = wait_segment_gone(info["shm"], 10.0 - (time.monotonic() - t0))
        err = err_path.read_text(errors="replace")
        assert rc != 0 and "KeyboardInterrupt" in err, f"rc={rc}; stderr:\n{err[-3000:]}"
        assert not alive, f"workers {alive} still running after Ctrl-C"
        assert gone, f"{SHM_DIR}/{info['shm']} left behind after Ctrl-C"
        assert "fastvec-worker" not in err and "fastvec/worker.py" not in err, (
            f"worker traceback on stderr:\n{err[-3000:]}"
        )
        assert err.count("Traceback (most recent call last)") <= 1, f"several tracebacks:\n{err[-3000:]}"
        assert "leaked shared_memory" not in err, f"resource tracker warning:\n{err[-3000:]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


# =========================================================================== cycles
CYCLES_SCRIPT = textwrap.dedent(
    """
    import gc, json, os, sys, warnings
    warnings.simplefilter("always", ResourceWarning)
    sys.modules["stable_baselines3"] = None  # SB3 is optional; skipping torch keeps forks cheap
    import numpy as np, psutil, gymnasium as gym
    import fastvec

    def fn():
        return gym.make("CartPole-v1")

    me = psutil.Process()

    def snapshot():
        gc.collect()
        return {"fds": me.num_fds(), "children": len(me.children(recursive=True)),
                "threads": me.num_threads()}

    names, base = [], None
    acts = np.zeros(2, dtype=np.int64)
    for i in range(200):
        if i == 20:
            base = snapshot()
        nw = 1 + (i // 2) % 2
        if i % 2 == 0:
            v = fastvec.AsyncVectorEnv([fn, fn], num_workers=nw, context="fork")
            v.reset(seed=i)
        else:
            v = fastvec.SubprocVecEnv([fn, fn], start_method="fork", num_workers=nw)
            v.reset()
        names.append(v.engine.shm_name)
        for _ in range(3):
            v.step(acts)
        v.close()
    end = snapshot()
    left = [n for n in names if os.path.exists("/dev/shm/" + n)]
    print(json.dumps({"base": base, "end": end, "left": left, "unique": len(set(names))}), flush=True)
    """
)


def test_200_create_step_close_cycles(tmp_path):
    script = tmp_path / "cycles.py"
    script.write_text(CYCLES_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=110, cwd=str(tmp_path))
    err = proc.stderr
    assert proc.returncode == 0, f"rc={proc.returncode}; stderr:\n{err[-3000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    base, end = res["base"], res["end"]
    assert end["fds"] <= base["fds"], f"open fds grew: {base['fds']} -> {end['fds']}"
    assert end["children"] <= base["children"], f"child processes grew: {base} -> {end}"
    assert end["threads"] <= base["threads"], f"threads grew: {base} -> {end}"
    assert res["left"] == [], f"segments left: {res['left']}"
    assert res["unique"] == 200, "segment names repeated across 200 envs"
    for bad in ("leaked shared_memory", "resource_tracker", "ResourceWarning", "Traceback"):
        assert bad not in err, f"{bad!r} on stderr:\n{err[-3000:]}"


# =========================================================================== soak
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("door", DOORS)
def test_soak_5m_steps_rss(door):
    n_envs, n_steps, warmup = 64, 78_125, 5_000  # 5,000,000 env-steps
    vec = make_vec(door, [fe.make_cartpole] * n_envs, num_workers=None)
    me = psutil.Process()
    acts = np.random.default_rng(1).integers(0, 2, size=(97, n_envs)).astype(np.int64)
    try:
        vec_reset(vec, door, seed=0)
        done_total = 0
        for k in range(n_steps):
            if k == warmup:
                gc.collect()
                rss0 = me.memory_info().rss
            _obs, _rew, done = vec_step(vec, door, acts[k % len(acts)])
            done_total += int(np.count_nonzero(done))
        gc.collect()
        rss1 = me.memory_info().rss
    finally:
        close_checked(vec)
    assert done_total > 10_000, "episodes should end (and autoreset) many times"
    growth = (rss1 - rss0) / 2**20
    assert growth < 20.0, f"main RSS grew by {growth:.1f} MiB over {n_steps - warmup} steps"


# =========================================================================== bad actions
BAD_DISCRETE = [
    ("too few envs", np.zeros(3, np.int64)),
    ("extra axis", np.zeros((N_ENVS, 1), np.int64)),
    ("scalar", 0),
    ("2x2", [[0, 1], [1, 0]]),
    ("fractional floats", np.full(N_ENVS, 0.5)),
    ("complex", np.zeros(N_ENVS, complex)),
    ("object array", np.array([None] * N_ENVS, dtype=object)),
    ("str array", np.array(["0"] * N_ENVS)),
    ("string", "0101"),
    ("bytes", b"\x00\x01\x00\x01"),
    ("mixed list", [0, 1, "a", 0]),
    ("above range", np.array([0, 1, 2, 0])),
    ("negative", np.array([-1, 0, 0, 0])),
    ("huge", np.full(N_ENVS, 2**40, dtype=np.int64)),
    ("uint64 huge", np.full(N_ENVS, 2**63, dtype=np.uint64)),
    ("NaN array", np.array([np.nan, 0, 0, 0])),
    ("NaN list", [float("nan")] * N_ENVS),
    ("None", None),
]
BAD_BOX = [  # Pendulum: Box(-2, 2, (1,), float32), 2 envs
    ("NaN", np.array([[np.nan], [0.0]])),
    ("inf", np.array([[np.inf], [0.0]])),
    ("above range", np.array([[5.0], [0.0]])),
    ("below range", np.array([[0.0], [-5.0]])),
    ("flat", np.zeros(2, np.float32)),
    ("wrong last dim", np.zeros((2, 2), np.float32)),
    ("string", "ab"),
    ("object array", np.array([[None], [None]], dtype=object)),
    ("None", None),
]


STRICT = {"gym": {"action_check": "bounds"}, "sb3": {}}  # the SB3 door's rule is "bounds"


def _bad_action_failures(vec, door, cases, valid):
    failures = []
    for name, action in cases:
        try:
            vec_step(vec, door, action)
        except ValueError:
            continue
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{name}: {type(exc).__name__}: {exc}"[:300])
            if isinstance(exc, WorkerError):
                break  # dispatched to a worker: the env is no longer trustworthy
        else:
            failures.append(f"{name}: accepted")
    out = guarded(lambda: vec_step(vec, door, valid), 20, vec, "valid step after bad actions")
    if out.exc is not None:
        failures.append(f"valid step after the bad ones raised {type(out.exc).__name__}: {out.exc}")
    return failures


@pytest.mark.parametrize("door", DOORS)
def test_bad_actions_discrete(door):
    # fastvec's "bounds" rule (the gymnasium door's default "dtype" rule passes out-of-range
    # values on, as gymnasium does: tests/test_pickled_leaves.py)
    vec = make_vec(door, **STRICT[door])
    try:
        vec_reset(vec, door, seed=0)
        vec_step(vec, door, ACTS[0])
        failures = _bad_action_failures(vec, door, BAD_DISCRETE, ACTS[1])
        assert not failures, "bad actions not rejected with ValueError before dispatch:\n  " + "\n  ".join(failures)
        # Nothing reached the envs: exactly the two valid steps were taken.
        assert vec_get(vec, "steps") == [2] * N_ENVS
    finally:
        close_checked(vec)


@pytest.mark.parametrize("door", DOORS)
def test_bad_actions_box(door):
    vec = make_vec(door, [fe.make_pendulum] * 2, num_workers=1, **STRICT[door])
    try:
        vec_reset(vec, door, seed=0)
        valid = np.zeros((2, 1), np.float32)
        failures = _bad_action_failures(vec, door, BAD_BOX, valid)
        assert not failures, "bad actions not rejected with ValueError before dispatch:\n  " + "\n  ".join(failures)
        assert vec_get(vec, "_elapsed_steps") == [1, 1]  # TimeLimit's counter
    finally:
        close_checked(vec)


# =========================================================================== garbage
GARBAGE_CASES = [("gym", k) for k in [*fe.GARBAGE, "bad_info"]] + [("sb3", "junk_header"), ("sb3", "bad_info")]


@pytest.mark.parametrize("door,kind", GARBAGE_CASES)
def test_garbage_from_worker(door, kind):
    """A worker writes a malformed control message (or a reply payload the parent cannot
    unpickle): within three steps the parent raises WorkerError; no hang, no other error."""
    vec = make_vec(door, step_timeout=2.0)
    pids = vec.worker_pids
    try:
        vec_reset(vec, door, seed=0)
        vec_step(vec, door, ACTS[0])
        arm(vec, door, "arm_step", kind)
        out = None
        for k in range(1, 4):
            out = guarded(lambda: vec_step(vec, door, ACTS[k]), 8, vec, f"step {k} after garbage ({kind})")
            if out.exc is not None:
                break
        assert out.exc is not None, f"garbage ({kind}) went unnoticed for 3 steps"
        assert isinstance(out.exc, WorkerError), (
            f"garbage ({kind}) raised {type(out.exc).__module__}.{type(out.exc).__name__}: {out.exc}"
        )
        assert out.exc.worker == VICTIM, f"err.worker={out.exc.worker}: {out.exc}"
    finally:
        close_checked(vec)
    assert not wait_dead(pids, 5)


# =========================================================================== restart
def _check_healthy_after_restart(vec, door, steps=30):
    for k in range(steps):
        out = guarded(lambda: vec_step(vec, door, ACTS[100 + k]), 20, vec, f"step {k} after restart")
        assert out.exc is None, f"step {k} after the restart raised {out.exc!r}"
        obs, rew, _done = out.value
        assert obs.shape == (N_ENVS, 4) and np.isfinite(obs).all()
        assert np.isin(np.asarray(rew), [0.0, 1.0]).all()  # 0.0: gym's NEXT_STEP reset steps


def env_pids(vec, door):
    """The pid of the process each env lives in (asked from the env itself)."""
    return list(vec.call("pid") if door == "gym" else vec.env_method("pid"))


def _replaced(vec, old_pids):
    new = vec.worker_pids
    assert new[0] == old_pids[0], "the healthy worker was replaced"
    assert new[VICTIM] != old_pids[VICTIM], "the failed worker kept its pid"
    assert not is_dead(new[VICTIM]), "the replacement worker is not running"
    assert not wait_dead([old_pids[VICTIM]], 5), "the failed worker is still running"
    return new


def step_with_infos(vec, door, actions):
    """(dones, per-env info dicts) from either door."""
    if door == "gym":
        _obs, _rew, term, trunc, info = vec.step(actions)
        mask = info.get("_fastvec_restarted", np.zeros(N_ENVS, bool))
        return term | trunc, [{"fastvec_restarted": True} if mask[i] else {} for i in range(N_ENVS)]
    _obs, _rew, dones, infos = vec.step(actions)
    return dones, infos


def assert_restarted(out, vec):
    """The step returned, warned, and reported exactly the victim's envs as restarted."""
    assert out.exc is None, f"with restart_on_error the step must not raise, got {out.exc!r}"
    (dones, infos), caught = out.value
    restarted = tuple(i for i in range(N_ENVS) if infos[i].get("fastvec_restarted"))
    assert restarted == VICTIM_ENVS, f"restarted envs {restarted}, expected {VICTIM_ENVS}"
    assert all(dones[i] for i in VICTIM_ENVS), f"restarted envs must end their episode: {dones}"
    assert any(issubclass(w.category, RuntimeWarning) and "restarted worker" in str(w.message) for w in caught), [
        str(w.message) for w in caught
    ]
    record = vec.engine.restarts[-1]
    assert record["worker"] == VICTIM and tuple(record["envs"]) == VICTIM_ENVS


def _restart_step(vec, door, actions):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = step_with_infos(vec, door, actions)
    return result, caught


@pytest.mark.parametrize("door", DOORS)
def test_restart_on_error_after_sigkill(door):
    vec = make_vec(door, restart_on_error=True)
    try:
        old = vec.worker_pids
        vec_reset(vec, door, seed=0)
        for k in range(5):
            vec_step(vec, door, ACTS[k])
        os.kill(old[VICTIM], signal.SIGKILL)
        assert not wait_dead([old[VICTIM]], 5)
        out = guarded(lambda: _restart_step(vec, door, ACTS[5]), 30, vec, "step hitting the dead worker")
        assert_restarted(out, vec)
        new = _replaced(vec, old)
        _check_healthy_after_restart(vec, door)
        assert env_pids(vec, door) == [old[0], old[0], new[1], new[1]]
        steps = vec_get(vec, "steps")
        assert steps[2] <= 30 and steps[3] <= 30, f"envs 2, 3 were not rebuilt: step counts {steps}"
    finally:
        close_checked(vec)


@pytest.mark.parametrize("door", DOORS)
def test_restart_on_error_after_hang(door):
    vec = make_vec(door, step_timeout=1.0, restart_on_error=True)
    try:
        old = vec.worker_pids
        vec_reset(vec, door, seed=0)
        vec_step(vec, door, ACTS[0])
        arm(vec, door, "arm_step", "hang")
        out = guarded(lambda: _restart_step(vec, door, ACTS[1]), 30, vec, "step hitting the stuck worker")
        assert_restarted(out, vec)
        new = _replaced(vec, old)
        _check_healthy_after_restart(vec, door)
        assert env_pids(vec, door) == [old[0], old[0], new[1], new[1]]
    finally:
        close_checked(vec)


@pytest.mark.parametrize("door", DOORS)
def test_restart_on_error_after_env_raises(door):
    vec = make_vec(door, restart_on_error=True)
    try:
        old = vec.worker_pids
        vec_reset(vec, door, seed=0)
        vec_step(vec, door, ACTS[0])
        arm(vec, door, "arm_step", "raise")
        out = guarded(lambda: _restart_step(vec, door, ACTS[1]), 30, vec, "step with a raising env")
        assert_restarted(out, vec)
        assert vec.engine.restarts[-1]["error"].startswith(f"env {FAULTY} raised"), vec.engine.restarts[-1]
        _replaced(vec, old)
        _check_healthy_after_restart(vec, door)
    finally:
        close_checked(vec)


# =========================================================================== security
def _random_bits(suffix):
    if set(suffix) <= set(string.hexdigits.lower()):
        return 4 * len(suffix)
    if set(suffix) <= set(string.ascii_letters + string.digits + "-_"):
        return 6 * len(suffix)
    return 8 * len(suffix)


def test_segment_private_and_unguessable():
    old_umask = os.umask(0)  # a permissive umask must not widen the segment's mode
    try:
        a = make_vec("gym", [fe.make_cartpole] * 2, num_workers=1)
    finally:
        os.umask(old_umask)
    b = make_vec("sb3", [fe.make_cartpole] * 2, num_workers=1)
    try:
        names = []
        for vec in (a, b):
            name = vec.engine.shm_name.lstrip("/")
            names.append(name)
            st = os.stat(os.path.join(SHM_DIR, name))
            assert st.st_mode & 0o777 == 0o600, f"{name} has mode {oct(st.st_mode & 0o777)}"
            assert st.st_uid == os.getuid()
            assert name.startswith("fastvec_")
            bits = _random_bits(name[len("fastvec_") :])
            assert bits >= 96, f"{name}: only ~{bits} random bits"
        assert names[0] != names[1]
    finally:
        close_checked(a)
        close_checked(b)
