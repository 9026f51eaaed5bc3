"""The training loop: ``train(cfg, storage, monitor)``.

It builds no envs and imports no backend: the caller (``fastvec.train.cli``) chooses
and starts the rollout storage (the engine's shared memory, Ray actors, or another
vector env; any ``fastvec.train.storage.RolloutStorage``) and the monitor (run
directory, TensorBoard). Rollout after rollout it collects, checks the stop conditions,
computes targets and updates; at the end it writes the checkpoint, the learning curve
and ``result.json`` into the run directory.

Between an update and the next rollout the learner's state is whole: that *safe point*
is where the loop writes periodic checkpoints, counts worker restarts against their
limit and honours a stop request (``stop``: Ctrl-C / SIGTERM in the CLI). A failure
while the envs step leaves the state of the last safe point untouched (the RNG state is
kept from there), so it is saved too: ``--resume`` loses at most that rollout.

Read top to bottom: ``train`` (the phases in order), ``_Run`` (setup, one iteration,
the emergency checkpoint, the result), ``_Metrics`` (a logging point's scalars).
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
from .host_memory import HostPin
from .mix import group_of
from .monitor import process_rss, worker_health
from .pipeline import LearnerError, Pipeline, RingSection
from .policies import describe_policy
from .ppo import PPO, resolve_device, rng_state
from .presets import solve_threshold
from .storage import RolloutStorage

__all__ = ["train", "RestartLimitError", "LearnerError", "resume_seed"]


class RestartLimitError(RuntimeError):
    """Workers were replaced more often than ``max_restarts`` per ``restart_window``."""


def resume_seed(cfg: PPOConfig, env_steps: int) -> int:
    """The seed a resumed run resets its envs with (env i gets this + i): new episodes,
    the same ones for every resume from the same checkpoint."""
    return cfg.seed + env_steps


def train(
    cfg: PPOConfig,
    storage: RolloutStorage,
    monitor,
    *,
    env_id: str | None = None,
    env_kwargs: dict | None = None,
    mix: list[dict] | None = None,
    init: dict | None = None,
    resume: dict | None = None,
    stop=None,
    progress: bool = True,
    save: bool = True,
    t_start: float | None = None,
    learner=None,
) -> dict:
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
    run directory (``monitor.run_dir``) and ``save``, checkpoints go there. ``learner``:
    for ``pipeline=async``, a ``fastvec.train.pipeline.LearnerProcess`` started earlier
    (the run takes it over; default: one started here). ``mix``: the groups of envs the
    storage's envs are made of, in order (``fastvec.train.mix``): kept in the checkpoints,
    each group's training return in the result (``group_mean_returns``).
    """
    try:
        cfg = cfg.validate()
        device = resolve_device(cfg.device)
        if init is not None and resume is not None:
            raise ValueError("give init or resume, not both")
        _check_pipeline_storage(cfg, storage)
    except BaseException:
        if learner is not None:
            learner.close()
        storage.close()
        monitor.close()
        raise
    run = _Run(
        cfg,
        storage,
        monitor,
        device,
        env_id,
        env_kwargs,
        mix,
        resume,
        save,
        time.perf_counter() if t_start is None else t_start,
        learner,
    )
    try:
        run.start(init if resume is None else resume, progress)
        while run.ppo.env_steps < cfg.total_steps:
            if not run.iterate(stop):
                break
        run.end()
    except BaseException as exc:
        run.emergency_checkpoint(exc)
        monitor.close()
        raise
    finally:
        run.release()
    return run.finish()


def _check_pipeline_storage(cfg: PPOConfig, storage) -> None:
    """pipeline=async needs an engine's ring on this machine, sized for its K rollouts."""
    if cfg.pipeline != "async":
        return
    if getattr(storage, "kind", None) != "fastvec" or not hasattr(getattr(storage, "engine", None), "segment_entries"):
        raise ValueError(
            f"pipeline=async needs fastvec's engine on this machine (its learner maps the ring), not {storage.kind!r}"
        )
    want = cfg.rollout_buffers * (cfg.n_steps + 1)
    if storage.obs.shape[0] != want:
        raise ValueError(
            f"pipeline=async with rollout_buffers={cfg.rollout_buffers} needs an engine ring of "
            f"{want} slots (K x (n_steps + 1)), this one has {storage.obs.shape[0]}"
        )


class _Run:
    """One run's state across its phases: ``start`` (the learner, from a checkpoint or
    new; the envs reset), ``iterate`` (a safe point, a rollout, an update, maybe a
    logging point), ``end``, then ``finish`` (the result, the last checkpoint and plot).
    ``phase`` says where an exception came from (``emergency_checkpoint``)."""

    def __init__(
        self,
        cfg: PPOConfig,
        storage: RolloutStorage,
        monitor,
        device: torch.device,
        env_id,
        env_kwargs,
        mix,
        resume: dict | None,
        save: bool,
        t_start: float,
        learner=None,
    ):
        self.learner = learner
        self.cfg, self.storage, self.monitor, self.device = cfg, storage, monitor, device
        self.env_id, self.env_kwargs, self.mix, self.resume, self.t_start = env_id, env_kwargs, mix, resume, t_start
        threshold = cfg.solve_return
        if threshold is None and cfg.stop_at_return is not None:
            threshold = cfg.stop_at_return
        if threshold is None and env_id is not None:
            threshold = solve_threshold(env_id)
        self.threshold = threshold
        self.run_dir = monitor.run_dir if save else None
        self.periodic = (
            PeriodicCheckpoints(self.run_dir, cfg.checkpoint_every, cfg.keep_checkpoints) if self.run_dir else None
        )
        self.state = resume["train_state"] if resume is not None else {}  # the resumed run's counters
        self.wall_before = float(self.state.get("wall_seconds", 0.0))
        self.ppo: PPO | None = None  # these from start()
        self.pipe: Pipeline | None = None  # pipeline=async: the learner process's other end
        self.restarts: _RestartWatch | None = None
        self.pin = self.bar = self.metrics = None
        self.t_ready = t_start
        self.solved = self.interrupted = self.out_of_time = False
        self.phase = "start"
        self.snap = None  # RNG state at the last safe point
        self.lost = None

    # ------------------------------------------------------------------ setup
    def start(self, ckpt: dict | None, progress: bool) -> None:
        cfg, storage, resume = self.cfg, self.storage, self.resume
        if ckpt is not None:
            check_spaces(ckpt, storage.single_observation_space, storage.single_action_space, self.env_id or "this env")
        pipelined = cfg.pipeline == "async"
        if self.device.type == "cuda" and not pipelined:  # (the async learner pins what it reads)
            torch.backends.cudnn.benchmark = True
            self.pin = HostPin(storage.arrays()) if storage.arrays() else None
        policy = None
        if ckpt is not None:
            policy = policy_from_checkpoint(ckpt)
            policy.train()
        # async: the collector acts on the CPU, into the shared rollouts; the learner has the device
        on = RingSection(storage, 0, cfg.n_steps) if pipelined else storage
        self.ppo = ppo = PPO(cfg, on, torch.device("cpu") if pipelined else self.device, policy)
        if self.mix is not None:  # each group's training return too
            ppo.tracker.set_groups(group_of(self.mix))
        if resume is not None:
            ppo.load_train_state(self.state)
            ppo.restart_envs(resume_seed(cfg, ppo.env_steps))
        else:
            storage.reset(cfg.seed)
        if pipelined:
            launched, self.learner = self.learner, None
            self.pipe = Pipeline(
                cfg, storage, ppo, self.device, (self.run_dir, self.env_id, self.env_kwargs, self.mix), launched
            )
        self.restarts = restarts = _RestartWatch(storage, cfg, int(self.state.get("restarts", 0)))
        storage.on_restart = lambda: restarts.check(ppo.env_steps)  # counted (and limited) as they happen
        if self.periodic is not None:
            self.periodic.start(ppo.env_steps)
        self.t_ready = time.perf_counter()
        if resume is None:
            self.monitor.text("config", "```\n" + json.dumps(cfg.to_dict(), indent=1) + "\n```")
            self.monitor.text("policy", describe_policy(ppo.policy))
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(
                total=cfg.total_steps,
                initial=min(ppo.env_steps, cfg.total_steps),
                unit="step",
                unit_scale=True,
                file=sys.stderr,
                mininterval=0.5,
                dynamic_ncols=True,
                desc=self.env_id or "train",
                leave=False,
            )
        self.metrics = _Metrics(self, self.t_ready)

    # ------------------------------------------------------------------ one iteration
    def iterate(self, stop) -> bool:
        """A safe point, a rollout and (unless the run ends with it) an update; False
        once the run ends (stop request, solved, ``max_seconds`` spent, or its steps done)."""
        cfg, ppo = self.cfg, self.ppo
        self.phase = "safe point"
        self.restarts.check(ppo.env_steps)
        if stop is not None and stop():
            self.interrupted = True
            return False
        if cfg.max_seconds is not None and self.wall(time.perf_counter()) >= cfg.max_seconds:
            self.out_of_time = True
            return False
        if self.periodic is not None and self.periodic.due(ppo.env_steps):
            if self.pipe is None:
                self.periodic.save(ppo, self.env_id, self.env_kwargs, self.full_state(), mix=self.mix)
            else:
                self.pipe.drain()  # the learner's safe point then is this one
                self.save_learner_safe_point(self.periodic.save)
        self.snap = rng_state()
        self.phase = "collect"
        if self.pipe is None:
            ppo.collect()
        else:
            self.pipe.collect()
        self.phase = "learn"
        if self.bar is not None:
            self.bar.update(ppo.T * ppo.N)
        mean_ret = ppo.tracker.mean()
        if cfg.stop_at_return is not None and ppo.tracker.full() and mean_ret >= cfg.stop_at_return:
            self.solved = True
            return False
        if ppo.env_steps >= cfg.total_steps:
            return False
        if self.pipe is None:
            ppo.prepare()
            ppo.update()
            ppo.rollout.obs[0].copy_(ppo.rollout.obs[ppo.T])  # the next rollout starts where this one ended
        else:
            self.pipe.hand_over()
        now = time.perf_counter()
        if self.metrics.due(now):
            self.metrics.log(now, mean_ret)
        return True

    def end(self) -> None:
        self.phase = "end"
        self.restarts.check(self.ppo.env_steps)  # counted, not limited: the run is over
        if self.pipe is not None:  # every rollout handed over is learned; its state is the run's
            self.pipe.drain()
            self.pipe.absorb()
        self.metrics.close()
        self.lost = self.storage.lost_wakeups()  # before the engine closes

    def full_state(self, rng=None) -> dict:
        """The train state with the run's own counters (wall time so far, restarts)."""
        st = self.ppo.train_state(rng)
        st["wall_seconds"] = self.wall(time.perf_counter())
        st["restarts"] = self.restarts.total
        return st

    def wall(self, now: float) -> float:
        return self.wall_before + now - self.t_start

    def summary(self) -> dict:
        """The last update's losses etc. (the learner's, with the async pipeline)."""
        return self.pipe.summary if self.pipe is not None else self.ppo.summarize()

    def save_learner_safe_point(self, save) -> bool:
        """``save(ppo_view, env_id, env_kwargs, train_state)`` with the async learner's last
        published safe point (its weights and state, the collector's as of the rollout it
        learned); False where there is none yet."""
        found = self.pipe.safe_state()
        if found is None:
            return False
        weights, st = found
        view = self.pipe.checkpoint_view(weights)
        view.env_steps = st["env_steps"]
        st["wall_seconds"] = self.wall(time.perf_counter())
        st["restarts"] = self.restarts.total
        save(view, self.env_id, self.env_kwargs, st, mix=self.mix)
        return True

    # ------------------------------------------------------------------ failure
    def emergency_checkpoint(self, exc: BaseException) -> None:
        """The envs failed (or too many restarts): the learner's state of the last safe
        point is whole, so keep it. Not after a second Ctrl-C: that one means now."""
        if self.run_dir and self.pipe is not None and isinstance(exc, Exception):
            try:  # the learner's last safe point, whichever process failed
                path = os.path.join(self.run_dir, "checkpoint.pt")
                if self.save_learner_safe_point(
                    lambda p, *a, **k: save_checkpoint(path, p, *a[:2], train_state=a[2], **k)
                ):
                    exc.resume_from = self.run_dir
            except Exception:  # pragma: no cover - the original error matters more
                pass
            return
        if (
            self.run_dir
            and self.ppo is not None
            and isinstance(exc, Exception)
            and self.phase in ("collect", "safe point")
        ):
            try:
                save_checkpoint(
                    os.path.join(self.run_dir, "checkpoint.pt"),
                    self.ppo,
                    self.env_id,
                    self.env_kwargs,
                    train_state=self.full_state(self.snap if self.phase == "collect" else None),
                    mix=self.mix,
                )
                exc.resume_from = self.run_dir
            except Exception:  # pragma: no cover - the original error matters more
                pass

    def release(self) -> None:
        if self.learner is not None:  # started early, never taken over
            self.learner.close()
        if self.pipe is not None:
            self.pipe.close()
        if self.bar is not None:
            self.bar.close()
        if self.pin is not None:
            self.pin.release()
        if self.ppo is not None:
            self.ppo.busy.close()
        self.storage.close()

    # ------------------------------------------------------------------ the result
    def finish(self) -> dict:
        """The result; the last logging point, checkpoint, plot and ``result.json``."""
        ppo, monitor = self.ppo, self.monitor
        wall = self.wall(time.perf_counter())
        final_mean = ppo.tracker.mean()
        result = self.result(wall, final_mean)
        rets, lens = ppo.tracker.drain()
        if monitor.last_step is None or monitor.last_step < ppo.env_steps:  # one row per step
            monitor.log(
                ppo.env_steps,
                {
                    "charts/mean_return": final_mean,
                    "health/restarts": self.restarts.total,
                    "charts/env_sps_overall": result["sps"],
                    **self.summary(),
                },
                {"charts/episode_returns": rets, "charts/episode_lengths": lens},
            )
        if monitor.run_dir:
            result["run_dir"] = monitor.run_dir
            if self.run_dir:  # save
                st = self.full_state()
                st["wall_seconds"] = wall
                st["resumed"] = result["resumed"]
                result["checkpoint"] = save_checkpoint(
                    os.path.join(self.run_dir, "checkpoint.pt"),
                    ppo,
                    self.env_id,
                    self.env_kwargs,
                    extra={"result": dict(result)},
                    train_state=st,
                    mix=self.mix,
                )
            monitor.plot(
                title=f"{self.env_id or self.storage.kind} seed {self.cfg.seed}",
                curve=ppo.curve,
                threshold=self.threshold,
            )
            with open(os.path.join(monitor.run_dir, "result.json"), "w") as f:
                json.dump(result, f, indent=1)
        monitor.close()
        return result

    def result(self, wall: float, final_mean: float | None) -> dict:
        cfg, ppo, threshold = self.cfg, self.ppo, self.threshold
        solved = self.solved
        if cfg.stop_at_return is None and threshold is not None and final_mean is not None:
            solved = ppo.tracker.full() and final_mean >= threshold
        out = {
            "env_id": self.env_id,
            "mix": self.mix,
            "group_mean_returns": ppo.tracker.group_means() if self.mix is not None else None,
            "solved": bool(solved),
            "env_steps": int(ppo.env_steps),
            "wall_seconds": round(wall, 4),
            "final_mean_return": None if final_mean is None else round(final_mean, 4),
            "sps": round(ppo.env_steps / wall, 1),
            "episodes": ppo.tracker.episodes,
            "updates": ppo.updates,
            "grad_steps": ppo.grad_steps,
            "seed": cfg.seed,
            "num_envs": ppo.N,
            # num_workers, main_spin_us (how the trainer waited for the workers' step; None:
            # learned, fastvec.train.cli.main_spin_for), env_groups, backend
            **self.storage.transport(),
            "device": str(self.device),
            "policy": describe_policy(ppo.policy),
            "learner": "numpy" if ppo.np_learner is not None else "torch",  # the minibatch gradient's
            "threshold": threshold,
            "startup_seconds": round(self.t_ready - self.t_start, 4),
            "time_breakdown": {
                "act": round(ppo.t_act, 4),
                "env": round(ppo.t_env, 4),
                "prepare": round(ppo.t_prep, 4),
                "learn": round(ppo.t_learn, 4),
            },
            "learner_sps": round(ppo.learn_samples / ppo.t_learn, 1) if ppo.t_learn else None,
            # this process's share of wall time with the learner's device computing (fastvec.train.busy)
            "device_busy_fraction": None if ppo.busy.fraction is None else round(ppo.busy.fraction, 4),
            "restarts": self.restarts.total,
            # sleeps that no doorbell ended, found by the engine's 100 ms look at the flags (None: not the engine)
            "lost_wakeups": self.lost,
            "interrupted": self.interrupted,
            "out_of_time": self.out_of_time,  # stopped by max_seconds
            "resumed": self.resume is not None or bool(self.state.get("resumed")),
            "pipeline": cfg.pipeline,
        }
        if self.pipe is not None:
            stats = self.pipe.stats(time.perf_counter())
            out["pipeline_stats"] = stats
            out["device_busy_fraction"] = stats["learner_busy_fraction"]  # the learner's device: its process
        return out


class _Metrics:
    """The logging points: every ``log_every_s``, the scalars of the interval since the
    last one (speeds, where the time went, health, the last update's losses) to the
    monitor, and the mean return to the progress bar."""

    def __init__(self, run: _Run, now: float):
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
            **run.summary(),
        }
        for k, m in enumerate(ppo.tracker.group_means()):  # a mix's groups, in --mix order
            scal[f"mix/mean_return_{k}"] = m
        if run.pipe is not None:
            st = run.pipe.stats(now)
            scal["pipeline/policy_lag_mean"] = st["policy_lag_mean"]
            scal["pipeline/policy_lag_max"] = st["policy_lag_max"]
            total = max(sum(st["policy_lag_histogram"]), 1)
            for lag, n in enumerate(st["policy_lag_histogram"]):  # the histogram, as shares of steps
                scal[f"pipeline/policy_lag_share_{lag}"] = n / total
            scal["pipeline/learner_busy_fraction"] = st["learner_busy_fraction"]
            scal["pipeline/learner_wait_share"] = st["learner_wait_share"]
            scal["pipeline/collector_wait_share"] = st["collector_wait_share"]
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
        return scal

    def close(self) -> None:
        """The busy time since the last logging point into the run's fraction."""
        self.run.ppo.busy.take(self._compute() - self.compute)


class _RestartWatch:
    """Counts the storage's worker restarts (after the step that made them, and at safe
    points); too many within ``restart_window`` env steps raise ``RestartLimitError`` (an
    env that fails on every reset or step must end the run, not loop)."""

    def __init__(self, storage: RolloutStorage, cfg: PPOConfig, before: int = 0):
        self.storage, self.limit, self.window = storage, cfg.max_restarts, cfg.restart_window
        self.seen = 0
        self.total = before
        self.recent: collections.deque = collections.deque()

    def check(self, env_steps: int) -> None:
        records = self.storage.restarts
        new = records[self.seen :]
        self.seen = len(records)
        self.total += len(new)
        self.recent.extend([env_steps] * len(new))
        while self.recent and self.recent[0] <= env_steps - self.window:
            self.recent.popleft()
        if len(self.recent) > self.limit:
            last = (new or records[-1:])[-1].get("error", "")
            raise RestartLimitError(
                f"{len(self.recent)} worker restarts within {self.window} env steps "
                f"(max_restarts={self.limit}); the last: {last}"
            )
