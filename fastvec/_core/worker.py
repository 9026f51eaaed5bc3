"""The worker process: builds its envs, attaches the segment, serves commands.

Steps are served by the compiled loop in ``stepper.Stepper.serve``; everything rarer
(reset, attribute access, method calls, close) is handled here in Python.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import statistics
import sys
import threading
import time
import traceback

import cloudpickle
import numpy as np
from gymnasium import spaces as gym_spaces

from ..errors import cause_class_blob
from . import channel
from . import protocol as P
from .infos import InfoPicklingError, dump_records, table_kind
from .pickled import PickledRows, dumps
from .segment import Ring, SegmentPlan, attach_segment, build_nested, leaves_of, pickled_arrays
from .stepper import Stepper, StepperSetup

_PARENT_POLL_S = 0.5


def _watch_parent(main_pid: int, direct_child: bool) -> None:
    """Exit when the main process is gone, even if an env is stuck in C code holding
    no GIL... or in Python: this thread still gets the GIL within the switch interval."""
    ppid = os.getppid()
    while True:
        time.sleep(_PARENT_POLL_S)
        if direct_child:
            gone = os.getppid() != ppid
        else:  # forkserver: our parent is the server, watch the main process itself
            try:
                os.kill(main_pid, 0)
                gone = False
            except ProcessLookupError:
                gone = True
            except PermissionError:
                gone = False
        if gone:
            os._exit(1)


def _error_payload(exc: BaseException, env_index: int | None, during: str) -> bytes:
    return pickle.dumps(
        {
            "env_index": env_index,
            "exc_type": f"{type(exc).__module__}.{type(exc).__qualname__}".replace("builtins.", ""),
            "message": str(exc),
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            "during": during,
            "exc_class": cause_class_blob(exc),
        }
    )


def _is_wrapped(env, wrapper_class) -> bool:
    # Same rule as SB3's env_util.is_wrapped, without importing SB3 in the worker.
    while hasattr(env, "env"):
        if isinstance(env, wrapper_class):
            return True
        env = env.env
    return isinstance(env, wrapper_class)


def _do_call(env, kind: str, name, args, kwargs, value):
    if kind == "call":  # gymnasium VectorEnv.call: call if callable, else return the value
        attr = env.get_wrapper_attr(name)
        return attr(*args, **kwargs) if callable(attr) else attr
    if kind == "env_method":  # SB3
        return env.get_wrapper_attr(name)(*args, **kwargs)
    if kind == "get_attr":
        return env.get_wrapper_attr(name)
    if kind == "has_attr":
        try:
            env.get_wrapper_attr(name)
            return True
        except AttributeError:
            return False
    if kind == "set_attr":  # SB3: plain setattr on the outermost wrapper
        setattr(env, name, value)
        return None
    if kind == "set_wrapper_attr":  # gymnasium
        env.set_wrapper_attr(name, value)
        return None
    if kind == "is_wrapped":
        return _is_wrapped(env, value)
    if kind == "render":
        return env.render()
    raise ValueError(f"unknown call kind {kind!r}")


def _close_all(envs) -> None:
    """Close every env; one that fails to close does not keep the others open."""
    for env in envs:
        try:
            env.close()
        except Exception:
            pass


def _probe(fd, fns, rows, seconds: float) -> list | None:
    """Time throwaway instances of envs ``rows`` (built by ``fns``): reset, then step on
    random actions (resetting at episode ends) for at least ``PROBE_ROUNDS`` rounds and
    about ``seconds``; close them. Returns each env's nanoseconds per step, or None after
    sending the error of an env that failed.

    A step's cost is its CPU time: wall time counts the moments the OS or the hypervisor
    ran something else, which on a busy machine moved alike envs' costs by half from one
    start to the next. An env that waits (sleep, I/O) costs its wall time, though, so
    the cost is the larger of the mean CPU time and the fastest tenth of wall times."""
    envs: list = []
    j = 0
    during = "env creation (placement probe)"
    try:
        for j in range(len(fns)):  # j names the env in an error report
            envs.append(fns[j]())
        during = "reset (placement probe)"
        for j in range(len(envs)):
            envs[j].reset()
        during = "step (placement probe)"
        wall: list[list[int]] = [[] for _ in envs]
        cpu = [0] * len(envs)
        wall_now, cpu_now = time.perf_counter_ns, time.thread_time_ns
        deadline = wall_now() + int(seconds * 1e9)
        rounds = 0
        while rounds < PROBE_ROUNDS or (rounds < PROBE_MAX_ROUNDS and wall_now() < deadline):
            for j, env in enumerate(envs):
                t0, c0 = wall_now(), cpu_now()
                _obs, _rew, term, trunc, _info = env.step(env.action_space.sample())
                if term or trunc:
                    env.reset()
                cpu[j] += cpu_now() - c0
                wall[j].append(wall_now() - t0)
            rounds += 1
    except BaseException as exc:
        channel.send_header(fd, P.REPLY_ERROR, 0, 0, _error_payload(exc, int(rows[j]), during))
        return None
    finally:
        _close_all(envs)
    return [max(c / len(w), statistics.fmean(sorted(w)[: max(1, len(w) // 10)])) for c, w in zip(cpu, wall)]


# A probe steps each env at least this many times, and at most PROBE_MAX_ROUNDS.
PROBE_ROUNDS = 4
PROBE_MAX_ROUNDS = 2000


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What worker ``index`` starts from (``Supervisor.spawn`` makes one per start):
    the factories of envs ``rows`` pickled in ``fns_blob``, ``num_envs`` in all,
    autoreset ``mode`` (a ``protocol`` code), the main process to watch, the parent's
    descriptors to close after a fork, and ``probe_s`` (> 0: time the envs first)."""

    index: int
    fns_blob: bytes
    rows: np.ndarray
    num_envs: int
    mode: int
    main_pid: int
    close_fds: list[int]
    probe_s: float = 0.0


def worker_main(spec: WorkerSpec, conn) -> None:
    """Worker ``spec.index``: build its envs, attach the segment, serve. With
    ``spec.probe_s > 0`` the envs in ``spec.rows`` are first timed on throwaway
    instances (``_probe``); the parent then sends ``CMD_BUILD`` with the envs this worker
    runs (``fastvec._core.placement``)."""
    _detach(spec)
    fd = conn.fileno()
    envs: list = []
    try:
        rows, fns_blob = spec.rows, spec.fns_blob
        if spec.probe_s > 0:
            placed = _probe_then_place(fd, spec)
            if placed is None:
                return
            rows, fns_blob = placed
        if not _build_envs(fd, cloudpickle.loads(fns_blob), rows, envs) or not _send_spaces(fd, envs, rows):
            return
        # The parent lays out the segment and tells us where it is; the stepper holds the
        # views (the mapping goes with the last of them, when this frame ends).
        stepper, pickled, chan = _attach(fd, spec, envs, rows)
        channel.send_header(fd, P.REPLY_DONE, 0, 0)
        _serve(chan, stepper, envs, rows, pickled=pickled)
    except channel.PeerClosed:
        pass  # the parent went away; nothing to answer
    finally:
        _close_all(envs)
        # The parent owns and unlinks the segment.
        conn.close()


def _detach(spec: WorkerSpec) -> None:
    """Leave Ctrl-C to the parent, close the other workers' sockets a fork handed us,
    and watch the main process."""
    # Ctrl-C goes to the whole process group; the parent decides what happens.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for fd in spec.close_fds:  # fork: parent ends of other workers' sockets
        try:
            os.close(fd)
        except OSError:
            pass
    direct = os.getppid() == spec.main_pid
    threading.Thread(target=_watch_parent, args=(spec.main_pid, direct), daemon=True).start()


def _probe_then_place(fd: int, spec: WorkerSpec) -> tuple | None:
    """Time the envs, send the costs, and receive the envs to build: ``(rows, fns_blob)``,
    or None after reporting an env that failed."""
    costs = _probe(fd, cloudpickle.loads(spec.fns_blob), spec.rows, spec.probe_s)
    if costs is None:
        return None
    channel.send_header(fd, P.REPLY_RESULT, 0, 0, pickle.dumps(costs))
    cmd, _, _, n = channel.recv_header(fd)
    if cmd != P.CMD_BUILD:
        raise ValueError(f"expected the envs to build after a probe, got command {cmd}")
    return pickle.loads(channel.recv_payload(fd, n))


def _build_envs(fd: int, fns: list, rows, envs: list) -> bool:
    """Append each env ``fns`` make to ``envs`` (the caller closes them whatever
    happens); False after reporting one that failed."""
    for j, fn in enumerate(fns):
        try:
            envs.append(fn())
        except BaseException as exc:
            channel.send_header(fd, P.REPLY_ERROR, 0, 0, _error_payload(exc, int(rows[j]), "env creation"))
            return False
    return True


def _send_spaces(fd: int, envs: list, rows) -> bool:
    """Report each env's spaces, metadata, render mode and spec; False if they could not
    be pickled (the error sent instead)."""
    spaces = [
        (
            env.observation_space,
            env.action_space,
            dict(getattr(env, "metadata", {}) or {}),
            getattr(env, "render_mode", None),
            getattr(env, "spec", None),
        )
        for env in envs
    ]
    try:
        channel.send_header(fd, P.REPLY_READY, 0, 0, dumps(spaces))
    except Exception as exc:
        channel.send_header(fd, P.REPLY_ERROR, 0, 0, _error_payload(exc, int(rows[0]), "sending spaces"))
        return False
    return True


def _attach(fd: int, spec: WorkerSpec, envs: list, rows) -> tuple:
    """Read ``CMD_SPACES`` (where the segment is, the spaces, the spin) and map the
    segment: ``(Stepper, PickledRows or None, WorkerChannel)``."""
    _cmd, _, _, n = channel.recv_header(fd)  # CMD_SPACES
    shm_name, entries, obs_space, act_space, spin_us = pickle.loads(channel.recv_payload(fd, n))
    arrays = SegmentPlan.from_entries(entries).arrays(attach_segment(shm_name))
    arrays.update(pickled_arrays(obs_space, act_space, arrays["rewards"].shape[0], spec.num_envs))
    ring = Ring.of(arrays)
    obs_leaves = leaves_of(obs_space, pickled=True)
    stepper = Stepper(
        StepperSetup(
            envs=envs,
            rows=rows,
            num_envs=spec.num_envs,
            mode=spec.mode,
            obs_leaves=ring.obs,
            final_leaves=ring.final,
            obs_paths=[leaf.path for leaf in obs_leaves],
            act_leaves=ring.act,
            act_space=act_space,
            rewards=ring.rewards,
            terminated=ring.terminated,
            truncated=ring.truncated,
            build_nested=build_nested,
            kind_of=table_kind,
            dump_records=dump_records,
            info_table=arrays.get("info_table"),
            info_mask=arrays.get("info_mask"),
            int_paths=[
                leaf.path for leaf in obs_leaves if isinstance(leaf.space, gym_spaces.Discrete) and not leaf.pickled
            ],
            final_pytype=arrays.get("final_pytype"),
            cost=arrays.get("env_cost"),
            paused=arrays.get("paused"),
        )
    )
    pickled = PickledRows.of(ring, obs_leaves, leaves_of(act_space, pickled=True))
    if pickled is not None:
        stepper.report_pickled = lambda slot, records, ended: pickled.step_report(slot, rows, records, ended)
    return stepper, pickled, channel.WorkerChannel(arrays["ctl"], spec.index, fd, spin_us)


def _serve(chan, stepper, envs, rows, *, pickled) -> None:
    """Answer commands until the parent closes the socket; ``rows[j]``: local env j's index."""
    while True:
        try:
            stepper.serve(chan)  # returns on the first command that is not a plain step
            cmd, slot, _, blob = chan.current_command()
            payload = pickle.loads(blob) if blob is not None else None
            if cmd == P.CMD_STEP:  # a step with pickled actions
                if pickled is None:
                    raise ValueError("a step with a payload, but no pickled action leaves")
                pickled.put_actions(slot, rows, payload)
                stepper.answer(chan, slot)
                continue
        except channel.PeerClosed:
            raise
        except Exception as exc:
            env_index = stepper.current if stepper.current >= 0 else None
            stepper.current = -1
            if isinstance(exc, InfoPicklingError):
                during = "sending the step's infos"
            else:
                during = "step" if env_index is not None else "reading a command"
            chan.reply(P.REPLY_ERROR, 0, _error_payload(exc, env_index, during))
            continue
        if cmd == P.CMD_RESET:
            _reset(chan, stepper, envs, rows, slot, payload, pickled=pickled)
        elif cmd == P.CMD_CALL:
            _call(chan, envs, rows, payload)
        else:
            chan.reply(
                P.REPLY_ERROR, 0, _error_payload(ValueError(f"unknown command {cmd}"), None, "reading a command")
            )


def _reset(chan, stepper, envs, rows, slot, payload, *, pickled) -> None:
    # payload: list of (local_index, kwargs for env.reset)
    infos = []
    j = -1
    try:
        for j, kwargs in payload:
            obs, info = envs[j].reset(**kwargs)
            stepper.needs_reset[j] = 0
            stepper.write_reset_obs(slot, j, obs)
            infos.append((j, info))
    except Exception as exc:
        chan.reply(P.REPLY_ERROR, 0, _error_payload(exc, int(rows[j]), "reset"))
        return
    if pickled is not None:
        infos = pickled.reset_report(slot, rows, [j for j, _kw in payload], infos)
    _reply_result(chan, infos, int(rows[max(j, 0)]))


def _call(chan, envs, rows, payload) -> None:
    kind, name, args, kwargs, targets = payload  # targets: list of (local_index, value)
    results = []
    j = -1
    try:
        for j, value in targets:
            results.append(_do_call(envs[j], kind, name, args, kwargs, value))
    except Exception as exc:
        chan.reply(P.REPLY_ERROR, 0, _error_payload(exc, int(rows[j]), f"{kind}({name!r})"))
        return
    _reply_result(chan, results, int(rows[max(j, 0)]))


def _reply_result(chan, result, env_index) -> None:
    try:
        blob = dumps(result)
    except Exception as exc:
        chan.reply(
            P.REPLY_ERROR,
            0,
            _error_payload(TypeError(f"the result could not be pickled back to the parent: {exc}"), env_index, "reply"),
        )
        return
    chan.reply(P.REPLY_RESULT, 0, blob)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("fastvec._core.worker is started by fastvec's engine, not run directly")
