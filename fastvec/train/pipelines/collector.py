"""The async pipeline (``pipeline=async``): a learner process learns on one rollout
while the envs fill the next. ``Pipeline`` is the collector's end, and the run's
schedule (``fastvec.train.pipelines.lockstep``) in async.

Three kinds of process: the **collector** (the process that calls ``train``: it acts,
steps the engine and records, exactly as the lock-step loop's collect), the engine's
**workers**, and one **learner** process (``fastvec.train.pipelines.learner``) that owns the
optimiser, computes the targets and updates. Nothing of a rollout is copied between
them: the engine's ring holds K = ``rollout_buffers`` rollouts (``fastvec.train.pipelines.ring``),
and the pipeline segment (``fastvec.train.pipelines.handoff``) holds what acting records beside
them, the version that acted each step, and the weights the learner publishes. The
collector takes up a new version between env steps (one atomic load per step while
nothing changed). Control is one message per rollout each way (``fastvec.train.pipelines.handoff``).

**Policy lag.** Version v is the weights after v updates; rollout r (counted from the
run's start) may begin once version ``r - max_policy_lag`` is out (counted from the
starting version) and its section is free (the learner has finished rollout r - K).
So the collector waits (back-pressure) rather than act with older weights: no data
older than the bound is ever learned from, nothing is dropped. Every step records the
version that acted; the learner computes values, old log-probs and the truncation
bootstrap with those weights (it keeps the versions it published), so the PPO ratio is
taken against the policy that acted; ``targets=vtrace`` (or ``auto``) also clips the
targets' importance weights towards its current weights.

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
import os
import pickle
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from ..._core.segment import create_segment, release_segment
from ..compute.ranks import learners_spec
from ..config.settings import PPOConfig
from ..storage.rollout import Rollout
from .handoff import Handoff, collector_part, learner_env, merge_state, plan_handoff, published_tensors, without_moments
from .lockstep import Saved
from .ring import RingSection, start_where_left
from .watch import LearnerError, LearnerLink, LearnerProcess, learner_error

__all__ = ["Pipeline"]


class Pipeline:
    """The collector's end: starts the learner, hands rollouts over, takes up weights.

    ``ppo``: the collector's ``PPO`` (over section 0 of ``storage``, an ``EngineStorage``
    with ``ring_slots(cfg)`` slots; it acts on the CPU, into shared memory); ``device``:
    the learner's; ``checkpoint_info``: ``(run_dir, env_id, env_kwargs, mix)`` for the
    learner's checkpoint should the collector die; ``launched``: a ``LearnerProcess``
    started earlier (the pipeline takes it over; default: one started here)."""

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
        self.link: Any = None  # the learner (None once closed)
        self.segment: Any = None
        try:
            self._lay_out()
            self._start_learner(checkpoint_info, launched)
        except BaseException:
            if launched is not None and self.link is None:
                launched.close()
            self.close()
            raise

    def _lay_out(self) -> None:
        """The pipeline's segment and the K rollouts over the ring's sections."""
        cfg, storage, ppo = self.cfg, self.storage, self.ppo
        self.sections = [RingSection(storage, k, self.T) for k in range(self.K)]
        pol = ppo.policy
        self.state = ppo.train_state()
        blob = len(pickle.dumps(without_moments(self.state))) * 2 + 65536
        self.plan = plan_handoff(self.K, self.T, storage.num_envs, pol, ppo.flat_param, blob)
        self.segment = create_segment(self.plan.size)
        self.published = published_tensors(pol, ppo.flat_param)
        self.handoff = Handoff(self.plan.arrays(self.segment.buf), len(self.published))
        self.views = [torch.from_numpy(w) for w in self.handoff.weights]
        self.rollouts = [
            (sec, Rollout(sec, pol, self.T, ppo.device, shared=self.handoff.section(k)))
            for k, sec in enumerate(self.sections)
        ]
        ppo.use_rollout(*self.rollouts[0])
        self.version = self.start_version = ppo.updates
        self.collected = 0  # rollouts collected (r of the next one)
        self.handed = 0  # rollouts handed over to the learner
        self.learned = 0  # rollouts the learner has finished
        self.parts: dict[int, dict] = {}  # rollout r -> the collector's part of the train state after it
        self.last_summary: dict = {}
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
            "agent_leaves": getattr(self.storage, "agent_leaves", None),  # (agents: the ring is seen as rows)
            "engine": (eng.shm_name, eng.segment_entries),
            "pipeline": (self.segment.name, self.plan.entries),
            "policy": {k: v.detach().cpu() for k, v in ppo.policy.state_dict().items()},
            "state": self.state,
            "device": str(self.device),
            "separate_buffers": self.learner_separate_buffers,
            "checkpoint": (os.path.abspath(checkpoint_info[0]) if checkpoint_info[0] else None, *checkpoint_info[1:]),
            "parent": os.getpid(),
            "ranks": learners_spec(ppo.ranks, self.device),  # the ranks' learners sum their gradients among themselves
        }
        # the starting weights, published before the learner exists (it never writes them)
        self.handoff.publish(self.published, ppo)
        self.link = LearnerLink(launched if launched is not None else LearnerProcess(fork=False))
        if self.link.learner.forked and (self.device.type != "cpu" or ppo.learn_threads != 1):
            self.link.send(("exec", learner_env()))  # a fork may use neither CUDA nor more torch threads
        self.link.send(("spec", spec))
        # no waiting for it: the first rollouts are collected while its interpreter starts
        self.ready = False
        self.t_start = time.perf_counter()

    # ------------------------------------------------------------------ one rollout
    def collect(self) -> None:
        """Wait for rollout r's turn (its section free, weights recent enough), take up
        the newest weights, and collect rollout r into its section."""
        cfg, ppo, r = self.cfg, self.ppo, self.collected
        t0 = time.perf_counter()
        while self.learned <= r - self.K or self.handoff.version() < self.start_version + r - cfg.max_policy_lag:
            self._handle(self.link.receive())
        self.t_wait += time.perf_counter() - t0
        k = r % self.K
        if r:
            start_where_left(self.sections[(r - 1) % self.K], self.sections[k], self.T)
        ppo.use_rollout(*self.rollouts[k])
        self._versions = self.handoff.versions(k)
        if cfg.max_policy_lag == 0:
            self._take_weights(rng=r > 0)  # one RNG stream, as lock-step's
        ppo.between_steps = self._between_steps
        try:
            ppo.collect()
        finally:
            ppo.between_steps = None
        self.collected += 1

    def _between_steps(self, t: int) -> None:
        if self.handoff.version() != self.version:
            self._take_weights()
        self._versions[t] = self.version

    def _take_weights(self, rng: bool = False) -> None:
        """Copy the newest published weights into the acting policy (and, ``rng``, adopt
        the learner's torch RNG state)."""
        self.version, blob = self.handoff.take_weights(self.published, self.views, rng)
        if blob is not None:
            torch.set_rng_state(pickle.loads(blob)["rng"]["torch"])

    def learn(self) -> None:
        """Give the rollout just collected to the learner."""
        ppo, r = self.ppo, self.collected - 1
        self.parts[r] = collector_part(ppo)
        rng = torch.get_rng_state() if self.cfg.max_policy_lag == 0 else None
        self.link.send(("learn", r % self.K, r, self.parts[r], rng))
        self.handed = r + 1
        self.poll()

    def poll(self) -> None:
        """Take in the learner's finished updates without waiting."""
        while self.link.pending():
            self._handle(self.link.receive())

    def drain(self) -> None:
        """Wait until the learner has finished every rollout handed over."""
        t0 = time.perf_counter()
        while self.learned < self.handed:
            self._handle(self.link.receive())
        self.t_wait += time.perf_counter() - t0

    def _handle(self, msg) -> None:
        kind = msg[0]
        if kind == "error":
            raise learner_error(msg)
        if kind == "ready" and not self.ready:
            self.ready = True
            return
        if kind != "done":
            raise LearnerError(f"unexpected message from the learner: {kind!r}")
        _, r, info = msg
        self.learned = r + 1
        for old in [x for x in self.parts if x < r]:  # keep the last safe point's and later
            del self.parts[old]
        self.last_summary = info["summary"]
        self.lag_counts[: len(info["lags"])] += info["lags"]
        self.learner_stats = info["stats"]
        ppo = self.ppo
        ppo.updates, ppo.grad_steps, ppo.learn_samples = info["updates"], info["grad_steps"], info["learn_samples"]
        ppo.t_prep, ppo.t_learn = info["t_prep"], info["t_learn"]

    # ------------------------------------------------------------------ the learner's safe point
    def safe_state(self) -> tuple[list[np.ndarray], dict] | None:
        """The last published version: (weights, train state) merged with the collector's
        part of the rollout it learned from; None before the first update."""
        found = self.handoff.safe_point()
        if found is None:
            return None
        v, weights, st = found
        r = v - self.start_version - 1
        if r < 0 or r not in self.parts:
            return None
        return weights, merge_state(st, self.parts[r])

    def _saved(self) -> Saved | None:
        found = self.safe_state()
        if found is None:
            return None
        weights, st = found
        holder = SimpleNamespace(
            policy=policy_with(self.ppo.policy, weights), cfg=self.cfg, storage=self.storage, env_steps=st["env_steps"]
        )
        return Saved(holder, st)

    def safe_point(self) -> Saved | None:
        """The learner's last safe point, once it has learned every rollout handed over
        (the collector's safe point then is the same one)."""
        self.drain()
        return self._saved()

    def after_failure(self, phase: str, rng) -> Saved | None:
        """The learner's last safe point, whichever process failed and wherever."""
        return self._saved()

    def finish(self) -> None:
        """Every rollout handed over is learned; the learner's state becomes the run's."""
        self.drain()
        self.absorb()

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
        keep = collector_part(ppo), ppo.curve, torch.get_rng_state(), np.random.get_state()
        ppo.load_train_state({**st, "rng": {"torch": keep[2], "numpy": keep[3]}})
        # the collector's own counters stay its (rollouts after the safe point included)
        ppo.env_steps, ppo.t_act, ppo.t_env = keep[0]["env_steps"], keep[0]["t_act"], keep[0]["t_env"]
        ppo.tracker.load(keep[0]["tracker"])
        ppo.curve = keep[1]

    # ------------------------------------------------------------------ monitoring
    def summary(self) -> dict:
        """The learner's last update's losses etc."""
        return self.last_summary

    def stats(self, now: float) -> dict:
        """Policy lag (per step, in updates), the learner's busy fraction (its device's busy
        time, ``fastvec.train.compute.busy``: CUDA events on a GPU, the learner process's CPU time on
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

    def close(self, timeout: float = 10.0) -> None:
        """Stop the learner (it finishes what it is doing) and free the pipeline's
        segment. Safe to call twice."""
        if self.link is not None:
            self.link.close(timeout)
            self.link = None
        self.handoff = None  # type: ignore[assignment]  # its views into the segment go before it closes
        self.views = []
        release_segment(self.segment, unlink=True)
        self.segment = None


def policy_with(policy, weights: list[np.ndarray]):
    """A scratch copy of ``policy`` holding published ``weights`` (flat parameters, then
    the buffers): what a checkpoint of the learner's safe point saves; ``policy`` is untouched."""
    pol = copy.deepcopy(policy)
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
    return pol
