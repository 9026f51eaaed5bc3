"""What a run reports: the scalars of each logging point (``Metrics``) and the result
dict it returns and writes as ``result.json`` (``run_result``)."""

from __future__ import annotations

import time

import numpy as np

from ..model.actor_critic import describe_policy
from .monitor import process_rss, worker_health

__all__ = ["Metrics", "run_result"]


class Metrics:
    """The logging points of ``run`` (a ``fastvec.train.run.loop.Run``): every ``log_every_s``,
    the scalars of the interval since the last one (speeds, where the time went, health,
    the last update's losses) to the monitor, and the mean return to the progress bar."""

    def __init__(self, run, now: float):
        self.run = run
        ppo = run.ppo
        self.t, self.steps, self.learn = now, ppo.env_steps, ppo.t_learn
        ppo.busy.start()
        self.compute = self._compute()
        self.samples = ppo.learn_samples
        self.has_pids = bool(run.storage.worker_pids)  # psutil looks at local processes only

    def _compute(self) -> float:
        ppo = self.run.ppo
        return ppo.t_act + ppo.t_prep + ppo.t_learn

    def due(self, now: float) -> bool:
        return now - self.t >= self.run.cfg.log_every_s

    def log(self, now: float, mean_ret: float | None) -> None:
        run, ppo = self.run, self.run.ppo
        rets, lens = ppo.tracker.drain()
        run.monitor.log(
            ppo.env_steps,
            self.scalars(now, mean_ret, lens),
            {"charts/episode_returns": rets, "charts/episode_lengths": lens},
        )
        if run.bar is not None and mean_ret is not None:
            run.bar.set_postfix_str(f"return {mean_ret:.1f}", refresh=False)
        self.t, self.steps = now, ppo.env_steps
        self.learn, self.samples = ppo.t_learn, ppo.learn_samples

    def scalars(self, now: float, mean_ret: float | None, lens: list) -> dict:
        run, ppo, storage = self.run, self.run.ppo, self.run.storage
        dt = now - self.t
        scal = {
            "charts/mean_return": mean_ret,
            "charts/mean_episode_length": float(np.mean(lens)) if lens else None,
            "charts/episodes": ppo.tracker.episodes,
            "charts/env_sps": (ppo.env_steps - self.steps) / dt,
            "charts/env_sps_overall": ppo.env_steps / run.wall(now),
            "charts/learner_sps": (ppo.learn_samples - self.samples) / max(ppo.t_learn - self.learn, 1e-9),
            "time/act_s": ppo.t_act,
            "time/env_s": ppo.t_env,
            "time/prepare_s": ppo.t_prep,
            "time/learn_s": ppo.t_learn,
            "time/wall_s": run.wall(now),
            "health/step_latency_us": ppo.last_env_latency * 1e6,
            "health/act_latency_us": ppo.last_act_latency * 1e6,
            "health/restarts": run.restarts.total + len(storage.restarts) - run.restarts.seen,
            **run.schedule.summary(),
        }
        for k, m in enumerate(ppo.tracker.group_means()):  # a mix's groups, in --mix order
            scal[f"mix/mean_return_{k}"] = m
        if (st := run.schedule.stats(now)) is not None:
            scal.update(_pipeline_scalars(st))
        self._health(scal, now)
        return scal

    def _health(self, scal: dict, now: float) -> None:
        """The processes' and the device's share of the interval."""
        ppo, storage = self.run.ppo, self.run.storage
        if self.has_pids:
            h = worker_health(storage.worker_pids)
            scal["health/workers_alive"] = h.get("workers_alive")
            scal["health/workers_rss_mb"] = h.get("workers_rss_bytes", 0) / 2**20
        compute = self._compute()
        scal["device/busy_fraction"] = ppo.busy.take(compute - self.compute, now)  # time/wall_s's interval
        self.compute = compute
        if (util := ppo.busy.nvml()) is not None:
            scal["device/nvml_util"] = util
        rss = process_rss()
        if rss:
            scal["health/main_rss_mb"] = rss["main"] / 2**20
        if (lost := storage.lost_wakeups()) is not None:
            scal["health/lost_wakeups"] = lost

    def close(self) -> None:
        """The busy time since the last logging point into the run's fraction."""
        self.run.ppo.busy.take(self._compute() - self.compute)


def _pipeline_scalars(st: dict) -> dict:
    """The async pipeline's figures (``Pipeline.stats``) as scalars."""
    scal = {
        "pipeline/policy_lag_mean": st["policy_lag_mean"],
        "pipeline/policy_lag_max": st["policy_lag_max"],
    }
    total = max(sum(st["policy_lag_histogram"]), 1)
    for lag, n in enumerate(st["policy_lag_histogram"]):  # the histogram, as shares of steps
        scal[f"pipeline/policy_lag_share_{lag}"] = n / total
    scal["pipeline/learner_busy_fraction"] = st["learner_busy_fraction"]
    scal["pipeline/learner_wait_share"] = st["learner_wait_share"]
    scal["pipeline/collector_wait_share"] = st["collector_wait_share"]
    return scal


def run_result(run, wall: float, final_mean: float | None, spread: tuple = (None, 0)) -> dict:
    """The result of ``run`` (a ``fastvec.train.run.loop.Run``) after ``wall`` seconds:
    ``final_mean`` the mean return of the last episodes, ``spread`` their returns'
    standard deviation and count (``Run.return_spread``)."""
    cfg, ppo, threshold = run.cfg, run.ppo, run.threshold
    solved = run.solved
    if cfg.stop_at_return is None and threshold is not None and final_mean is not None:
        solved = ppo.tracker.full() and final_mean >= threshold
    out = {
        "env_id": run.env_id,
        "mix": run.mix,
        "group_mean_returns": ppo.tracker.group_means() if run.mix is not None else None,
        "solved": bool(solved),
        "env_steps": int(ppo.env_steps),
        "wall_seconds": round(wall, 4),
        "final_mean_return": None if final_mean is None else round(final_mean, 4),
        # the returns behind it: their standard deviation (ddof 0) and how many (the window of the last episodes)
        "final_return_std": None if spread[0] is None else round(spread[0], 4),
        "final_return_episodes": int(spread[1]),
        "sps": round(ppo.env_steps / wall, 1),
        "episodes": ppo.tracker.episodes,
        "updates": ppo.updates,
        "grad_steps": ppo.grad_steps,
        "seed": cfg.seed,
        "num_envs": ppo.N,
        # num_workers, main_spin_us (how the trainer waited for the workers' step; None:
        # learned, fastvec.train.commands.launch.main_spin_for), env_groups, backend
        **run.storage.transport(),
        "device": str(run.device),
        "policy": describe_policy(ppo.policy),
        "learner": "numpy" if ppo.np_learner is not None else "torch",  # the minibatch gradient's
        "threshold": threshold,
        "startup_seconds": round(run.t_ready - run.t_start, 4),
        "time_breakdown": {
            "act": round(ppo.t_act, 4),
            "env": round(ppo.t_env, 4),
            "prepare": round(ppo.t_prep, 4),
            "learn": round(ppo.t_learn, 4),
        },
        "learner_sps": round(ppo.learn_samples / ppo.t_learn, 1) if ppo.t_learn else None,
        # this process's share of wall time with the learner's device computing (fastvec.train.compute.busy)
        "device_busy_fraction": None if ppo.busy.fraction is None else round(ppo.busy.fraction, 4),
        "restarts": run.restarts.total,
        # sleeps that no doorbell ended, found by the engine's 100 ms look at the flags (None: not the engine)
        "lost_wakeups": run.lost,
        "interrupted": run.interrupted,
        "out_of_time": run.out_of_time,  # stopped by max_seconds
        "resumed": run.resume is not None or bool(run.state.get("resumed")),
        "pipeline": cfg.pipeline,
    }
    if (stats := run.schedule.stats(time.perf_counter())) is not None:
        out["pipeline_stats"] = stats
        out["device_busy_fraction"] = stats["learner_busy_fraction"]  # the learner's device: its process
    return out
