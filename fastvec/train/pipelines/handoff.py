"""What the async pipeline's collector and learner share, and how each reads it: the
pipeline segment (``Handoff``) and the train state split between the two processes.

The segment holds, per section k of the engine's ring, what acting records beside the
ring (the Gaussian's raw samples, log-probs, and values where the policy gives them
while acting) and the weights version that acted at each step; and one **published
block**: the learner's weights (with the policy's buffers: the observation
normaliser), its optimiser moments and its train state after every update, written under
a seqlock (``fastvec.train.pipelines.seqlock``: one writer, readers retry a torn read). What is
published is the learner's **safe point**: checkpoints are written from it.

A train state (``PPO.train_state``'s keys) is split: the learner owns the optimiser,
schedules, reward scaler and update counters; the collector the env steps, episode
statistics, learning curve and acting times (``collector_part``), as of the rollout
each update learned from. ``merge_state`` puts the two back together.

The collector-learner wire of the async pipeline: one socket pair, one message per
rollout each way (``learn`` and ``done``), each a plain pickle; and the learner's own
interpreter, where it is not a fork (``learner_command``).

Messages: collector to learner ``("spec", spec)`` once, ``("learn", k, r, collector part,
rng)`` per rollout, ``("stop",)``, and to a fork ``("exec", env)`` (become a fresh
interpreter); learner to collector ``("ready",)``, ``("done", r, info)`` per update,
``("error", text)``.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import time

import numpy as np
import torch

from ..._core.segment import SegmentPlan
from . import seqlock

__all__ = [
    "Handoff",
    "published_tensors",
    "plan_handoff",
    "without_moments",
    "collector_part",
    "merge_state",
    "POLL_S",
    "dumps",
    "learner_command",
    "learner_env",
    "ignore_sigint",
    "restore_sigint",
]

HEADER = 8  # int64: seq, version, blob length


def published_tensors(policy, flat_param) -> list[torch.Tensor]:
    """What a weights version is: the flat parameters and every buffer of the policy
    (the observation normaliser's statistics among them)."""
    return [flat_param.data, *policy.buffers()]


def plan_handoff(K: int, T: int, N: int, policy, flat_param, blob_bytes: int) -> SegmentPlan:
    """The pipeline segment for K sections of T steps of N envs, and the published block
    for ``policy`` (flattened into ``flat_param``) with ``blob_bytes`` of train state."""
    plan = SegmentPlan()
    dim = getattr(policy.dist, "dim", 1)
    plan.add("raw", (K, T, N, dim), np.float32)
    plan.add("logp", (K, T, N), np.float32)
    plan.add("values", (K, T + 1, N), np.float32)
    plan.add("versions", (K, T), np.int64)
    if policy.recurrent:  # the states acting fed each step, and where episodes start
        plan.add("states", (K, T + 1, N, policy.state_size), np.float32)
        plan.add("starts", (K, T + 1, N), np.bool_)
    plan.add("header", (HEADER,), np.int64)
    for i, t in enumerate(published_tensors(policy, flat_param)):
        plan.add(f"w{i}", tuple(t.shape), t.detach().cpu().numpy().dtype)
    P = flat_param.numel()
    plan.add("adam_m", (P,), np.float32)
    plan.add("adam_v", (P,), np.float32)
    plan.add("blob", (blob_bytes,), np.uint8)
    return plan


def without_moments(state: dict) -> dict:
    """A train state without the optimiser's moment vectors (they travel as arrays)."""
    st = dict(state)
    st["optimizer"] = {k: v for k, v in state["optimizer"].items() if k not in ("m", "v")}
    return st


def collector_part(ppo) -> dict:
    """The collector's part of a train state, as of the rollout just collected."""
    return {
        "env_steps": ppo.env_steps,
        "tracker": ppo.tracker.state(),
        "curve": list(ppo.curve),
        "t_act": ppo.t_act,
        "t_env": ppo.t_env,
    }


def merge_state(learner: dict, collector: dict) -> dict:
    """A train state from the learner's state after update u and the collector's part
    (``collector_part``) of the rollout that update learned from."""
    st = dict(learner)
    st["env_steps"] = collector["env_steps"]
    st["tracker"] = collector["tracker"]
    st["curve"] = list(collector["curve"])
    st["times"] = {**learner["times"], "act": collector["t_act"], "env": collector["t_env"]}
    return st


class Handoff:
    """The pipeline segment's arrays (``plan_handoff``'s, mapped in this process) and the
    published block's reads and writes; ``n_weights``: ``len(published_tensors(...))``."""

    def __init__(self, arrays: dict, n_weights: int):
        self.arrays = arrays
        self.header = arrays["header"]
        self.weights = [arrays[f"w{i}"] for i in range(n_weights)]

    def section(self, k: int) -> dict:
        """What acting records in section k: ``raw``, ``logp`` and ``values``, and a recurrent
        policy's ``states`` and ``starts`` (``Rollout``'s ``shared``)."""
        a = self.arrays
        return {name: a[name][k] for name in ("raw", "logp", "values", "states", "starts") if name in a}

    def versions(self, k: int) -> np.ndarray:
        """``[T]``: the weights version that acted at each step of section k."""
        return self.arrays["versions"][k]

    def version(self) -> int:
        """The newest published version (one atomic load)."""
        return int(seqlock.version(self.header))

    def publish(self, published: list[torch.Tensor], ppo) -> None:
        """Write ``ppo``'s safe point (one writer at a time: the collector once before the
        learner starts, then the learner after every update): weights and buffers
        (``published``), the optimiser's moments, the train state, as version ``updates``."""
        a, h = self.arrays, self.header
        blob = pickle.dumps(without_moments(ppo.train_state()))
        if len(blob) > len(a["blob"]):
            raise RuntimeError(f"the learner's train state grew to {len(blob)} bytes (room for {len(a['blob'])})")
        seqlock.write_begin(h)
        for view, t in zip(self.weights, published, strict=True):
            np.copyto(view, t.detach().cpu().numpy())
        np.copyto(a["adam_m"], ppo.opt.m.detach().cpu().numpy())
        np.copyto(a["adam_v"], ppo.opt.v.detach().cpu().numpy())
        a["blob"][: len(blob)] = np.frombuffer(blob, np.uint8)
        h[2] = len(blob)
        seqlock.write_end(h, ppo.updates)

    def take_weights(self, into: list[torch.Tensor], views: list[torch.Tensor], rng: bool) -> tuple[int, bytes | None]:
        """Copy the newest published weights into ``into`` (from ``views``: tensors over
        ``weights``); ``(version, the train state's pickle where rng else None)``."""
        h = self.header
        while True:
            seq = seqlock.read_begin(h)
            if seq & 1:
                time.sleep(0)
                continue
            v = int(h[1])
            with torch.no_grad():
                for t, src in zip(into, views, strict=True):
                    t.copy_(src)
            blob = bytes(self.arrays["blob"][: int(h[2])]) if rng else None
            if seqlock.read_end(h, seq):
                return v, blob

    def safe_point(self) -> tuple[int, list[np.ndarray], dict] | None:
        """A copy of the published block: ``(version, weights, learner's train state with
        its moments)``; None where a writer died mid-write (the lock stays odd)."""
        a, h = self.arrays, self.header
        for _ in range(10000):
            seq = seqlock.read_begin(h)
            if seq & 1:
                time.sleep(0.001)
                continue
            v = int(h[1])
            weights = [w.copy() for w in self.weights]
            m, vv = a["adam_m"].copy(), a["adam_v"].copy()
            blob = bytes(a["blob"][: int(h[2])])
            if seqlock.read_end(h, seq):
                break
        else:  # pragma: no cover - a learner killed mid-write leaves the lock odd
            return None
        st = pickle.loads(blob)
        st["optimizer"] = {**st["optimizer"], "m": torch.from_numpy(m), "v": torch.from_numpy(vv)}
        return v, weights, st


POLL_S = 0.1  # how often a wait looks at the other process's health


def dumps(msg) -> bytes:
    """Messages are plain pickles (multiprocessing's pickler would send torch tensors
    as shared-memory handles, which need its authentication)."""
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def learner_command(fd: int) -> list[str]:
    """``python -I -c ...``: isolated (no current directory, no ``PYTHONPATH``), with this
    interpreter's ``sys.path`` (``learner_env``), so that it imports the same fastvec as
    this one: a source checkout in the current directory must not shadow an installed
    build (``-m`` would put the directory first)."""
    code = (
        "import json, os, sys; sys.path[:] = json.loads(os.environ['FASTVEC_LEARNER_PATH']); "
        f"from fastvec.train.pipelines.learner import main; main({int(fd)})"
    )
    return [sys.executable, "-I", "-c", code]


def learner_env() -> dict:
    """The learner interpreter's environment: this one's, and its import path."""
    return {
        **os.environ,
        "FASTVEC_LEARNER_PATH": json.dumps([os.path.abspath(p) if p else os.getcwd() for p in sys.path]),
    }


def ignore_sigint():
    try:
        return signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: signals are not ours to change
        return None


def restore_sigint(old) -> None:
    if old is not None:
        signal.signal(signal.SIGINT, old)
