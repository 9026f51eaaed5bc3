"""The async pipeline (``pipeline=async``): a learner process learns on one rollout
while the envs fill the next.

Three kinds of process: the **collector** (the process that calls ``train``: it acts,
steps the engine and records, exactly as the lock-step loop's collect), the engine's
**workers**, and one **learner** process that owns the optimiser, computes the targets
and updates. Nothing of a rollout is copied between them:

- the engine's ring holds K = ``rollout_buffers`` rollouts (``K * (T + 1)`` slots;
  rollout r fills section ``r % K``, a ``RingSection``), and a second segment, the
  pipeline's, holds what acting records beside it (the Gaussian's raw samples,
  log-probs and values where the policy gives them while acting) and the weights
  version that acted at each step. The learner maps both.
- new weights go back through a seqlock (``fastvec.train.seqlock``) in the pipeline
  segment: the learner publishes its weights (with the policy's buffers: the
  observation normaliser), its optimiser moments and its train state after every
  update; the collector takes up a new version between env steps (one atomic load per
  step while nothing changed). What is published is also the learner's **safe point**:
  the collector writes checkpoints from it, and can after the learner died.
- control is a pipe with one message per rollout each way (``learn`` and ``done``).

**Policy lag.** Version v is the weights after v updates; rollout r (counted from the
run's start) may begin once version ``r - max_policy_lag`` is out (counted from the
starting version) and its section is free (the learner has finished rollout r - K).
So the collector waits (back-pressure) rather than act with older weights: no data
older than the bound is ever learned from, nothing is dropped. Every step records the
version that acted; the learner computes values, old log-probs and the truncation
bootstrap with those weights (it keeps the versions it published), so the PPO ratio is
taken against the policy that acted; ``targets=vtrace`` (or ``auto``) also clips the targets'
importance weights towards its current weights.

``max_policy_lag=0`` is the lock-step run exactly: the collector waits for each update,
and torch's RNG state travels with each rollout and each version (one stream, drawn in
the same order as lock-step's). With a lag the two processes draw from streams of their
own (the learner's is seeded from ``seed``) and which version acts at which step depends
on timing: runs are not repeatable step for step.

**Failure.** A learner that dies or raises is a ``LearnerError`` at the collector's
next wait or hand-over; a collector that dies (the learner sees its pipe close, or its
parent change) makes the learner write a checkpoint of its last safe point into the
run directory and exit. The learner ignores SIGINT: Ctrl-C and SIGTERM reach the
collector, which stops at its next safe point, lets the learner finish the rollouts
handed over, and stops it.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from .._core.layout import SegmentPlan
from .._core.shm import create_segment, release_segment
from . import seqlock
from .config import PPOConfig
from .rollout import Rollout

__all__ = ["LearnerError", "LearnerProcess", "RingSection", "Pipeline", "check_backend", "ring_slots"]

_HEADER = 8  # int64: seq, version, blob length
_POLL_S = 0.1  # how often a wait looks at the other process's health


class LearnerError(RuntimeError):
    """The async pipeline's learner process raised or died."""


def ring_slots(cfg: PPOConfig) -> int:
    """The engine ring's slots for ``cfg``: ``T + 1`` in lock-step, K of those in async."""
    k = cfg.rollout_buffers if cfg.pipeline == "async" else 1
    return k * (cfg.n_steps + 1)


def check_backend(cfg: PPOConfig, *, venv=None, backend: str = "engine") -> None:
    """ValueError (before any process starts) where the backend cannot do what ``cfg``
    asks: ``pipeline=async`` needs fastvec's own engine on this machine (the learner maps
    its ring), and so does a ``placement`` (Ray's actors and other vector envs run their
    envs in order)."""
    if cfg.placement is not None and (venv is not None or backend != "engine"):
        where = f"a vector env of your own ({type(venv).__name__})" if venv is not None else f"backend={backend!r}"
        raise ValueError(f"placement={cfg.placement} needs fastvec's engine on this machine, not {where}")
    if cfg.pipeline != "async":
        return
    if venv is not None:
        raise ValueError(
            "pipeline=async needs fastvec's engine (its learner process maps the engine's ring); "
            f"a vector env of your own ({type(venv).__name__}) cannot serve it: pass an env id"
        )
    if backend != "engine":
        raise ValueError(
            f"pipeline=async needs backend='engine', not {backend!r} (Ray actors' rings are on other nodes)"
        )


class RingSection:
    """Section k of an ``EngineStorage`` whose ring holds K rollouts: the
    ``RolloutStorage`` protocol over slots ``[k (T + 1), (k + 1) (T + 1))``, so ``PPO``
    acts into it and learns from it as from a ring of its own."""

    def __init__(self, storage, k: int, T: int):
        self.storage, self.base = storage, k * (T + 1)
        rows = slice(self.base, self.base + T + 1)
        self.obs, self.final_obs, self.act = storage.obs[rows], storage.final_obs[rows], storage.act[rows]
        self.rewards, self.terminated, self.truncated = (
            storage.rewards[rows],
            storage.terminated[rows],
            storage.truncated[rows],
        )
        self.kind, self.num_envs, self.num_workers = storage.kind, storage.num_envs, storage.num_workers
        self.single_observation_space = storage.single_observation_space
        self.single_action_space = storage.single_action_space

    @property
    def on_restart(self):
        return self.storage.on_restart

    @on_restart.setter
    def on_restart(self, fn) -> None:
        self.storage.on_restart = fn

    @property
    def groups(self):
        return self.storage.groups

    @property
    def restarts(self):
        return self.storage.restarts

    @property
    def worker_pids(self):
        return self.storage.worker_pids

    def arrays(self) -> list:
        return []  # the whole ring is the storage's to pin

    def reset(self, seed) -> None:
        self.storage.reset(seed, slot=self.base)

    def step(self, slot: int) -> None:
        self.storage.step(self.base + slot)

    def send(self, g: int, slot: int) -> None:
        self.storage.send(g, self.base + slot)

    def recv(self, g: int, slot: int) -> None:
        self.storage.recv(g, self.base + slot)

    def lost_wakeups(self):
        return self.storage.lost_wakeups()

    def transport(self) -> dict:
        return self.storage.transport()

    def close(self) -> None:
        self.storage.close()


# ---------------------------------------------------------------------- shared layout
def _published(policy, flat_param) -> list[torch.Tensor]:
    """What a weights version is: the flat parameters and every buffer of the policy
    (the observation normaliser's statistics among them)."""
    return [flat_param.data, *policy.buffers()]


def _plan(cfg: PPOConfig, N: int, policy, flat_param, blob_bytes: int) -> SegmentPlan:
    """The pipeline segment: what acting records per section, and the published block."""
    K, T = cfg.rollout_buffers, cfg.n_steps
    plan = SegmentPlan()
    dim = getattr(policy.dist, "dim", 1)
    plan.add("raw", (K, T, N, dim), np.float32)
    plan.add("logp", (K, T, N), np.float32)
    plan.add("values", (K, T + 1, N), np.float32)
    plan.add("versions", (K, T), np.int64)
    plan.add("header", (_HEADER,), np.int64)
    for i, t in enumerate(_published(policy, flat_param)):
        plan.add(f"w{i}", tuple(t.shape), t.detach().cpu().numpy().dtype)
    P = flat_param.numel()
    plan.add("adam_m", (P,), np.float32)
    plan.add("adam_v", (P,), np.float32)
    plan.add("blob", (blob_bytes,), np.uint8)
    return plan


def _shared_rollout(arrays: dict, k: int) -> dict:
    return {"raw": arrays["raw"][k], "logp": arrays["logp"][k], "values": arrays["values"][k]}


def _weights_views(arrays: dict, n: int) -> list[np.ndarray]:
    return [arrays[f"w{i}"] for i in range(n)]


def _merge_state(learner: dict, snapshot: dict) -> dict:
    """A train state (``PPO.train_state``'s keys) from the learner's state after update u
    and the collector's ``snapshot`` of the rollout that update learned from."""
    st = dict(learner)
    st["env_steps"] = snapshot["env_steps"]
    st["tracker"] = snapshot["tracker"]
    st["curve"] = list(snapshot["curve"])
    st["times"] = {**learner["times"], "act": snapshot["t_act"], "env": snapshot["t_env"]}
    return st


def publish(arrays: dict, views: list[np.ndarray], published: list[torch.Tensor], ppo) -> None:
    """Write ``ppo``'s safe point into the published block (one writer at a time: the
    collector once before the learner starts, then the learner after every update):
    weights and buffers, the optimiser's moments, the train state, as version ``updates``."""
    h = arrays["header"]
    blob = pickle.dumps(_strip_moments(ppo.train_state()))
    if len(blob) > len(arrays["blob"]):
        raise RuntimeError(f"the learner's train state grew to {len(blob)} bytes (room for {len(arrays['blob'])})")
    seqlock.write_begin(h)
    for view, t in zip(views, published, strict=True):
        np.copyto(view, t.detach().cpu().numpy())
    np.copyto(arrays["adam_m"], ppo.opt.m.detach().cpu().numpy())
    np.copyto(arrays["adam_v"], ppo.opt.v.detach().cpu().numpy())
    arrays["blob"][: len(blob)] = np.frombuffer(blob, np.uint8)
    h[2] = len(blob)
    seqlock.write_end(h, ppo.updates)


def _snapshot(ppo) -> dict:
    """The collector's part of a train state, as of the rollout just collected."""
    return {
        "env_steps": ppo.env_steps,
        "tracker": ppo.tracker.state(),
        "curve": list(ppo.curve),
        "t_act": ppo.t_act,
        "t_env": ppo.t_env,
    }


# ---------------------------------------------------------------------- the collector's side
class Pipeline:
    """The collector's end: starts the learner, hands rollouts over, takes up weights.

    ``ppo``: the collector's ``PPO`` (over section 0 of ``storage``, an ``EngineStorage``
    with ``ring_slots(cfg)`` slots; it acts on the CPU, into shared memory); ``device``:
    the learner's; ``checkpoint_info``: ``(run_dir, env_id, env_kwargs, mix)`` for the
    learner's checkpoint should the collector die."""

    learner_separate_buffers: bool | None = None
    """The learner's ``PPO(separate_buffers=)``: None (exactly off the CPU); the tests set
    True to run a GPU learner's copies on the CPU."""

    def __init__(
        self,
        cfg: PPOConfig,
        storage,
        ppo,
        device: torch.device,
        checkpoint_info: tuple,
        launched: LearnerProcess | None = None,
    ):
        self.cfg, self.storage, self.ppo = cfg, storage, ppo
        self.K, self.T, self.device = cfg.rollout_buffers, cfg.n_steps, device
        self.proc: Any = None  # the learner's process and socket (None once closed)
        self.conn: Any = None
        self.segment: Any = None
        try:
            self._lay_out()
            self._start_learner(checkpoint_info, launched)
        except BaseException:
            if launched is not None and self.proc is None:
                launched.close()
            self.close()
            raise

    def _lay_out(self) -> None:
        """The pipeline's segment and the K rollouts over the ring's sections."""
        cfg, storage, ppo = self.cfg, self.storage, self.ppo
        self.sections = [RingSection(storage, k, self.T) for k in range(self.K)]
        pol = ppo.policy
        self.state = ppo.train_state()
        blob = len(pickle.dumps(_strip_moments(self.state))) * 2 + 65536
        self.plan = _plan(cfg, storage.num_envs, pol, ppo.flat_param, blob)
        self.segment = create_segment(self.plan.size)
        self.arrays = self.plan.arrays(self.segment.buf)
        self.header: Any = self.arrays["header"]
        self.published = _published(pol, ppo.flat_param)
        self.views = [torch.from_numpy(w) for w in _weights_views(self.arrays, len(self.published))]
        self.rollouts = []
        for k, sec in enumerate(self.sections):
            ro = Rollout(sec, pol, self.T, ppo.device, shared=_shared_rollout(self.arrays, k))
            ppo.use_rollout(sec, ro, None)
            self.rollouts.append((sec, ro, ppo._views_by_group()))
        ppo.use_rollout(*self.rollouts[0])
        self.version = self.start_version = ppo.updates
        self.collected = 0  # rollouts collected (r of the next one)
        self.handed = 0  # rollouts handed over to the learner
        self.learned = 0  # rollouts the learner has finished
        self.snapshots: dict[int, dict] = {}  # rollout r -> the collector's state after it
        self.summary: dict = {}
        self.lag_counts = np.zeros(cfg.max_policy_lag + self.K + 1, np.int64)
        self.t_wait = 0.0  # the collector's time waiting for the learner
        self.learner_stats: dict = {}
        self._versions: Any = None

    def _start_learner(self, checkpoint_info: tuple, launched: LearnerProcess | None) -> None:
        ppo, eng = self.ppo, self.storage.engine
        spec = {
            "cfg": self.cfg.to_dict(),
            "spaces": (self.storage.single_observation_space, self.storage.single_action_space),
            "num_envs": self.storage.num_envs,
            "engine": (eng.shm_name, eng.segment_entries),
            "pipeline": (self.segment.name, self.plan.entries),
            "policy": {k: v.detach().cpu() for k, v in ppo.policy.state_dict().items()},
            "state": self.state,
            "device": str(self.device),
            "separate_buffers": self.learner_separate_buffers,
            "checkpoint": (os.path.abspath(checkpoint_info[0]) if checkpoint_info[0] else None, *checkpoint_info[1:]),
            "parent": os.getpid(),
        }
        # the starting weights, published before the learner exists (it never writes them)
        publish(self.arrays, _weights_views(self.arrays, len(self.published)), self.published, ppo)
        self.learner = launched if launched is not None else LearnerProcess(fork=False)
        self.proc, self.conn = self.learner.proc, self.learner.conn
        if self.learner.forked and (self.device.type != "cpu" or ppo.learn_threads != 1):
            self._send(("exec", learner_env()))  # a fork may use neither CUDA nor more torch threads
        self._send(("spec", spec))
        # no waiting for it: the first rollouts are collected while its interpreter starts
        self.ready = False
        self.t_start = time.perf_counter()

    # ------------------------------------------------------------------ one rollout
    def collect(self) -> None:
        """Wait for rollout r's turn (its section free, weights recent enough), take up
        the newest weights, and collect rollout r into its section."""
        cfg, ppo, r = self.cfg, self.ppo, self.collected
        t0 = time.perf_counter()
        while self.learned <= r - self.K or self._newest() < self.start_version + r - cfg.max_policy_lag:
            self._handle(self._receive())
        self.t_wait += time.perf_counter() - t0
        k = r % self.K
        if r:
            prev = self.sections[(r - 1) % self.K]
            np.copyto(self.sections[k].obs[0], prev.obs[self.T])  # the rollout starts where the last ended
        ppo.use_rollout(*self.rollouts[k])
        self._versions = self.arrays["versions"][k]
        if cfg.max_policy_lag == 0:
            self._take_weights(rng=r > 0)  # one RNG stream, as lock-step's
        ppo.between_steps = self._between_steps
        try:
            ppo.collect()
        finally:
            ppo.between_steps = None
        self.collected += 1

    def _between_steps(self, t: int) -> None:
        if seqlock.version(self.header) != self.version:
            self._take_weights()
        self._versions[t] = self.version

    def _newest(self) -> int:
        return int(seqlock.version(self.header))

    def _take_weights(self, rng: bool = False) -> None:
        """Copy the newest published weights into the acting policy (and, ``rng``, adopt
        the learner's torch RNG state)."""
        h = self.header
        while True:
            seq = seqlock.read_begin(h)
            if seq & 1:
                time.sleep(0)
                continue
            v = int(h[1])
            with torch.no_grad():
                for t, src in zip(self.published, self.views, strict=True):
                    t.copy_(src)
            blob = bytes(self.arrays["blob"][: int(h[2])]) if rng else None
            if seqlock.read_end(h, seq):
                break
        self.version = v
        if blob is not None:
            torch.set_rng_state(pickle.loads(blob)["rng"]["torch"])

    def hand_over(self) -> None:
        """Give the rollout just collected to the learner."""
        ppo, r = self.ppo, self.collected - 1
        self.snapshots[r] = _snapshot(ppo)
        rng = torch.get_rng_state() if self.cfg.max_policy_lag == 0 else None
        self._send(("learn", r % self.K, r, self.snapshots[r], rng))
        self.handed = r + 1
        self.poll()

    def poll(self) -> None:
        """Take in the learner's finished updates without waiting."""
        while self.conn.poll(0):
            self._handle(self._receive())

    def drain(self) -> None:
        """Wait until the learner has finished every rollout handed over."""
        t0 = time.perf_counter()
        while self.learned < self.handed:
            self._handle(self._receive())
        self.t_wait += time.perf_counter() - t0

    def _handle(self, msg) -> None:
        kind = msg[0]
        if kind == "error":
            raise LearnerError(msg[1])
        if kind == "ready" and not self.ready:
            self.ready = True
            return
        if kind != "done":
            raise LearnerError(f"unexpected message from the learner: {kind!r}")
        _, r, info = msg
        self.learned = r + 1
        for old in [x for x in self.snapshots if x < r]:  # keep the last safe point's and later
            del self.snapshots[old]
        self.summary = info["summary"]
        self.lag_counts[: len(info["lags"])] += info["lags"]
        self.learner_stats = info["stats"]
        ppo = self.ppo
        ppo.updates, ppo.grad_steps, ppo.learn_samples = info["updates"], info["grad_steps"], info["learn_samples"]
        ppo.t_prep, ppo.t_learn = info["t_prep"], info["t_learn"]

    # ------------------------------------------------------------------ the learner's safe point
    def safe_state(self) -> tuple[list[np.ndarray], dict] | None:
        """The last published version: (weights, train state) merged with the collector's
        snapshot of the rollout it learned from; None before the first update."""
        h = self.header
        for _ in range(10000):
            seq = seqlock.read_begin(h)
            if seq & 1:
                time.sleep(0.001)
                continue
            v = int(h[1])
            weights = [w.copy() for w in _weights_views(self.arrays, len(self.published))]
            m, vv = self.arrays["adam_m"].copy(), self.arrays["adam_v"].copy()
            blob = bytes(self.arrays["blob"][: int(h[2])])
            if seqlock.read_end(h, seq):
                break
        else:  # pragma: no cover - a learner killed mid-write leaves the lock odd
            return None
        r = v - self.start_version - 1
        if r < 0 or r not in self.snapshots:
            return None
        st = pickle.loads(blob)
        st["optimizer"] = {**st["optimizer"], "m": torch.from_numpy(m), "v": torch.from_numpy(vv)}
        return weights, _merge_state(st, self.snapshots[r])

    def checkpoint_view(self, weights: list[np.ndarray]):
        """What ``save_checkpoint`` reads of a ``PPO`` (policy, cfg, storage, env_steps),
        holding ``weights`` (a scratch copy of the policy: the acting one is untouched)."""
        pol = copy.deepcopy(self.ppo.policy)
        flat = torch.cat([p.detach().reshape(-1) for p in pol.parameters() if p.requires_grad])
        flat.copy_(torch.from_numpy(weights[0]))
        with torch.no_grad():
            off = 0
            for p in (p for p in pol.parameters() if p.requires_grad):
                n = p.numel()
                p.copy_(flat[off : off + n].view_as(p))
                off += n
            for b, w in zip(pol.buffers(), weights[1:], strict=True):
                b.copy_(torch.from_numpy(w))
        return SimpleNamespace(policy=pol, cfg=self.cfg, storage=self.storage, env_steps=None)

    def absorb(self) -> None:
        """Make the collector's ``PPO`` the learner's after its last update (weights,
        optimiser, schedules, reward scaler, counters): the run's end writes it."""
        found = self.safe_state()
        if found is None:
            return
        weights, st = found
        ppo = self.ppo
        with torch.no_grad():
            for t, w in zip(self.published, weights, strict=True):
                t.copy_(torch.from_numpy(w))
        keep = _snapshot(ppo), ppo.curve, torch.get_rng_state(), np.random.get_state()
        ppo.load_train_state({**st, "rng": {"torch": keep[2], "numpy": keep[3]}})
        # the collector's own counters stay its (rollouts after the safe point included)
        ppo.env_steps, ppo.t_act, ppo.t_env = keep[0]["env_steps"], keep[0]["t_act"], keep[0]["t_env"]
        ppo.tracker.load(keep[0]["tracker"])
        ppo.curve = keep[1]

    # ------------------------------------------------------------------ monitoring
    def stats(self, now: float) -> dict:
        """Policy lag (per step, in updates), the learner's busy fraction (its device's busy
        time, ``fastvec.train.busy``: CUDA events on a GPU, the learner process's CPU time on
        the CPU, over its wall time), and each side's share of time waiting for the other."""
        counts = self.lag_counts
        n = int(counts.sum())
        wall = max(now - self.t_start, 1e-9)
        ls = self.learner_stats
        return {
            "max_policy_lag": self.cfg.max_policy_lag,
            "rollout_buffers": self.K,
            "policy_lag_mean": round(float((counts * np.arange(len(counts))).sum() / n), 4) if n else None,
            "policy_lag_max": int(np.flatnonzero(counts).max()) if n else None,
            "policy_lag_histogram": [int(c) for c in np.trim_zeros(counts, "b")],
            "learner_busy_fraction": round(min(1.0, ls["busy_s"] / max(ls["wall_s"], 1e-9)), 4) if ls else None,
            "learner_wait_share": round(ls["wait_s"] / max(ls["wall_s"], 1e-9), 4) if ls else None,
            "collector_wait_share": round(self.t_wait / wall, 4),
        }

    # ------------------------------------------------------------------ plumbing
    def _send(self, msg) -> None:
        try:
            self.conn.send_bytes(_dumps(msg))
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            raise LearnerError(self._death()) from None

    def _receive(self):
        """The learner's next message; LearnerError where it died (its last words first)."""
        while True:
            try:
                if self.conn.poll(_POLL_S):
                    return pickle.loads(self.conn.recv_bytes())
            except (EOFError, ConnectionResetError, OSError):
                raise LearnerError(self._death()) from None
            if self.proc.poll() is not None:
                raise LearnerError(self._death())

    def _death(self) -> str:
        """Why the learner is gone: its error message where it sent one before exiting."""
        try:
            while self.conn.poll(0):
                msg = pickle.loads(self.conn.recv_bytes())
                if msg[0] == "error":
                    return msg[1]
        except (EOFError, OSError):
            pass
        try:
            code = self.proc.wait(1.0)
        except subprocess.TimeoutExpired:
            code = None
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        return f"the learner process died ({how})"

    def close(self, timeout: float = 10.0) -> None:
        """Stop the learner (it finishes what it is doing) and free the pipeline's
        segment. Safe to call twice."""
        if self.proc is not None:
            self.learner.close(timeout)
            self.proc = self.conn = None
        self.arrays = {}
        self.views = []
        self.header = None
        release_segment(self.segment, unlink=True)
        self.segment = None


class LearnerProcess:
    """The learner process, started ahead of its spec on one end of a socket pair.

    ``fork=True`` (where this process runs one thread) forks it: ready in milliseconds,
    with torch already imported. A forked child may only use one torch thread (the
    parent's OpenMP pool does not survive a fork: more threads hang) and no CUDA, so the
    collector tells it (``exec``) to replace itself with a fresh interpreter
    (``learner_command``) where the learner needs either: that takes a second or two
    (importing torch). ``fork=False`` starts the fresh interpreter at once. Not
    multiprocessing's spawn: that runs the caller's script again."""

    def __init__(self, fork: bool = True):
        ours, theirs = socket.socketpair()
        self.forked = fork and threading.active_count() == 1
        old = _ignore_sigint()  # SIGINT ignored from the start (kept across exec): Ctrl-C is the collector's
        try:
            if self.forked:
                for stream in (sys.stdout, sys.stderr):  # nothing buffered for the child to write twice
                    try:
                        stream.flush()
                    except (AttributeError, OSError, ValueError):
                        pass
                self.proc: _Forked | subprocess.Popen = _Forked(theirs.fileno())
            else:
                self.proc = subprocess.Popen(
                    learner_command(theirs.fileno()), pass_fds=[theirs.fileno()], env=learner_env(), close_fds=True
                )
        except BaseException:
            ours.close()
            raise
        finally:
            _restore_sigint(old)
            theirs.close()
        self.conn = Connection(ours.detach())

    def close(self, timeout: float = 10.0) -> None:
        """Ask it to stop; kill it after ``timeout`` seconds. Safe to call twice."""
        if self.proc.poll() is None:
            try:
                self.conn.send_bytes(_dumps(("stop",)))
            except OSError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5.0)
        if not self.conn.closed:
            self.conn.close()


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


class _Forked:
    """A forked learner, with ``subprocess.Popen``'s ``poll``, ``wait``, ``kill`` and
    ``pid``. The child closes every inherited descriptor but its socket and std streams
    (a copy of a worker's socket would keep that worker from noticing its parent die),
    and never returns into the caller's code: it ends with ``os._exit``."""

    def __init__(self, fd: int):
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:  # the child
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.closerange(3, fd)
                os.closerange(fd + 1, _max_fd())
                from .learner import main

                main(fd, forked=True)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired("fastvec learner", timeout or 0.0)
            time.sleep(0.005)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):  # pragma: no cover
        return 4096


def _dumps(msg) -> bytes:
    """Messages are plain pickles (multiprocessing's pickler would send torch tensors
    as shared-memory handles, which need its authentication)."""
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def _strip_moments(state: dict) -> dict:
    """A train state without the optimiser's moment vectors (they travel as arrays)."""
    st = dict(state)
    st["optimizer"] = {k: v for k, v in state["optimizer"].items() if k not in ("m", "v")}
    return st


def _ignore_sigint():
    try:
        return signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: signals are not ours to change
        return None


def _restore_sigint(old) -> None:
    if old is not None:
        signal.signal(signal.SIGINT, old)
