"""The training loop: ``train(cfg, storage, monitor)``.

It builds no envs and imports no backend: the caller (``fastvec.train.cli``) chooses
and starts the rollout storage (the engine's shared memory, Ray actors, or another
vector env) and the monitor (run directory, TensorBoard). Rollout after rollout it
collects, checks the stop conditions, computes targets and updates; at the end it
writes the checkpoint, the learning curve and ``result.json`` into the run directory.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch

from .checkpoints import check_spaces, policy_from_checkpoint, save_checkpoint
from .config import PPOConfig
from .monitor import process_rss, worker_health
from .policies import describe_policy
from .ppo import PPO, resolve_device
from .presets import solve_threshold
from .storage import HostPin

__all__ = ["train"]


def train(cfg: PPOConfig, storage, monitor, *, env_id: str | None = None, env_kwargs: dict | None = None,
          init: dict | None = None, progress: bool = True, save: bool = True,
          t_start: float | None = None) -> dict:
    """Train PPO on ``storage`` (see ``fastvec.train.storage``), logging to ``monitor``;
    returns the result dict (``solved``, ``env_steps``, ``wall_seconds``,
    ``final_mean_return``, ``sps`` ...). Closes the storage and the monitor.

    ``init``: a loaded checkpoint to start from (its spaces must match). ``t_start``:
    the ``time.perf_counter()`` the wall time counts from (default: now; the CLI passes
    the moment before it started the envs, so start-up counts). With a run directory
    (``monitor.run_dir``) and ``save``, the checkpoint goes there too.
    """
    try:
        cfg = cfg.validate()
        device = resolve_device(cfg.device)
    except BaseException:
        storage.close()
        monitor.close()
        raise
    if t_start is None:
        t_start = time.perf_counter()
    ckpt = init
    threshold = cfg.solve_return
    if threshold is None and cfg.stop_at_return is not None:
        threshold = cfg.stop_at_return
    if threshold is None and env_id is not None:
        threshold = solve_threshold(env_id)
    pin = None
    ppo = None
    bar = None
    solved = False
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
        storage.reset(cfg.seed)
        t_ready = time.perf_counter()
        monitor.text("config", "```\n" + json.dumps(cfg.to_dict(), indent=1) + "\n```")
        monitor.text("policy", describe_policy(ppo.policy))
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=cfg.total_steps, unit="step", unit_scale=True, file=sys.stderr,
                       mininterval=0.5, dynamic_ncols=True, desc=env_id or "train", leave=False)
        last_log_t, last_log_steps, last_learn = t_ready, 0, 0.0
        last_samples = 0
        pids = storage.worker_pids
        ro = ppo.rollout
        obs0, obsT = ro.obs[0], ro.obs[ro.T]
        while ppo.env_steps < cfg.total_steps:
            ppo.collect()
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
                    "charts/env_sps_overall": ppo.env_steps / (now - t_start),
                    "charts/learner_sps": ((ppo._learn_samples - last_samples)
                                           / max(ppo.t_learn - last_learn, 1e-9)),
                    "time/act_s": ppo.t_act, "time/env_s": ppo.t_env,
                    "time/prepare_s": ppo.t_prep, "time/learn_s": ppo.t_learn,
                    "health/step_latency_us": ppo.last_env_latency * 1e6,
                    "health/act_latency_us": ppo.last_act_latency * 1e6,
                    **ppo.summarize(),
                }
                if pids:
                    h = worker_health(pids)
                    scal["health/workers_alive"] = h.get("workers_alive")
                    scal["health/workers_rss_mb"] = h.get("workers_rss_bytes", 0) / 2**20
                rss = process_rss()
                if rss:
                    scal["health/main_rss_mb"] = rss["main"] / 2**20
                monitor.log(ppo.env_steps, scal, {"charts/episode_returns": rets,
                                                  "charts/episode_lengths": lens})
                if bar is not None and mean_ret is not None:
                    bar.set_postfix_str(f"return {mean_ret:.1f}", refresh=False)
                last_log_t, last_log_steps = now, ppo.env_steps
                last_learn, last_samples = ppo.t_learn, ppo._learn_samples
        wall = time.perf_counter() - t_start
    except BaseException:
        monitor.close()
        raise
    finally:
        if bar is not None:
            bar.close()
        if pin is not None:
            pin.release()
        storage.close()
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
        "backend": storage.kind,
        "device": str(device),
        "policy": describe_policy(ppo.policy),
        "threshold": threshold,
        "startup_seconds": round(t_ready - t_start, 4),
        "time_breakdown": {"act": round(ppo.t_act, 4), "env": round(ppo.t_env, 4),
                           "prepare": round(ppo.t_prep, 4), "learn": round(ppo.t_learn, 4)},
        "learner_sps": round(getattr(ppo, "_learn_samples", 0) / ppo.t_learn, 1) if ppo.t_learn else None,
    }
    # final logging point, checkpoint, plot
    rets, lens = ppo.tracker.drain()
    monitor.log(ppo.env_steps, {"charts/mean_return": final_mean,
                                "charts/env_sps_overall": result["sps"], **ppo.summarize()},
                {"charts/episode_returns": rets, "charts/episode_lengths": lens})
    run_dir = monitor.run_dir
    if run_dir:
        result["run_dir"] = run_dir
        if save:
            result["checkpoint"] = save_checkpoint(os.path.join(run_dir, "checkpoint.pt"), ppo, env_id,
                                                   env_kwargs, extra={"result": dict(result)})
        monitor.plot(title=f"{env_id or storage.kind} seed {cfg.seed}", curve=ppo.curve,
                     threshold=threshold)
        with open(os.path.join(run_dir, "result.json"), "w") as f:
            json.dump(result, f, indent=1)
    monitor.close()
    return result
