"""``fastvec train`` and ``fastvec eval``; the one place that picks a backend.

``run_training`` starts the rollout storage (``build_storage``: the local engine, Ray
actors, or a vector env the caller gives) and hands it to ``fastvec.train.loop.train``,
which knows none of them. This is the only importer of ``fastvec.ray``.

    fastvec train ENV_ID [--seed N] [--num-envs N] [--num-workers N] [--total-steps N]
                  [--mix [id=ID,][count=N,]key=value,... ...]
                  [--stop-at-return R] [--max-time 5m] [--device auto|cpu|cuda] [--logdir DIR]
                  [--set key=value ...] [--init-from CHECKPOINT] [--no-progress]
                  [--checkpoint-every N] [--backend engine|ray] [--ray-address ADDR] [--actors N]
    fastvec train --resume RUN_DIR [--total-steps N] [--set safe_key=value ...]
    fastvec eval CHECKPOINT [--episodes N] [--seed N] [--env ENV_ID] [--stochastic]

Both print one JSON object as the last line of stdout and exit 0 on success. Bad input
(unknown env id, bad ``--set`` key or value, a checkpoint from another env, a missing
checkpoint, a resume that would change the run's config) gives a one-line ``fastvec
train: error: ...`` on stderr and exit code 2; a failure while training (e.g. an env
that raises with ``restart_on_error=false``, or more restarts than ``max_restarts``)
gives a one-line error and exit code 1, after saving a checkpoint to resume from.
SIGINT / SIGTERM stop ``fastvec train`` at the next safe point with a final checkpoint
and the JSON line (``"interrupted": true``), exit 130 / 143; a second one exits at once.
``FASTVEC_DEBUG=1`` shows the traceback instead of the one-line error.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

from .._cli_util import OneLineParser as _Parser

__all__ = ["main", "build_config", "build_storage", "run_training"]


def _train_parser() -> argparse.ArgumentParser:
    from .config import TRANSPORT_KEYS

    p = _Parser(
        prog="fastvec train",
        description="Train PPO on a gymnasium env with fastvec.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Hyperparameters: any field of fastvec.train.PPOConfig via --set key=value, "
        "e.g. --set lr=1e-3 --set n_steps=64 --set hidden=64,64. "
        "Transport settings (fastvec.train.TransportConfig: how the engine's workers and "
        f"the trainer talk) the same way: {', '.join(TRANSPORT_KEYS)}, e.g. --set context=spawn. "
        "Run with --list-keys to see them with the env's preset values.",
    )
    p.add_argument(
        "env_id",
        nargs="?",
        default=None,
        help="gymnasium env id, e.g. CartPole-v1, ALE/Pong-v5 (with --resume: the run's)",
    )
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--num-envs", type=int, default=None)
    p.add_argument(
        "--mix",
        action="append",
        default=None,
        metavar="GROUP",
        help="a group of the run's envs (repeatable): [id=ENV_ID,][count=N,]setting=value,... with the "
        "env's constructor settings, e.g. --mix frame_skip=5 --mix frame_skip=20 (ENV_ID's preset; "
        "uncounted groups share the envs equally; a mix is placed on the workers by cost)",
    )
    p.add_argument("--num-workers", type=int, default=None)
    p.add_argument("--total-steps", type=float, default=None, help="env steps (1e6 accepted)")
    p.add_argument(
        "--stop-at-return",
        type=float,
        default=None,
        help="stop once the mean return of the last 20 episodes reaches this",
    )
    p.add_argument(
        "--max-time",
        type=duration,
        default=None,
        metavar="DURATION",
        help="stop at the first safe point after this much wall time, e.g. 300, 90s, 5m, 1.5h "
        "(the final checkpoint and result as at the end; the schedules do not change)",
    )
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"])
    p.add_argument("--logdir", default=None, help="run directory (default: runs/ENV-seedN-TIME)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a hyperparameter (repeatable)",
    )
    p.add_argument("--zoo", action="store_true", help="use RL Zoo's hyperparameters where known (CartPole)")
    p.add_argument(
        "--init-from", default=None, metavar="CHECKPOINT", help="start from the weights of a checkpoint of the same env"
    )
    p.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its newest checkpoint (same config; "
        "--total-steps, --stop-at-return, --device and other safe keys may change)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=float,
        default=None,
        metavar="N",
        help="env steps between checkpoints in the run directory (1e5 accepted; 0: only at the end; default 100000)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-tensorboard", action="store_true", help="skip TensorBoard event files")
    p.add_argument("--list-keys", action="store_true", help="print the config for ENV_ID and exit")
    p.add_argument(
        "--backend",
        choices=["engine", "ray"],
        default="engine",
        help="engine: envs on this machine (default); ray: envs in Ray actors over a "
        'cluster (pip install "fastvec[ray]"), --num-workers then counts per actor',
    )
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="with --backend ray: the cluster to join (default: start a local Ray instance on 127.0.0.1)",
    )
    p.add_argument(
        "--actors",
        type=int,
        default=None,
        metavar="N",
        help="with --backend ray: Ray actors hosting the envs (default: one per node)",
    )
    return p


def _eval_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fastvec eval", description="Evaluate a checkpoint written by `fastvec train`.")
    p.add_argument("checkpoint", help="checkpoint.pt (or its run directory)")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--env", default=None, help="check the checkpoint was trained on this env id")
    p.add_argument("--stochastic", action="store_true", help="sample actions instead of the mode")
    p.add_argument("--num-envs", type=int, default=None)
    return p


def build_config(env_id: str, args):
    """Preset for ``env_id`` < command-line flags < ``--set`` overrides."""
    from .config import PPOConfig, apply_overrides
    from .presets import preset_for

    cfg = PPOConfig()
    apply_overrides(cfg, preset_for(env_id, zoo=getattr(args, "zoo", False)))
    _apply_flags(cfg, args)
    _mix_num_envs(cfg, args)
    if cfg.num_workers is not None and cfg.num_envs is not None and cfg.num_workers > cfg.num_envs:
        # a preset's worker count must not block a smaller --num-envs
        if args.num_workers is None and not any(o.startswith("num_workers") for o in args.overrides):
            cfg.num_workers = None
    g, w = cfg.env_groups, cfg.num_workers
    if (
        g > 1
        and not any(o.startswith("env_groups") for o in args.overrides)
        and (
            cfg.num_envs % g
            or getattr(args, "backend", "engine") != "engine"
            or (w is not None and (w % g or (cfg.num_envs // g) % (w // g)))
        )
    ):
        cfg.env_groups = 1  # nor may a preset's batch groups block --num-envs, --num-workers or Ray
    return cfg.validate()


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """``--max-time``: seconds, or a number with s, m or h (``90s``, ``5m``, ``1.5h``)."""
    t = text.strip().lower()
    scale = _UNITS.get(t[-1:], None)
    try:
        v = float(t[:-1] if scale else t) * (scale or 1.0)
    except ValueError:
        v = float("nan")
    if not (v > 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive duration like 300, 90s, 5m or 1.5h, got {text!r}")
    return v


def _mix_num_envs(cfg, args) -> None:
    """Where every ``--mix`` group gives its count, they set ``num_envs`` (one given too
    must agree)."""
    from .config import ConfigError
    from .mix import counted_total

    total = counted_total(getattr(args, "mix", None) or [])
    if total is None or total == cfg.num_envs:
        return
    if args.num_envs is not None or any(o.replace("-", "_").startswith("num_envs") for o in args.overrides):
        raise ConfigError(f"the --mix counts add up to {total} envs, but num_envs={cfg.num_envs} was given")
    cfg.num_envs = total


def _apply_flags(cfg, args) -> None:
    """The command line's flags, then its ``--set`` overrides, onto ``cfg``."""
    from .config import ConfigError, apply_overrides

    flags = {
        "seed": args.seed,
        "num_envs": args.num_envs,
        "num_workers": args.num_workers,
        "stop_at_return": args.stop_at_return,
        "max_seconds": getattr(args, "max_time", None),
        "device": args.device,
    }
    for name, value in (("total_steps", args.total_steps), ("checkpoint_every", args.checkpoint_every)):
        if value is None:
            continue
        low = 1 if name == "total_steps" else 0
        if not float(value).is_integer() or value < low:
            kind = "a positive" if low else "a non-negative"
            raise ConfigError(f"--{name.replace('_', '-')} must be {kind} integer, got {value:g}")
        flags[name] = int(value)
    apply_overrides(cfg, {k: v for k, v in flags.items() if v is not None})
    apply_overrides(cfg, args.overrides)


def resume_config(ckpt: dict, args):
    """The config of the run being resumed with the command line's changes, refused
    (ConfigError) where they touch more than ``SAFE_ON_RESUME``."""
    from .config import PPOConfig, check_resume_config

    run = PPOConfig.from_dict(ckpt["config"])
    cfg = PPOConfig.from_dict(ckpt["config"])
    _apply_flags(cfg, args)
    check_resume_config(run, cfg)
    return cfg.validate()


class _StopOnSignal:
    """SIGINT / SIGTERM ask the training loop to stop at its next safe point (it writes
    a checkpoint and returns); a second signal raises KeyboardInterrupt at once."""

    def __init__(self):
        self.signum = None
        self.last = None
        self._old = {}

    def __call__(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame):
        self.last = signum
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        print(
            f"fastvec train: {signal.Signals(signum).name}: stopping at the next safe point with a "
            "checkpoint (again: stop now)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


def _train(argv) -> int:
    args = _train_parser().parse_args(argv)
    from ..errors import WorkerError
    from .config import ConfigError, schedule_note
    from .presets import check_env_id

    resume = None
    try:
        if args.resume is not None:
            if args.mix:
                raise ValueError("--resume continues the run's envs; it does not take --mix")
            resume = _resume_target(args)
            args.env_id = resume[1]["env_id"]
            cfg = resume_config(resume[1], args)
        elif args.env_id is None:
            raise ValueError("give an env id (e.g. CartPole-v1) or --resume RUN_DIR")
        else:
            check_env_id(args.env_id)
            cfg = build_config(args.env_id, args)
            if args.mix:  # (counts and ids here; run_training builds one env of each group)
                from .mix import resolve_mix

                resolve_mix(args.mix, args.env_id, cfg.num_envs)
        if args.backend != "ray" and (args.ray_address is not None or args.actors is not None):
            raise ValueError("--ray-address and --actors need --backend ray")
        if args.actors is not None and args.actors < 1:
            raise ValueError(f"--actors must be a positive integer, got {args.actors}")
        if args.actors is not None and args.actors > cfg.num_envs:
            raise ValueError(f"--actors {args.actors} exceeds num_envs={cfg.num_envs}")
        from .pipeline import check_backend

        check_backend(cfg, backend=args.backend)
        if args.backend == "ray" and not args.list_keys:
            try:
                import ray  # noqa: F401
            except ImportError:
                raise ValueError('--backend ray needs Ray: pip install "fastvec[ray]"') from None
    except (ConfigError, ValueError) as exc:
        return _fail("train", exc, 2)
    if args.list_keys:
        print(json.dumps(cfg.to_dict(), indent=1))
        return 0
    note = schedule_note(cfg)
    if note:
        print(f"fastvec train: note: {note}", file=sys.stderr, flush=True)
    import torch  # noqa: F401  (imported before the clock starts)

    from .monitor import default_run_dir

    run_dir = args.resume or args.logdir or default_run_dir(args.env_id, cfg.seed)
    init = None
    if args.init_from:
        from .checkpoints import load_checkpoint

        try:
            init = load_checkpoint(args.init_from)
            if init.get("env_id") not in (None, args.env_id):
                raise ValueError(f"checkpoint {args.init_from} was trained on {init['env_id']}, not {args.env_id}")
        except ValueError as exc:
            return _fail("train", exc, 2)
    stop = _StopOnSignal()
    try:
        with stop:
            result = run_training(
                args.env_id,
                cfg,
                run_dir=run_dir,
                progress=not args.no_progress,
                tensorboard=not args.no_tensorboard,
                init_from=init,
                mix=args.mix,
                backend=args.backend,
                ray_address=args.ray_address,
                ray_actors=args.actors,
                resume=resume,
                stop=stop,
            )
    except WorkerError as exc:  # an env failed (also an instance of the env's exception type)
        return _fail("train", exc, 1)
    except ConfigError as exc:
        return _fail("train", exc, 2)
    except KeyboardInterrupt:
        print("fastvec train: interrupted", file=sys.stderr)
        return 128 + (stop.last or signal.SIGINT)
    except Exception as exc:  # env failures (WorkerError), spaces the policy cannot handle
        return _fail("train", exc, 1)
    print(json.dumps(result), flush=True)
    return 128 + stop.signum if result.get("interrupted") else 0


def _resume_target(args) -> tuple[str, dict]:
    """``(checkpoint path, checkpoint)`` for ``--resume``, after the flags that cannot go
    with it are refused."""
    from .checkpoints import resume_checkpoint

    for flag, value in (("--init-from", args.init_from), ("--zoo", args.zoo)):
        if value:
            raise ValueError(f"--resume continues a run; it does not take {flag}")
    if args.logdir is not None and os.path.realpath(args.logdir) != os.path.realpath(args.resume):
        raise ValueError("--resume writes into the run's own directory; drop --logdir")
    found = resume_checkpoint(args.resume)
    run_env = found[1].get("env_id")
    if run_env is None:
        raise ValueError(
            f"{found[0]} was trained on a vector env given in Python; resume it with "
            "fastvec.train.cli.run_training(venv=..., resume=...)"
        )
    if args.env_id is not None and args.env_id != run_env:
        raise ValueError(f"{args.resume} is a run of {run_env}, not {args.env_id}")
    return found


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
):
    """The rollout storage ``fastvec.train.loop.train`` runs on (``num_slots =
    n_steps + 1``, same-step autoreset): ``venv`` wrapped (its owner closes it), else
    ``cfg.num_envs`` envs of ``env_id`` on this machine's engine (``backend="engine"``)
    or in Ray actors (``"ray"``: the cluster at ``ray_address``, default a local Ray
    instance on 127.0.0.1; ``ray_actors`` actors, default one per node;
    ``cfg.num_workers`` worker processes per actor). ``mix``: a resolved mix of envs
    (``fastvec.train.mix``) instead of ``env_id`` with ``env_kwargs``; on the engine it is
    placed by cost unless ``cfg.placement`` says otherwise."""
    from .config import ConfigError
    from .mix import is_mix, mix_factories
    from .pipeline import check_backend, ring_slots
    from .presets import env_factory
    from .storage import EngineStorage, RayEngineStorage, storage_for

    check_backend(cfg, venv=venv, backend=backend)
    slots, tr = ring_slots(cfg), cfg.transport
    if tr.env_groups > 1 and (venv is not None or backend != "engine"):
        raise ConfigError(
            f"env_groups={tr.env_groups} needs the engine backend: "
            f"{'a vector env of your own' if venv is not None else 'Ray'} steps every env in lock-step"
        )
    if venv is not None:
        return storage_for(venv, slots, pin=pin)
    fns = mix_factories(mix) if mix is not None else [env_factory(env_id, env_kwargs)] * cfg.num_envs
    if len(fns) != cfg.num_envs:
        raise ConfigError(f"the mix holds {len(fns)} envs, but num_envs={cfg.num_envs}")
    if backend == "ray":
        from ..ray import RayEngine

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
        return RayEngineStorage(engine)
    from ..engine import Engine, batch_workers
    from ..options import available_cores, default_num_workers

    workers = cfg.num_workers
    if tr.env_groups > 1:
        try:
            workers = batch_workers(workers, cfg.num_envs, cfg.num_envs // tr.env_groups, available_cores())
        except ValueError:
            raise ConfigError(
                f"num_workers={workers} must be a multiple of env_groups={tr.env_groups} whose "
                f"share per group divides {cfg.num_envs // tr.env_groups} (the envs of a group): "
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
        main_spin_us=main_spin_for(cfg, workers or default_num_workers(cfg.num_envs), available_cores()),
    )
    return EngineStorage(engine, groups=tr.env_groups)


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
) -> dict:
    """What ``fastvec train`` does: train PPO on ``env_id`` (or on ``venv``, a gymnasium
    ``VectorEnv`` with same-step autoreset or an SB3 ``VecEnv``, which the caller keeps
    and closes), logging into ``run_dir`` (TensorBoard events, ``metrics.jsonl``,
    ``learning_curve.png``, ``checkpoint.pt``, ``checkpoints/``, ``result.json``; None:
    no files), starting from the checkpoint ``init_from``. Returns ``train``'s result
    dict. See ``build_storage`` for ``backend``, ``ray_address`` and ``ray_actors``.

    ``resume``: a run directory (or ``(path, checkpoint)`` from
    ``checkpoints.resume_checkpoint``) to continue in place from its newest checkpoint;
    ``env_id`` and ``config`` default to the run's, a ``config`` given may differ in
    ``SAFE_ON_RESUME`` keys only. ``stop``: a callable the loop asks at every safe point
    (True: checkpoint and return, ``result["interrupted"]``). ``mix``: groups of envs
    (``fastvec.train.mix``: ``"key=value,..."`` texts or ``{"env_id", "env_kwargs",
    "count"}`` dicts) the ``cfg.num_envs`` envs are made of, instead of ``env_kwargs``."""
    import numpy as np
    import torch

    from .checkpoints import load_checkpoint
    from .config import PPOConfig
    from .loop import train
    from .monitor import Monitor
    from .ppo import resolve_device, warm_up_torch

    resume_step = None
    if resume is not None:
        from .checkpoints import resume_checkpoint
        from .config import check_resume_config

        if init_from is not None:
            raise ValueError("give init_from or resume, not both")
        path, ckpt_r = resume_checkpoint(resume) if isinstance(resume, str) else resume
        if isinstance(resume, str):
            run_dir = resume if run_dir is None else run_dir
        if env_id is not None and ckpt_r.get("env_id") not in (None, env_id):
            raise ValueError(f"{path} is a run of {ckpt_r['env_id']}, not {env_id}")
        env_id = env_id or ckpt_r.get("env_id")
        if mix is not None:
            raise ValueError("resume continues the run's envs; it does not take a mix")
        env_kwargs = ckpt_r.get("env_kwargs") if env_kwargs is None else env_kwargs
        mix = ckpt_r.get("mix")
        run_cfg = PPOConfig.from_dict(ckpt_r["config"])
        if config is None:
            config = run_cfg
        check_resume_config(run_cfg, config)
        resume, resume_step = ckpt_r, int(ckpt_r["train_state"]["env_steps"])
    cfg = (config or PPOConfig()).validate()
    device = resolve_device(cfg.device)
    if env_id is None and venv is None:
        raise ValueError("give an env id or a vector env")
    if mix is not None:
        if venv is not None:
            raise ValueError("a mix builds its own envs: give it with an env id, not with a vector env")
        from .mix import settle_mix

        env_kwargs, mix = settle_mix(mix, env_id, env_kwargs, cfg.num_envs)
    if backend not in ("engine", "ray"):
        raise ValueError(f"backend must be 'engine' or 'ray', got {backend!r}")
    if backend != "ray" and (ray_address is not None or ray_actors is not None):
        raise ValueError("ray_address and ray_actors need backend='ray'")
    if backend == "ray" and venv is not None:
        raise ValueError("backend='ray' starts its own envs: pass an env id, not a vector env")
    from .pipeline import check_backend

    check_backend(cfg, venv=venv, backend=backend)
    ckpt = None
    if init_from is not None:
        ckpt = load_checkpoint(init_from) if isinstance(init_from, str) else init_from
        if env_id is not None and ckpt.get("env_id") not in (None, env_id):
            raise ValueError(f"checkpoint was trained on {ckpt['env_id']}, not {env_id}")
    learner = None
    if cfg.pipeline == "async":  # its interpreter starts while the envs do
        from .pipeline import LearnerProcess

        learner = LearnerProcess()
    try:
        monitor = Monitor(run_dir or None, tensorboard=tensorboard, resume_step=resume_step)
    except BaseException:
        if learner is not None:
            learner.close()
        raise
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    warm_up_torch()
    t_start = time.perf_counter()  # the clock starts here: env start-up is part of the wall time
    try:
        storage = build_storage(
            env_id,
            cfg,
            venv=venv,
            env_kwargs=env_kwargs,
            mix=mix,
            backend=backend,
            ray_address=ray_address,
            ray_actors=ray_actors,
            pin=device.type == "cuda",
        )
    except BaseException:
        if learner is not None:
            learner.close()
        monitor.close()
        raise
    return train(
        cfg,
        storage,
        monitor,
        env_id=env_id,
        env_kwargs=env_kwargs,
        mix=mix,
        init=ckpt,
        resume=resume,
        stop=stop,
        progress=progress,
        save=save,
        t_start=t_start,
        learner=learner,
    )


def _eval(argv) -> int:
    args = _eval_parser().parse_args(argv)
    if args.episodes < 1:
        return _fail("eval", ValueError(f"--episodes must be positive, got {args.episodes}"), 2)
    from ..errors import WorkerError
    from .checkpoints import load_checkpoint
    from .evaluate import evaluate

    try:
        ckpt = load_checkpoint(args.checkpoint)
    except ValueError as exc:
        return _fail("eval", exc, 2)
    try:
        result = evaluate(
            ckpt,
            episodes=args.episodes,
            seed=args.seed,
            deterministic=not args.stochastic,
            env_id=args.env,
            num_envs=args.num_envs,
        )
    except WorkerError as exc:  # an env failed (also an instance of the env's exception type)
        return _fail("eval", exc, 1)
    except ValueError as exc:
        return _fail("eval", exc, 2)
    except Exception as exc:
        return _fail("eval", exc, 1)
    print(json.dumps(result))
    return 0


def _fail(cmd: str, exc: BaseException, code: int) -> int:
    if os.environ.get("FASTVEC_DEBUG"):
        raise exc
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if code == 1:
        msg = f"{type(exc).__name__}: {msg}"
        if getattr(exc, "resume_from", None):
            msg += f" (checkpoint saved; continue with: fastvec train --resume {exc.resume_from})"
    print(f"fastvec {cmd}: error: {msg}", file=sys.stderr)
    return code


def main(name: str, argv: list[str]) -> int:
    if name == "train":
        return _train(argv)
    if name == "eval":
        return _eval(argv)
    print(f"fastvec: unknown command {name!r}", file=sys.stderr)
    return 2
