"""The training loop: ``train(cfg, storage, monitor)``.

It builds no envs and imports no backend: the caller (``fastvec.train.cli``) chooses
and starts the rollout storage (the engine's shared memory, Ray actors, or another
vector env) and the monitor (run directory, TensorBoard). Rollout after rollout it
collects, checks the stop conditions, computes targets and updates; at the end it
writes the checkpoint, the learning curve and ``result.json`` into the run directory.

Between an update and the next rollout the learner's state is whole: that *safe point*
is where the loop writes periodic checkpoints, counts worker restarts against their
limit and honours a stop request (``stop``: Ctrl-C / SIGTERM in the CLI). A failure
while the envs step leaves the state of the last safe point untouched (the RNG state is
kept from there), so it is saved too: ``--resume`` loses at most that rollout.
"""
from __future__ import annotations

import collections
import json
import os
import sys
import time

import numpy as np
import torch

from .checkpoints import PeriodicCheckpoints, check_spaces, policy_from_checkpoint, save_checkpoint
from .config import PPOConfig
from .monitor import process_rss, worker_health
from .policies import describe_policy
from .ppo import PPO, resolve_device, rng_state
from .presets import solve_threshold
from .storage import HostPin

__all__ = ["train", "RestartLimitError", "resume_seed"]


class RestartLimitError(RuntimeError):
    """Workers were replaced more often than ``max_restarts`` per ``restart_window``."""


def resume_seed(cfg: PPOConfig, env_steps: int) -> int:
    """The seed a resumed run resets its envs with (env i gets this + i): new episodes,
    the same ones for every resume from the same checkpoint."""
    return cfg.seed + env_steps


class _RestartWatch:
    """Counts the storage's worker restarts (after the step that made them, and at safe
    points); too many within ``restart_window`` env steps raise ``RestartLimitError`` (an
    env that fails on every reset or step must end the run, not loop)."""

    def __init__(self, storage, cfg: PPOConfig, before: int = 0):
        self.storage, self.limit, self.window = storage, cfg.max_restarts, cfg.restart_window
        self.seen = 0
        self.total = before
        self.recent = collections.deque()

    def check(self, env_steps: int) -> None:
        records = self.storage.restarts
        new = records[self.seen:]
        self.seen = len(records)
        self.total += len(new)
        self.recent.extend([env_steps] * len(new))
        while self.recent and self.recent[0] <= env_steps - self.window:
            self.recent.popleft()
        if len(self.recent) > self.limit:
            last = (new or records[-1:])[-1].get("error", "")
            raise RestartLimitError(
                f"{len(self.recent)} worker restarts within {self.window} env steps "
                f"(max_restarts={self.limit}); the last: {last}")


def _lost_wakeups(storage) -> int | None:
    """The engine's lost wake-ups so far (``Engine.wait_counts``); None on other backends."""
    engine = getattr(storage, "engine", None)
    if not hasattr(engine, "wait_counts"):
        return None
    counts = engine.wait_counts()
    return counts["parent"]["lost"] + sum(w["lost"] for w in counts["workers"])


def train(cfg: PPOConfig, storage, monitor, *, env_id: str | None = None, env_kwargs: dict | None = None,
          init: dict | None = None, resume: dict | None = None, stop=None, progress: bool = True,
          save: bool = True, t_start: float | None = None) -> dict:
    """Train PPO on ``storage`` (see ``fastvec.train.storage``), logging to ``monitor``;
    returns the result dict (``solved``, ``env_steps``, ``wall_seconds``,
    ``final_mean_return``, ``sps``, ``restarts``, ``interrupted``, ``resumed`` ...).
    Closes the storage and the monitor.

    ``init``: a loaded checkpoint to start from (weights only; its spaces must match).
    ``resume``: a loaded checkpoint with a train state to continue (``cfg`` is its config,
    with safe changes only; see ``fastvec.train.cli``): weights, optimiser, counters and
    statistics continue, the envs are reset with ``resume_seed``. ``stop``: a callable
    asked at every safe point; True ends the run there (``result["interrupted"]``).
    ``t_start``: the ``time.perf_counter()`` the wall time counts from (default: now;
    the CLI passes the moment before it started the envs, so start-up counts). With a
    run directory (``monitor.run_dir``) and ``save``, checkpoints go there.
    """
    try:
        cfg = cfg.validate()
        device = resolve_device(cfg.device)
        if init is not None and resume is not None:
            raise ValueError("give init or resume, not both")
    except BaseException:
        storage.close()
        monitor.close()
        raise
    if t_start is None:
        t_start = time.perf_counter()
    ckpt = resume if resume is not None else init
    threshold = cfg.solve_return
    if threshold is None and cfg.stop_at_return is not None:
        threshold = cfg.stop_at_return
    if threshold is None and env_id is not None:
        threshold = solve_threshold(env_id)
    run_dir = monitor.run_dir if save else None
    periodic = PeriodicCheckpoints(run_dir, cfg.checkpoint_every, cfg.keep_checkpoints) if run_dir else None
    state = resume["train_state"] if resume is not None else {}
    wall_before = float(state.get("wall_seconds", 0.0))
    pin = None
    ppo = None
    bar = None
    solved = interrupted = False
    phase = "start"
    snap = None  # RNG state at the last safe point
    try:
        if ckpt is not None:
            check_spaces(ckpt, storage.single_observation_space, storage.single_action_space,
                         env_id or "this env")
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True
            pin = HostPin(storage.arrays()) if storage.arrays() else None
        policy = None
        if ckpt is not None:
            policy = policy_from_checkpoint(ckpt)
            policy.train()
        ppo = PPO(cfg, storage, device, policy)
        if resume is not None:
            ppo.load_train_state(state)
            ppo.restart_envs(resume_seed(cfg, ppo.env_steps))
        else:
            storage.reset(cfg.seed)
        restarts = _RestartWatch(storage, cfg, int(state.get("restarts", 0)))
        if hasattr(storage, "on_restart"):  # count (and limit) restarts as they happen
            storage.on_restart = lambda: restarts.check(ppo.env_steps)
        if periodic is not None:
            periodic.start(ppo.env_steps)
        t_ready = time.perf_counter()
        if resume is None:
            monitor.text("config", "```\n" + json.dumps(cfg.to_dict(), indent=1) + "\n```")
            monitor.text("policy", describe_policy(ppo.policy))
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=cfg.total_steps, initial=min(ppo.env_steps, cfg.total_steps), unit="step",
                       unit_scale=True, file=sys.stderr, mininterval=0.5, dynamic_ncols=True,
                       desc=env_id or "train", leave=False)
        last_log_t, last_log_steps, last_learn = t_ready, ppo.env_steps, ppo.t_learn
        busy = ppo.busy
        busy.start()
        last_compute = ppo.t_act + ppo.t_prep + ppo.t_learn
        last_samples = getattr(ppo, "_learn_samples", 0)
        pids = storage.worker_pids
        ro = ppo.rollout
        obs0, obsT = ro.obs[0], ro.obs[ro.T]

        def full_state(rng=None):
            st = ppo.train_state(rng)
            st["wall_seconds"] = wall_before + time.perf_counter() - t_start
            st["restarts"] = restarts.total
            return st

        while ppo.env_steps < cfg.total_steps:
            # ---- a safe point
            phase = "safe point"
            restarts.check(ppo.env_steps)
            if stop is not None and stop():
                interrupted = True
                break
            if periodic is not None and periodic.due(ppo.env_steps):
                periodic.save(ppo, env_id, env_kwargs, full_state())
            snap = rng_state()
            phase = "collect"
            ppo.collect()
            phase = "learn"
            if bar is not None:
                bar.update(ppo.T * ppo.N)
            mean_ret = ppo.tracker.mean()
            if (cfg.stop_at_return is not None and ppo.tracker.full()
                    and mean_ret >= cfg.stop_at_return):
                solved = True
                break
            if ppo.env_steps >= cfg.total_steps:
                break
            ppo.prepare()
            ppo.update()
            obs0.copy_(obsT)  # the next rollout starts where this one ended
            now = time.perf_counter()
            if now - last_log_t >= cfg.log_every_s:
                dt = now - last_log_t
                rets, lens = ppo.tracker.drain()
                scal = {
                    "charts/mean_return": mean_ret,
                    "charts/mean_episode_length": float(np.mean(lens)) if lens else None,
                    "charts/episodes": ppo.tracker.episodes,
                    "charts/env_sps": (ppo.env_steps - last_log_steps) / dt,
                    "charts/env_sps_overall": ppo.env_steps / (wall_before + now - t_start),
                    "charts/learner_sps": ((ppo._learn_samples - last_samples)
                                           / max(ppo.t_learn - last_learn, 1e-9)),
                    "time/act_s": ppo.t_act, "time/env_s": ppo.t_env,
                    "time/prepare_s": ppo.t_prep, "time/learn_s": ppo.t_learn,
                    "time/wall_s": wall_before + now - t_start,
                    "health/step_latency_us": ppo.last_env_latency * 1e6,
                    "health/act_latency_us": ppo.last_act_latency * 1e6,
                    "health/restarts": restarts.total + len(storage.restarts) - restarts.seen,
                    **ppo.summarize(),
                }
                if pids:
                    h = worker_health(storage.worker_pids)
                    scal["health/workers_alive"] = h.get("workers_alive")
                    scal["health/workers_rss_mb"] = h.get("workers_rss_bytes", 0) / 2**20
                compute = ppo.t_act + ppo.t_prep + ppo.t_learn
                # the interval of time/wall_s, not the logging work's own
                scal["device/busy_fraction"] = busy.take(compute - last_compute, now)
                last_compute = compute
                if (util := busy.nvml()) is not None:
                    scal["device/nvml_util"] = util
                rss = process_rss()
                if rss:
                    scal["health/main_rss_mb"] = rss["main"] / 2**20
                if (lost := _lost_wakeups(storage)) is not None:
                    scal["health/lost_wakeups"] = lost
                monitor.log(ppo.env_steps, scal, {"charts/episode_returns": rets,
                                                  "charts/episode_lengths": lens})
                if bar is not None and mean_ret is not None:
                    bar.set_postfix_str(f"return {mean_ret:.1f}", refresh=False)
                last_log_t, last_log_steps = now, ppo.env_steps
                last_learn, last_samples = ppo.t_learn, ppo._learn_samples
        phase = "end"
        restarts.check(ppo.env_steps)  # counted, not limited: the run is over
        busy.take(ppo.t_act + ppo.t_prep + ppo.t_learn - last_compute)
        lost = _lost_wakeups(storage)  # before the engine closes
    except BaseException as exc:
        # The envs failed (or too many restarts): the learner's state of the last safe
        # point is whole, so keep it. Not after a second Ctrl-C: that one means now.
        if (run_dir and ppo is not None and isinstance(exc, Exception)
                and phase in ("collect", "safe point")):
            try:
                save_checkpoint(os.path.join(run_dir, "checkpoint.pt"), ppo, env_id, env_kwargs,
                                train_state=full_state(snap if phase == "collect" else None))
                exc.resume_from = run_dir
            except Exception:  # pragma: no cover - the original error matters more
                pass
        monitor.close()
        raise
    finally:
        if bar is not None:
            bar.close()
        if pin is not None:
            pin.release()
        if ppo is not None:
            ppo.busy.close()
        storage.close()
    wall = wall_before + time.perf_counter() - t_start
    final_mean = ppo.tracker.mean()
    if cfg.stop_at_return is None and threshold is not None and final_mean is not None:
        solved = ppo.tracker.full() and final_mean >= threshold
    result = {
        "env_id": env_id,
        "solved": bool(solved),
        "env_steps": int(ppo.env_steps),
        "wall_seconds": round(wall, 4),
        "final_mean_return": None if final_mean is None else round(final_mean, 4),
        "sps": round(ppo.env_steps / wall, 1),
        "episodes": ppo.tracker.episodes,
        "updates": ppo.updates,
        "grad_steps": getattr(ppo, "grad_steps", 0),
        "seed": cfg.seed,
        "num_envs": ppo.N,
        "num_workers": getattr(storage, "num_workers", None),
        # how the trainer waited for the workers' step (None: learned; fastvec.train.cli.main_spin_for)
        "main_spin_us": getattr(getattr(storage, "engine", None), "main_spin_us", None),
        "env_groups": len(getattr(storage, "groups", None) or [None]),
        "backend": storage.kind,
        "device": str(device),
        "policy": describe_policy(ppo.policy),
        "learner": "numpy" if ppo.np_learner is not None else "torch",  # the minibatch gradient's
        "threshold": threshold,
        "startup_seconds": round(t_ready - t_start, 4),
        "time_breakdown": {"act": round(ppo.t_act, 4), "env": round(ppo.t_env, 4),
                           "prepare": round(ppo.t_prep, 4), "learn": round(ppo.t_learn, 4)},
        "learner_sps": round(getattr(ppo, "_learn_samples", 0) / ppo.t_learn, 1) if ppo.t_learn else None,
        # this process's share of wall time with the learner's device computing (fastvec.train.busy)
        "device_busy_fraction": None if ppo.busy.fraction is None else round(ppo.busy.fraction, 4),
        "restarts": restarts.total,
        # sleeps that no doorbell ended, found by the engine's 100 ms look at the flags (None: not the engine)
        "lost_wakeups": lost,
        "interrupted": interrupted,
        "resumed": resume is not None or bool(state.get("resumed")),
    }
    # final logging point, checkpoint, plot
    rets, lens = ppo.tracker.drain()
    if monitor.last_step is None or monitor.last_step < ppo.env_steps:  # one row per step
        monitor.log(ppo.env_steps, {"charts/mean_return": final_mean, "health/restarts": restarts.total,
                                    "charts/env_sps_overall": result["sps"], **ppo.summarize()},
                    {"charts/episode_returns": rets, "charts/episode_lengths": lens})
    if monitor.run_dir:
        result["run_dir"] = monitor.run_dir
        if run_dir:  # save
            st = full_state()
            st["wall_seconds"] = wall
            st["resumed"] = result["resumed"]
            result["checkpoint"] = save_checkpoint(os.path.join(run_dir, "checkpoint.pt"), ppo, env_id,
                                                   env_kwargs, extra={"result": dict(result)}, train_state=st)
        monitor.plot(title=f"{env_id or storage.kind} seed {cfg.seed}", curve=ppo.curve,
                     threshold=threshold)
        with open(os.path.join(monitor.run_dir, "result.json"), "w") as f:
            json.dump(result, f, indent=1)
    monitor.close()
    return result
