"""A training run: ``train(cfg, storage, monitor)``.

It builds no envs and imports no backend: the caller (``fastvec.train.commands.launch``) chooses
and starts the rollout storage (the engine's shared memory, Ray actors, or another
vector env; any ``fastvec.train.storage.sources.RolloutStorage``) and the monitor (run
directory, TensorBoard). Rollout after rollout its schedule (``fastvec.train.pipelines.lockstep``:
lock-step, or the async pipeline) collects and learns; the run checks the stop
conditions, writes the checkpoints, counts worker restarts and logs; at the end it
writes the checkpoint, the learning curve and ``result.json`` into the run directory.

Between an update and the next rollout the learner's state is whole: that *safe point*
is where the run writes periodic checkpoints, counts worker restarts against their
limit and honours a stop request (``stop``: Ctrl-C / SIGTERM in the CLI). A failure
while the envs step leaves the state of the last safe point untouched (the RNG state is
kept from there), so it is saved too: ``--resume`` loses at most that rollout.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any

import numpy as np

from ..algo.checkpoints import PeriodicCheckpoints, check_spaces, policy_from_checkpoint, save_checkpoint
from ..compute.ranks import SOLO, Ranks, check_world, rank_figures
from ..compute.torch_state import resolve_device, rng_state
from ..config.mix import group_of
from ..config.presets import solve_threshold
from ..config.seeding import OFFSET, env_seeds
from ..config.settings import PPOConfig
from ..model.actor_critic import describe_policy
from ..pipelines.collector import Pipeline
from ..pipelines.lockstep import LockStep, Saved, Schedule, trainer_for
from ..pipelines.ring import check_ring
from ..storage.sources import RolloutStorage
from .report import Metrics, run_result
from .stops import RestartWatch

__all__ = ["train", "Run", "run_env_seeds"]


def run_env_seeds(cfg: PPOConfig, ppo, ranks: Ranks = SOLO, resumed: bool = False) -> list[int] | int:
    """The seeds this rank's envs are reset with (``fastvec.train.config.seeding``, under
    ``ppo.env_seeding``): the run's envs ``rank * n .. rank * n + n - 1`` for its ``n``
    (``num_seeds``: an agent storage's copies). ``resumed``: the resume's own streams after
    ``ppo.env_steps`` steps (new episodes, the same for every resume from one checkpoint).

    A storage without ``num_seeds`` (one written for the protocol before per-env seeds,
    whose ``reset`` takes one int for env i's ``seed + i``) gets that int: the offset
    scheme, which its run's checkpoints then name."""
    storage = ppo.storage
    steps = ppo.env_steps if resumed else None
    if not hasattr(storage, "num_seeds"):
        ppo.env_seeding = OFFSET
        return cfg.seed + ranks.rank * storage.num_envs + (steps or 0)
    n = storage.num_seeds
    return env_seeds(cfg.seed, ranks.rank * n, n, scheme=ppo.env_seeding, env_steps=steps)


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
    ranks: Ranks = SOLO,
    videos=None,
) -> dict:
    """Train PPO on ``storage`` (see ``fastvec.train.storage.sources``), logging to ``monitor``;
    returns the result dict (``solved``, ``env_steps``, ``wall_seconds``,
    ``final_mean_return``, ``sps``, ``restarts``, ``interrupted``, ``resumed`` ...).
    Closes the storage and the monitor.

    ``init``: a loaded checkpoint to start from (weights only; its spaces must match).
    ``resume``: a loaded checkpoint with a train state to continue (``cfg`` is its config,
    with safe changes only; see ``fastvec.train.commands.launch``): weights, optimiser, counters and
    statistics continue, the envs are reset with ``run_env_seeds``. ``stop``: a callable
    asked at every safe point; True ends the run there (``result["interrupted"]``).
    ``t_start``: the ``time.perf_counter()`` the wall time counts from (default: now;
    the CLI passes the moment before it started the envs, so start-up counts). With a
    run directory (``monitor.run_dir``) and ``save``, checkpoints go there. ``learner``:
    for ``pipeline=async``, a ``fastvec.train.pipelines.watch.LearnerProcess`` started
    earlier (the run takes it over; default: one started here). ``mix``: the groups of
    envs the storage's envs are made of, in order (``fastvec.train.config.mix``): kept in the
    checkpoints, each group's training return in the result (``group_mean_returns``).
    ``ranks``: this process's place in a data-parallel run (``fastvec.train.compute.ranks``; the
    storage holds this rank's share of the envs); the ranks stop, checkpoint and end
    together, and the run's rank 0 writes the files. ``videos``: what films the acting
    policy at the safe points (``fastvec.train.commands.videos.VideoRecorder``: ``at(ppo)``
    there, ``finish()`` at the end, ``close()`` always), or None.
    """
    device = _checked(cfg, storage, monitor=monitor, init=init, resume=resume, learner=learner, ranks=ranks)
    t0 = time.perf_counter() if t_start is None else t_start
    run = Run(
        cfg,
        storage,
        monitor,
        device=device,
        envs=(env_id, env_kwargs, mix),
        resume=resume,
        save=save,
        t_start=t0,
        learner=learner,
        ranks=ranks,
        videos=videos,
    )
    try:
        run.start(init if resume is None else resume, progress)
        while run.ppo.env_steps < cfg.total_steps:
            if not run.iterate(stop):
                break
        run.end()
    except BaseException as exc:
        run.emergency_checkpoint(exc)
        if videos is not None:  # (ended at once: the error matters, not the videos)
            videos.close()
        monitor.close()
        raise
    finally:
        run.release()
    try:
        return run.finish()
    finally:
        if videos is not None:
            videos.close()


def _checked(cfg: PPOConfig, storage, *, monitor, init, resume, learner, ranks: Ranks):
    """The run's device, once its arguments are checked; what it was given is closed
    where they are not right."""
    try:
        cfg.validate()
        device = resolve_device(cfg.device)
        if init is not None and resume is not None:
            raise ValueError("give init or resume, not both")
        check_ring(cfg, storage)
        check_world(cfg, ranks.world, resume=resume)
        if storage.num_envs * ranks.world != cfg.num_envs and not ranks.solo:
            raise ValueError(f"rank {ranks.rank}: {storage.num_envs} envs are not its share of num_envs={cfg.num_envs}")
        return device
    except BaseException:
        if learner is not None:
            learner.close()
        storage.close()
        monitor.close()
        raise


class Run:
    """One run's state across its phases: ``start`` (the trainer, from a checkpoint or
    new; the envs reset; the schedule), ``iterate`` (a safe point, a rollout, an update,
    maybe a logging point), ``end``, then ``finish`` (the result, the last checkpoint and
    plot). ``phase`` says where an exception came from (``emergency_checkpoint``).
    ``envs``: ``(env_id, env_kwargs, mix)``, what the checkpoints name."""

    def __init__(
        self,
        cfg: PPOConfig,
        storage,
        monitor,
        *,
        device,
        envs: tuple,
        resume,
        save: bool,
        t_start,
        learner,
        ranks=SOLO,
        videos=None,
    ):
        self.learner, self.ranks, self.videos = learner, ranks, videos
        self.cfg, self.storage, self.monitor, self.device = cfg, storage, monitor, device
        self.env_id, self.env_kwargs, self.mix = envs
        self.resume, self.t_start = resume, t_start
        threshold = cfg.solve_return
        if threshold is None and cfg.stop_at_return is not None:
            threshold = cfg.stop_at_return
        if threshold is None and self.env_id is not None:
            threshold = solve_threshold(self.env_id)
        self.threshold = threshold
        self.run_dir = monitor.run_dir if save else None
        self.periodic = (
            PeriodicCheckpoints(self.run_dir, cfg.checkpoint_every, cfg.keep_checkpoints) if self.run_dir else None
        )
        self.state = resume["train_state"] if resume is not None else {}  # the resumed run's counters
        self.wall_before = float(self.state.get("wall_seconds", 0.0))
        # these from start(); None until then (release and emergency_checkpoint look)
        self.ppo: Any = None
        self.schedule: Any = None
        self.restarts: Any = None
        self.metrics: Any = None
        self.bar: Any = None
        self.t_ready = t_start
        self.solved = self.interrupted = self.out_of_time = False
        self.phase = "start"
        self.snap: Any = None  # RNG state at the last safe point
        self._mean_ret: float | None = None  # the mean return after the last rollout
        self.lost: Any = None

    # ------------------------------------------------------------------ setup
    def start(self, ckpt: dict | None, progress: bool) -> None:
        cfg, storage, resume = self.cfg, self.storage, self.resume
        if ckpt is not None:
            check_spaces(ckpt, storage.single_observation_space, storage.single_action_space, self.env_id or "this env")
        policy = None
        if ckpt is not None:
            policy = policy_from_checkpoint(ckpt)
            policy.train()
        self.ppo = ppo = trainer_for(cfg, storage, self.device, policy, self.ranks)
        if self.mix is not None:  # each group's training return too
            ppo.tracker.set_groups(group_of(self.mix))
        if resume is not None:
            ppo.load_train_state(self.state)  # (with the env seeding the checkpoint names)
            if "ranks" in self.state:  # this rank's own episode statistics
                ppo.tracker.load(self.state["ranks"]["trackers"][self.ranks.rank])
            ppo.restart_envs(run_env_seeds(cfg, ppo, self.ranks, resumed=True))
        else:
            storage.reset(run_env_seeds(cfg, ppo, self.ranks))
        self.schedule = self._schedule()
        self.restarts = restarts = RestartWatch(storage, cfg, int(self.state.get("restarts", 0)))
        storage.on_restart = lambda: restarts.check(ppo.env_steps)  # counted (and limited) as they happen
        if self.periodic is not None:
            self.periodic.start(ppo.env_steps)
        self.t_ready = time.perf_counter()
        if resume is None:
            self.monitor.text("config", "```\n" + json.dumps(cfg.to_dict(), indent=1) + "\n```")
            self.monitor.text("policy", describe_policy(ppo.policy))
        if progress:
            self.bar = _progress_bar(cfg.total_steps, ppo.env_steps, self.env_id)
        self.metrics = Metrics(self, self.t_ready)

    def _schedule(self) -> Schedule:
        if self.cfg.pipeline != "async":
            return LockStep(self.ppo)
        launched, self.learner = self.learner, None
        where = (self.run_dir, self.env_id, self.env_kwargs, self.mix)
        return Pipeline(self.cfg, self.storage, self.ppo, self.device, where, launched)

    # ------------------------------------------------------------------ one iteration
    def iterate(self, stop) -> bool:
        """A safe point, a rollout and (unless the run ends with it) an update; False
        once the run ends (stop request, solved, ``max_seconds`` spent, or its steps done).
        Its phases are ``safe_point``, ``collected`` and ``learned``, around the
        schedule's ``collect`` and ``learn`` (a population drives them for all its members)."""
        if not self.safe_point(stop):
            return False
        self.schedule.collect()
        if not self.collected():
            return False
        self.schedule.learn()
        self.learned()
        return True

    def safe_point(self, stop) -> bool:
        """The safe point before a rollout: restarts counted, a stop request or the clock
        honoured (False: the run ends here), a periodic checkpoint where one is due."""
        cfg, ppo, schedule = self.cfg, self.ppo, self.schedule
        self.phase = "safe point"
        self.restarts.check(ppo.env_steps)
        stopping = stop is not None and stop()
        late = cfg.max_seconds is not None and self.wall(time.perf_counter()) >= cfg.max_seconds
        due = self.periodic is not None and self.periodic.due(ppo.env_steps)
        if not self.ranks.solo:  # any rank's stop request or clock, rank 0's checkpoints
            stopping, late, due = (x > 0 for x in self.ranks.floats([stopping, late, due]))
        if stopping:
            self.interrupted = True
            return False
        if late:
            self.out_of_time = True
            return False
        if due and (saved := schedule.safe_point()) is not None:
            state = self._counted(saved.state)
            if self.periodic is not None:
                self.periodic.save(saved.holder, self.env_id, self.env_kwargs, state, mix=self.mix)
        if self.videos is not None:
            self.videos.at(ppo)
        self.snap = rng_state()
        self.phase = "collect"
        return True

    def collected(self) -> bool:
        """After a rollout: False where the run ends with it (solved, or its steps done)."""
        cfg, ppo = self.cfg, self.ppo
        self.phase = "learn"
        if self.videos is not None:
            self.videos.learning()
        if self.bar is not None:
            self.bar.update(ppo.T * ppo.N * self.ranks.world)
        self._mean_ret, full = self.mean_return()
        mean_ret = self._mean_ret
        if cfg.stop_at_return is not None and full and mean_ret is not None and mean_ret >= cfg.stop_at_return:
            self.solved = True
            return False
        return ppo.env_steps < cfg.total_steps

    def learned(self) -> None:
        """After an update: a logging point where one is due."""
        now = time.perf_counter()
        if self.metrics.due(now):
            self.metrics.log(now, self._mean_ret)

    def end(self) -> None:
        self.phase = "end"
        self.restarts.check(self.ppo.env_steps)  # counted, not limited: the run is over
        self.schedule.finish()  # every rollout handed over is learned; its state is the run's
        self.metrics.close()
        self.lost = self.storage.lost_wakeups()  # before the engine closes

    def _counted(self, state: dict) -> dict:
        """A train state with the run's own counters (wall time so far, restarts) and,
        with several ranks, every rank's episode statistics (a collective: every rank
        calls it at the same point)."""
        state["wall_seconds"] = self.wall(time.perf_counter())
        state["restarts"] = self.restarts.total
        if not self.ranks.solo:
            state["ranks"] = {"world": self.ranks.world, "trackers": self.ranks.gather(state["tracker"])}
        return state

    def mean_return(self) -> tuple[float | None, bool]:
        """The mean return of the last episodes and whether the window is full: with
        several ranks, the mean of the ranks' means (a collective), full where all are."""
        tracker = self.ppo.tracker
        mean = tracker.mean()
        if self.ranks.solo:
            return mean, tracker.full()
        total, have, full = self.ranks.floats([mean or 0.0, mean is not None, tracker.full()])
        return (total / have if have else None), bool(full == self.ranks.world)

    def return_spread(self) -> tuple[float | None, int]:
        """The standard deviation (ddof 0) of the returns ``mean_return`` averages, and
        how many there are: with several ranks, over all of theirs (a collective)."""
        window = np.asarray(self.ppo.tracker.window, dtype=np.float64)
        if self.ranks.solo:
            return (float(np.std(window)) if window.size else None), int(window.size)
        n, total, squares = self.ranks.floats([window.size, window.sum(), np.square(window).sum()])
        if n == 0:
            return None, 0
        return math.sqrt(max(squares / n - (total / n) ** 2, 0.0)), int(n)

    def wall(self, now: float) -> float:
        return self.wall_before + now - self.t_start

    # ------------------------------------------------------------------ failure
    def emergency_checkpoint(self, exc: BaseException) -> None:
        """The envs (or the learner) failed, or too many restarts: where the state of the
        last safe point is whole, keep it. Not after a second Ctrl-C: that one means now."""
        if not (self.run_dir and self.schedule is not None and isinstance(exc, Exception)):
            return
        if not self.ranks.solo:  # the other ranks' statistics are out of reach: the last periodic one stays
            return
        try:
            saved = self.schedule.after_failure(self.phase, self.snap)
            if saved is not None:
                self._save(os.path.join(self.run_dir, "checkpoint.pt"), Saved(saved.holder, self._counted(saved.state)))
                exc.resume_from = self.run_dir  # type: ignore[attr-defined]
        except Exception:  # pragma: no cover - the original error matters more
            pass

    def _save(self, path: str, saved: Saved, **extra) -> str:
        return save_checkpoint(
            path, saved.holder, self.env_id, self.env_kwargs, train_state=saved.state, mix=self.mix, **extra
        )

    def release(self) -> None:
        if self.learner is not None:  # started early, never taken over
            self.learner.close()
        if self.schedule is not None:
            self.schedule.close()
        if self.bar is not None:
            self.bar.close()
        if self.ppo is not None:
            self.ppo.busy.close()
        self.storage.close()

    # ------------------------------------------------------------------ the result
    def finish(self) -> dict:
        """The result; the last logging point, checkpoint, plot and ``result.json``."""
        ppo, monitor = self.ppo, self.monitor
        wall = self.wall(time.perf_counter())
        final_mean, _full = self.mean_return()
        result = run_result(self, wall, final_mean, self.return_spread())
        if self.videos is not None:  # the videos still queued (the envs closed, the clock stopped), logged
            result["video_wait_seconds"] = round(self.videos.finish(), 3)
        if not self.ranks.solo:
            result["ranks"] = rank_figures(self.ranks, ppo.env_steps // self.ranks.world, wall, self.restarts.total)
        rets, lens = ppo.tracker.drain()
        st = self._counted(ppo.train_state()) if self.run_dir or not self.ranks.solo else {}  # (a collective)
        if monitor.last_step is None or monitor.last_step < ppo.env_steps:  # one row per step
            scalars = {"charts/mean_return": final_mean, "health/restarts": self.restarts.total}
            scalars.update({"charts/env_sps_overall": result["sps"], **self.schedule.summary()})
            monitor.log(ppo.env_steps, scalars, {"charts/episode_returns": rets, "charts/episode_lengths": lens})
        if monitor.run_dir:
            result["run_dir"] = monitor.run_dir
            if self.run_dir:  # save
                st["wall_seconds"] = wall
                st["resumed"] = result["resumed"]
                path = os.path.join(self.run_dir, "checkpoint.pt")
                result["checkpoint"] = self._save(path, Saved(ppo, st), extra={"result": dict(result)})
            monitor.plot(
                title=f"{self.env_id or self.storage.kind} seed {self.cfg.seed}",
                curve=ppo.curve,
                threshold=self.threshold,
            )
            with open(os.path.join(monitor.run_dir, "result.json"), "w") as f:
                json.dump(result, f, indent=1)
        monitor.result(result)
        monitor.close()
        return result


def _progress_bar(total: int, done: int, env_id: str | None):
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=min(done, total),
        unit="step",
        unit_scale=True,
        file=sys.stderr,
        mininterval=0.5,
        dynamic_ncols=True,
        desc=env_id or "train",
        leave=False,
    )
