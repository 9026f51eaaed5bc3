"""Starting a run: ``run_training`` (what ``fastvec train`` does, from Python), and the
one place that picks a backend (``build_storage``: the local engine, Ray actors, or a
vector env the caller gives). This is the only importer of ``fastvec.ray``.

``run_training`` resolves what the run continues (``resume``) or starts from
(``init_from``), checks the backend can serve the config, starts the async learner's
interpreter early, the monitor and the envs, and hands them to
``fastvec.train.run.loop.train``, which knows none of them.
"""

from __future__ import annotations

import dataclasses
import os
import time

from ..compute.ranks import check_world, launched_world, ranks_from_environment
from ..config.settings import ConfigError, PPOConfig
from .videos import VideoRecorder, video_folder

__all__ = ["run_training", "build_storage", "check_backend", "main_spin_for"]


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


def build_storage(
    env_id,
    cfg,
    *,
    venv=None,
    env_kwargs=None,
    mix=None,
    backend: str = "engine",
    ray_address: str | None = None,
    ray_actors: int | None = None,
    pin: bool = False,
    ranks=None,
):
    """The rollout storage ``fastvec.train.run.loop.train`` runs on (``num_slots =
    n_steps + 1``, same-step autoreset): ``venv`` wrapped (its owner closes it), else
    ``cfg.num_envs`` envs of ``env_id`` on this machine's engine (``backend="engine"``)
    or in Ray actors (``"ray"``: the cluster at ``ray_address``, default a local Ray
    instance on 127.0.0.1; ``ray_actors`` actors, default one per node;
    ``cfg.num_workers`` worker processes per actor). ``mix``: a resolved mix of envs
    (``fastvec.train.config.mix``) instead of ``env_id`` with ``env_kwargs``; on the engine it is
    placed by cost unless ``cfg.placement`` says otherwise. ``ranks``: this rank's share
    of the envs only (``fastvec.train.compute.ranks``), on workers of its own."""
    from ...env_ids import is_pettingzoo
    from ..config.mix import mix_factories
    from ..config.presets import env_factory
    from ..pipelines.ring import ring_slots
    from ..storage.sources import EngineStorage, RayEngineStorage
    from ..storage.vector_copies import storage_for

    check_backend(cfg, venv=venv, backend=backend)
    slots, tr = ring_slots(cfg), cfg.transport
    if tr.env_groups > 1 and (venv is not None or backend != "engine"):
        raise ConfigError(
            f"env_groups={tr.env_groups} needs the engine backend: "
            f"{'a vector env of your own' if venv is not None else 'Ray'} steps every env in lock-step"
        )
    check_masks_serve(cfg, env_id, venv=venv, mix=mix)
    if venv is not None:
        return storage_for(venv, slots, pin=pin)
    if is_pettingzoo(env_id):
        return _agent_storage(cfg, env_id, env_kwargs, slots)
    fns = mix_factories(mix) if mix is not None else [env_factory(env_id, env_kwargs)] * cfg.num_envs
    if len(fns) != cfg.num_envs:
        raise ConfigError(f"the mix holds {len(fns)} envs, but num_envs={cfg.num_envs}")
    fns, masked = _masked(cfg, fns)
    if ranks is not None and not ranks.solo:
        fns = fns[ranks.share(cfg.num_envs)]
    if backend == "ray":
        from ...ray import RayEngine

        engine = RayEngine(
            fns,
            num_slots=slots,
            autoreset_mode="same_step",
            ray_address=ray_address,
            num_actors=ray_actors,
            workers_per_actor=cfg.num_workers,
            spin_us=tr.spin_us,
            restart_on_error=cfg.restart_on_error,
            step_timeout=cfg.step_timeout,
        )
        return RayEngineStorage(engine, masked=masked)
    storage = None if not masked else (lambda engine: EngineStorage(engine, groups=tr.env_groups, masked=True))
    return _engine_storage(cfg, fns, mix, slots, 1 if ranks is None else ranks.local_world, storage)


def check_masks_serve(cfg, env_id, *, venv=None, mix=None) -> None:
    """ConfigError (one line) where ``cfg.action_mask`` asks for masks the run cannot
    read: from a vector env of your own, or a PettingZoo env's agents."""
    from ...env_ids import is_pettingzoo

    if cfg.action_mask == "none":
        return
    if venv is not None:
        raise ConfigError(
            f"action_mask={cfg.action_mask} needs an env id (fastvec builds the envs and reads their masks), "
            f"not a vector env of your own ({type(venv).__name__})"
        )
    if is_pettingzoo(env_id):
        raise ConfigError(f"action_mask={cfg.action_mask} does not serve PettingZoo envs' agents")


def settle_mask_source(cfg, env_id, env_kwargs=None, mix=None):
    """``cfg`` with its ``action_mask`` source checked on one env built here, before any
    worker starts (``fastvec.action_masks.check_action_mask``, its ValueError a
    ConfigError; ``auto`` settled to ``info``, ``method`` or ``dict``, which checkpoints record)."""
    from ...action_masks import check_action_mask
    from ..config.mix import mix_factories
    from ..config.presets import env_factory

    if cfg.action_mask == "none":
        return cfg
    fn = mix_factories(mix)[0] if mix is not None else env_factory(env_id, env_kwargs)
    try:
        source = check_action_mask(fn, cfg.action_mask, seed=cfg.seed)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return dataclasses.replace(cfg, action_mask=source)


def _masked(cfg, fns: list) -> tuple[list, bool]:
    """The env factories with their masks read (``cfg.action_mask``), and whether they are."""
    from ...action_masks import check_action_mask, masked_factory

    source = cfg.action_mask
    if source == "none":
        return fns, False
    if source == "auto":
        source = check_action_mask(fns[0], source, seed=cfg.seed)
    return [masked_factory(fn, source) for fn in fns], True


def _agent_storage(cfg, env_id: str, env_kwargs, slots: int):
    """``cfg.num_envs`` copies of a PettingZoo env (copy 0 built here first, to check
    it) on this machine's engine, one row per agent (``agent_storage.AgentStorage``)."""
    import functools

    from ...env_ids import make_parallel_env
    from ...pettingzoo_copies import copy_fns
    from ..storage.agent_rows import AgentStorage

    spec, fns = copy_fns([functools.partial(make_parallel_env, env_id, dict(env_kwargs or {}))] * cfg.num_envs)
    return _engine_storage(cfg, fns, None, slots, storage=lambda engine: AgentStorage(engine, spec))


def _engine_storage(cfg, fns, mix, slots: int, local_ranks: int = 1, storage=None):
    """``fns`` on this machine's engine, its workers split into ``env_groups``;
    ``storage``: what makes the storage of the engine (None: ``EngineStorage``)."""
    from ...engine import Engine, batch_workers
    from ...options import available_cores, default_num_workers
    from ..config.mix import is_mix
    from ..storage.sources import EngineStorage

    tr = cfg.transport
    workers, num_envs = cfg.num_workers, len(fns)
    cores = max(1, available_cores() // local_ranks)  # ranks on this machine share its cores
    if workers is None and local_ranks > 1:
        workers = min(num_envs, cores)
    if tr.env_groups > 1:
        try:
            workers = batch_workers(workers, num_envs, num_envs // tr.env_groups, cores)
        except ValueError:
            raise ConfigError(
                f"num_workers={workers} must be a multiple of env_groups={tr.env_groups} whose "
                f"share per group divides {num_envs // tr.env_groups} (the envs of a group): "
                "each group steps on workers of its own, with as many envs each"
            ) from None
    placement = tr.placement or ("balanced" if is_mix(mix) and tr.env_groups == 1 else "contiguous")
    engine = Engine(
        fns,
        num_workers=workers,
        placement=placement,
        space_check="layout" if is_mix(mix) else "equal",  # bounds may differ between groups
        num_slots=slots,
        autoreset_mode="same_step",
        context=tr.context,
        spin_us=tr.spin_us,
        restart_on_error=cfg.restart_on_error,
        step_timeout=cfg.step_timeout,
        main_spin_us=main_spin_for(cfg, workers or default_num_workers(num_envs), cores),
    )
    return EngineStorage(engine, groups=tr.env_groups) if storage is None else storage(engine)


def main_spin_for(cfg, workers: int, cores: int) -> float | None:
    """How the trainer waits for its workers' step (``cfg.main_spin_us`` if set).

    In lock-step with a worker on every core, a trainer spinning through the step takes
    a core from a worker. Measured on 2 cores (``benchmarks/bench_loops.py --loops train``, the
    ``engine_spin`` ablation; ``benchmarks/results/loops*``): sleeping until the last
    worker rings trained InvertedPendulum-v5 at 1.09x and 1.11x the Sync backend against
    1.07x and 0.95x spinning; HalfCheetah-v5 did not move (1.15x/1.22x, 1.24x/1.26x).
    With a core to spare (CartPole's one worker) spinning stays: sleeping there was
    slower (0.88x against 0.96x)."""
    if cfg.main_spin_us is not None:
        return cfg.main_spin_us
    if cfg.env_groups == 1 and workers >= cores:
        return 0.0
    return None


def _resumed(resume, env_id, config, run_dir, init_from, mix):
    """What ``run_training(resume=...)`` continues: ``(checkpoint, env_id, env_kwargs,
    mix, config, run_dir)``, its config changed in ``SAFE_ON_RESUME`` keys at most."""
    from ..algo.checkpoints import resume_checkpoint
    from ..config.overrides import check_resume_config

    if init_from is not None:
        raise ValueError("give init_from or resume, not both")
    path, ckpt = resume_checkpoint(resume) if isinstance(resume, str) else resume
    if isinstance(resume, str):
        run_dir = resume if run_dir is None else run_dir
    if env_id is not None and ckpt.get("env_id") not in (None, env_id):
        raise ValueError(f"{path} is a run of {ckpt['env_id']}, not {env_id}")
    if mix is not None:
        raise ValueError("resume continues the run's envs; it does not take a mix")
    run_cfg = PPOConfig.from_dict(ckpt["config"])
    config = run_cfg if config is None else config
    check_resume_config(run_cfg, config)
    return ckpt, env_id or ckpt.get("env_id"), ckpt.get("env_kwargs"), ckpt.get("mix"), config, run_dir


def _check_envs(cfg, env_id, *, venv, env_kwargs, mix, backend, ray_address, ray_actors):
    """ValueError where the envs asked for cannot be built; ``(env_kwargs, mix)`` settled."""
    from ...env_ids import is_pettingzoo
    from ..storage.agent_rows import check_agent_run

    if env_id is None and venv is None:
        raise ValueError("give an env id or a vector env")
    if is_pettingzoo(env_id):
        check_agent_run(cfg, venv=venv, mix=mix, backend=backend, world=launched_world())
    if mix is not None:
        if venv is not None:
            raise ValueError("a mix builds its own envs: give it with an env id, not with a vector env")
        from ..config.mix import settle_mix

        env_kwargs, mix = settle_mix(mix, env_id, env_kwargs, cfg.num_envs)
    elif venv is None and not is_pettingzoo(env_id):  # (an entry point, or settings: one env built here)
        from ..config.presets import check_env

        check_env(env_id, env_kwargs)
    if backend not in ("engine", "ray"):
        raise ValueError(f"backend must be 'engine' or 'ray', got {backend!r}")
    if backend != "ray" and (ray_address is not None or ray_actors is not None):
        raise ValueError("ray_address and ray_actors need backend='ray'")
    if backend == "ray" and venv is not None:
        raise ValueError("backend='ray' starts its own envs: pass an env id, not a vector env")
    check_backend(cfg, venv=venv, backend=backend)
    return env_kwargs, mix


def run_training(
    env_id: str | None = None,
    config=None,
    *,
    venv=None,
    env_kwargs: dict | None = None,
    mix: list | None = None,
    run_dir: str | None = None,
    progress: bool = True,
    tensorboard: bool = True,
    init_from: str | dict | None = None,
    save: bool = True,
    backend: str = "engine",
    ray_address: str | None = None,
    ray_actors: int | None = None,
    resume: str | tuple | None = None,
    stop=None,
    track: str | None = None,
    track_options: dict | None = None,
) -> dict:
    """What ``fastvec train`` does: train PPO on ``env_id`` (or on ``venv``, a gymnasium
    ``VectorEnv`` with same-step autoreset or an SB3 ``VecEnv``, which the caller keeps
    and closes), logging into ``run_dir`` (TensorBoard events, ``metrics.jsonl``,
    ``learning_curve.png``, ``checkpoint.pt``, ``checkpoints/``, ``result.json``,
    ``videos/`` with ``cfg.video_every``; None: no files), starting from the checkpoint
    ``init_from``. Returns ``train``'s result dict. See ``build_storage`` for ``backend``, ``ray_address`` and ``ray_actors``.

    ``resume``: a run directory (or ``(path, checkpoint)`` from
    ``checkpoints.resume_checkpoint``) to continue in place from its newest checkpoint;
    ``env_id`` and ``config`` default to the run's, a ``config`` given may differ in
    ``SAFE_ON_RESUME`` keys only. ``stop``: a callable the loop asks at every safe point
    (True: checkpoint and return, ``result["interrupted"]``). ``mix``: groups of envs
    (``fastvec.train.config.mix``: ``"key=value,..."`` texts or ``{"env_id", "env_kwargs",
    "count"}`` dicts) the ``cfg.num_envs`` envs are made of, instead of ``env_kwargs``.
    ``track``: a tracker besides TensorBoard (``"wandb"``), with ``track_options``
    (``fastvec.train.run.tracking``); it needs a ``run_dir``."""
    from ..algo.checkpoints import load_checkpoint
    from ..compute.torch_state import resolve_device
    from ..run.tracking import check_tracking

    track_options = check_tracking(track, track_options)  # (before anything starts)
    resume_step, resumed = None, None
    if resume is not None:
        resumed, env_id, kept_kwargs, mix, config, run_dir = _resumed(resume, env_id, config, run_dir, init_from, mix)
        env_kwargs = kept_kwargs if env_kwargs is None else env_kwargs
        resume_step = int(resumed["train_state"]["env_steps"])
    if track is not None and not run_dir:
        raise ValueError(f"track={track!r} needs a run_dir to keep the tracker's files in")
    cfg = (config or PPOConfig()).validate()
    device = resolve_device(cfg.device)
    env_kwargs, mix = _check_envs(
        cfg,
        env_id,
        venv=venv,
        env_kwargs=env_kwargs,
        mix=mix,
        backend=backend,
        ray_address=ray_address,
        ray_actors=ray_actors,
    )
    check_world(cfg, launched_world(), venv=venv, backend=backend, mix=mix, resume=resumed)
    check_masks_serve(cfg, env_id, venv=venv, mix=mix)
    cfg = settle_mask_source(cfg, env_id, env_kwargs, mix)
    ckpt = None
    if init_from is not None:
        ckpt = load_checkpoint(init_from) if isinstance(init_from, str) else init_from
        if env_id is not None and ckpt.get("env_id") not in (None, env_id):
            raise ValueError(f"checkpoint was trained on {ckpt['env_id']}, not {env_id}")
    storage_args = dict(venv=venv, env_kwargs=env_kwargs, mix=mix, backend=backend)
    storage_args.update(ray_address=ray_address, ray_actors=ray_actors, pin=device.type == "cuda")
    videos = video_folder(cfg, env_id, env_kwargs, run_dir, venv=venv, mix=mix) if _writes_files() else None
    if not _writes_files():  # rank 0 writes the files, films and shows the progress
        run_dir, tensorboard, progress, track = None, False, False, None
    plan = _Start(env_id, cfg, run_dir, tensorboard, progress, save, resume_step, resumed, ckpt, stop, storage_args)
    plan = dataclasses.replace(plan, videos=videos, track=None if track is None else (track, track_options))
    return _start(plan)


def _writes_files() -> bool:
    """Whether this process writes the run's files: a run alone, or a data-parallel run's rank 0."""
    return launched_world() == 1 or not int(os.environ.get("RANK", "0"))


@dataclasses.dataclass(frozen=True)
class _Start:
    """A run as ``run_training`` settled it, for ``_start``."""

    env_id: str | None
    cfg: PPOConfig
    run_dir: str | None
    tensorboard: bool
    progress: bool
    save: bool
    resume_step: int | None  # where the monitor's curves continue (a resume)
    resume: dict | None  # the checkpoint a resume continues
    init: dict | None  # the checkpoint a new run starts from (init_from)
    stop: object  # a callable asked at every safe point, or None
    storage_args: dict  # build_storage's keyword arguments
    videos: str | None = None  # the folder --video-every films into (None: no videos)
    track: tuple | None = None  # (tracker, its options), or None


def _monitor(plan: _Start):
    """The run's monitor, with the tracker ``plan.track`` names among its sinks."""
    from ..run.monitor import Monitor
    from ..run.tracking import open_tracker

    monitor = Monitor(plan.run_dir or None, tensorboard=plan.tensorboard, resume_step=plan.resume_step)
    if plan.track is None:
        return monitor
    try:
        sa = plan.storage_args
        config = {"env_id": plan.env_id, "env_kwargs": sa["env_kwargs"], "mix": sa["mix"], "backend": sa["backend"]}
        config.update(plan.cfg.to_dict())
        monitor.sinks.append(open_tracker(plan.track[0], plan.run_dir, config, plan.track[1], plan.resume is not None))
    except BaseException:
        monitor.close()
        raise
    return monitor


def _start(plan: _Start) -> dict:
    """The learner's interpreter (async), the data-parallel group (where a launcher set
    one up; after the learner's fork, which joins a group of its own), the monitor and the
    envs, in that order; then the run. Whatever started is closed again if a later start fails."""
    import numpy as np
    import torch

    from ..compute.torch_state import resolve_device, warm_up_torch
    from ..pipelines.watch import LearnerProcess
    from ..run.loop import train

    cfg, storage_args = plan.cfg, plan.storage_args
    learner = LearnerProcess() if cfg.pipeline == "async" else None  # its interpreter starts while the envs do
    ranks = None
    try:
        # (async: this process acts on the CPU, its learner process has the device)
        ranks = ranks_from_environment(torch.device("cpu") if learner is not None else resolve_device(cfg.device))
        monitor = _monitor(plan)
    except BaseException:
        if learner is not None:
            learner.close()
        if ranks is not None:
            ranks.close()
        raise
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    warm_up_torch()
    t_start = time.perf_counter()  # the clock starts here: env start-up is part of the wall time
    try:
        storage = build_storage(plan.env_id, cfg, ranks=ranks, **storage_args)
    except BaseException:
        if learner is not None:
            learner.close()
        monitor.close()
        ranks.close()
        raise
    env_kwargs, mix = storage_args["env_kwargs"], storage_args["mix"]
    recorder = None
    if plan.videos is not None:
        recorder = VideoRecorder(plan.videos, cfg, monitor, env_id=plan.env_id, env_kwargs=env_kwargs)
    try:
        return train(
            cfg,
            storage,
            monitor,
            env_id=plan.env_id,
            env_kwargs=env_kwargs,
            mix=mix,
            init=plan.init,
            resume=plan.resume,
            stop=plan.stop,
            progress=plan.progress,
            save=plan.save,
            t_start=t_start,
            learner=learner,
            ranks=ranks,
            videos=recorder,
        )
    finally:
        ranks.close()
