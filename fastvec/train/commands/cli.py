"""``fastvec train`` and ``fastvec eval``: the command lines, their flags and errors.

``fastvec train`` builds the config (preset < flags < ``--set``), or the resumed run's,
and calls ``fastvec.train.commands.launch.run_training`` (what it does from Python); ``fastvec
eval`` calls ``fastvec.train.commands.evaluate.evaluate``.

    fastvec train ENV_ID [--seed N] [--num-envs N] [--num-workers N] [--total-steps N]
                  [--env-kwargs key=value,...] [--mix [id=ID,][count=N,]key=value,... ...]
                  [--stop-at-return R] [--max-time 5m] [--device auto|cpu|cuda] [--logdir DIR]
                  [--set key=value ...] [--init-from CHECKPOINT] [--no-progress]
                  [--checkpoint-every N] [--backend engine|ray] [--ray-address ADDR] [--actors N]
                  [--nproc N] [--action-mask none|auto|info|method|dict] [--video-every N]
                  [--video-settings key=value,...] [--track wandb [--track-option key=value ...]] [--seeds K] [--sweep KEY=V1,V2]
    fastvec train --resume RUN_DIR [--total-steps N] [--set safe_key=value ...]
    fastvec eval CHECKPOINT [--episodes N] [--seed N] [--env ENV_ID] [--stochastic] [--video DIR]
                 [--video-settings key=value,...] [--member K|LABEL|best]

Both print one JSON object as the last line of stdout and exit 0 on success; ``fastvec
train`` leaves a model card, ``RUN_DIR/README.md`` (``fastvec.train.run.card``). Bad input
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

from ..._cli_util import OneLineParser as _Parser
from ..._cli_util import fail_line
from .launch import build_storage, check_backend, main_spin_for, run_training
from .members import add_member_flags, is_population, member_path, members_call
from .outputs import member_cards, model_card, track_settings
from .train_flags import backend_flags, file_flags, run_flags

__all__ = ["main", "build_config", "build_storage", "main_spin_for", "run_training"]


def _train_parser() -> argparse.ArgumentParser:
    from ..config.settings import TRANSPORT_KEYS

    p = _Parser(
        prog="fastvec train",
        description="Train PPO on a gymnasium env with fastvec.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Hyperparameters: any field of fastvec.train.PPOConfig via --set key=value, "
        "e.g. --set lr=1e-3 --set n_steps=64 --set hidden=64,64. "
        "Transport settings (fastvec.train.TransportConfig: how the envs run and talk to "
        f"the trainer) the same way: {', '.join(TRANSPORT_KEYS)}, e.g. --set context=spawn. "
        "Run with --list-keys to see them with the env's preset values.",
    )
    p.add_argument(
        "env_id",
        nargs="?",
        default=None,
        help="gymnasium env id, e.g. CartPole-v1, ALE/Pong-v5, or your own: MODULE:ENV_ID, MODULE:CALLABLE "
        "(with --resume: the run's)",
    )
    run_flags(p)
    add_member_flags(p)
    file_flags(p)
    backend_flags(p)
    return p


def _eval_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fastvec eval", description="Evaluate a checkpoint written by `fastvec train`.")
    p.add_argument("checkpoint", help="checkpoint.pt (or its run directory)")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--env", default=None, help="check the checkpoint was trained on this env id")
    p.add_argument("--stochastic", action="store_true", help="sample actions instead of the mode")
    p.add_argument("--num-envs", type=int, default=None)
    p.add_argument(
        "--video",
        default=None,
        metavar="DIR",
        help="film every episode into DIR as an MP4 (return and length in its name; videos.json lists them)",
    )
    p.add_argument(
        "--video-settings",
        default=None,
        metavar="KEY=VALUE,...",
        help="with --video, the filmed env's own settings: width=320,height=240, a camera "
        '(MuJoCo: default_camera_config={"type":2,"trackbodyid":1} follows the body); and the film\'s: '
        "seconds=S of each episode (default 0: all), look=full|draft (MuJoCo without shadows, reflections, "
        "anti-aliasing; default full)",
    )
    p.add_argument("--member", default=None, help="a population's member (fastvec train --seeds): index, label or best")
    return p


def build_config(env_id: str, args):
    """Preset for ``env_id`` < command-line flags < ``--set`` overrides."""
    from ..config.overrides import apply_overrides
    from ..config.presets import preset_for
    from ..config.settings import PPOConfig

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


def _mix_num_envs(cfg, args) -> None:
    """Where every ``--mix`` group gives its count, they set ``num_envs`` (one given too
    must agree)."""
    from ..config.mix import counted_total
    from ..config.settings import ConfigError

    total = counted_total(getattr(args, "mix", None) or [])
    if total is None or total == cfg.num_envs:
        return
    if args.num_envs is not None or any(o.replace("-", "_").startswith("num_envs") for o in args.overrides):
        raise ConfigError(f"the --mix counts add up to {total} envs, but num_envs={cfg.num_envs} was given")
    cfg.num_envs = total


def _apply_flags(cfg, args) -> None:
    """The command line's flags, then its ``--set`` overrides, onto ``cfg``."""
    from ..config.overrides import apply_overrides
    from ..config.settings import ConfigError

    flags = {
        "seed": args.seed,
        "num_envs": args.num_envs,
        "num_workers": args.num_workers,
        "stop_at_return": args.stop_at_return,
        "max_seconds": getattr(args, "max_time", None),
        "device": args.device,
        "action_mask": getattr(args, "action_mask", None),
        "video_settings": getattr(args, "video_settings", None),
    }
    steps = (("total_steps", args.total_steps), ("checkpoint_every", args.checkpoint_every))
    for name, value in (*steps, ("video_every", args.video_every)):
        if value is None:
            continue
        low = 0 if name == "checkpoint_every" else 1
        if not float(value).is_integer() or value < low:
            kind = "a positive" if low else "a non-negative"
            raise ConfigError(f"--{name.replace('_', '-')} must be {kind} integer, got {value:g}")
        flags[name] = int(value)
    apply_overrides(cfg, {k: v for k, v in flags.items() if v is not None})
    apply_overrides(cfg, args.overrides)


def resume_config(ckpt: dict, args):
    """The config of the run being resumed with the command line's changes, refused
    (ConfigError) where they touch more than ``SAFE_ON_RESUME``."""
    from ..config.overrides import check_resume_config
    from ..config.settings import PPOConfig

    run = PPOConfig.from_dict(ckpt["config"])
    cfg = PPOConfig.from_dict(ckpt["config"])
    _apply_flags(cfg, args)
    check_resume_config(run, cfg)
    return cfg.validate()


def _train(argv) -> int:
    args = _train_parser().parse_args(argv)
    args.argv = list(argv)
    from ..config.overrides import schedule_note
    from ..config.settings import ConfigError

    if args.seeds is not None or args.sweep is not None or args.pbt or is_population(args.resume):
        return _train_members(args)
    try:
        resume, cfg = _train_config(args)
        nproc = _nproc(args, cfg, resume)
    except (ConfigError, ValueError) as exc:
        return fail_line("train", exc, 2)
    if args.list_keys:
        print(json.dumps(cfg.to_dict(), indent=1))
        return 0
    note = schedule_note(cfg)
    if note and os.environ.get("RANK", "0") == "0":
        print(f"fastvec train: note: {note}", file=sys.stderr, flush=True)
    from ..compute.ranks import launched_world
    from ..run.monitor import default_run_dir

    run_dir = args.resume or args.logdir or default_run_dir(args.env_id, cfg.seed)
    if nproc > 1 and launched_world() == 1:  # this process starts the ranks and watches them
        from .local_ranks import rank_argv, run_ranks

        return run_ranks(rank_argv(argv, None if args.resume else run_dir), nproc)
    import torch  # noqa: F401  (imported before the clock starts)

    init = None
    if args.init_from:
        from ..algo.checkpoints import load_checkpoint

        try:
            init = load_checkpoint(args.init_from)
            if init.get("env_id") not in (None, args.env_id):
                raise ValueError(f"checkpoint {args.init_from} was trained on {init['env_id']}, not {args.env_id}")
        except ValueError as exc:
            return fail_line("train", exc, 2)
    return _train_run(
        lambda stop: run_training(
            args.env_id,
            cfg,
            run_dir=run_dir,
            progress=not args.no_progress,
            tensorboard=not args.no_tensorboard,
            init_from=init,
            env_kwargs=args.env_kwargs,
            mix=args.mix,
            backend=args.backend,
            ray_address=args.ray_address,
            ray_actors=args.actors,
            resume=resume,
            stop=stop,
            track=args.track,
            track_options=args.track_settings,
        ),
        lambda result: model_card(args, cfg, result),
    )


def _train_members(args) -> int:
    """``fastvec train --seeds/--sweep``, or ``--resume`` of a population."""
    from ..config.settings import ConfigError

    try:
        call = members_call(args, build_config, lambda cfg: _apply_flags(cfg, args))
    except (ConfigError, ValueError) as exc:
        return fail_line("train", exc, 2)
    return _train_run(call, lambda result: member_cards(args, result))


def _nproc(args, cfg, resume) -> int:
    """The run's ranks (``--nproc``, or the launcher's ``WORLD_SIZE``); ValueError where
    they cannot serve the run, before any process starts."""
    from ...env_ids import is_pettingzoo
    from ..compute.ranks import check_world, launched_world
    from ..compute.torch_state import resolve_device
    from ..storage.agent_rows import check_agent_run

    launched = launched_world()
    world = launched if args.nproc is None else args.nproc
    if args.nproc is not None and args.nproc < 1:
        raise ValueError(f"--nproc must be a positive integer, got {args.nproc}")
    if launched > 1 and world != launched:
        raise ValueError(f"--nproc {world} differs from the launcher's WORLD_SIZE={launched}: give one of them")
    check_world(cfg, world, backend=args.backend, mix=args.mix, resume=None if resume is None else resume[1])
    if is_pettingzoo(args.env_id):
        check_agent_run(cfg, mix=args.mix, backend=args.backend, world=world)
    if world > 1 and resolve_device(cfg.device).type == "cuda":
        import torch

        local = world if launched == 1 else int(os.environ.get("LOCAL_WORLD_SIZE", world))
        if local > torch.cuda.device_count():
            raise ValueError(
                f"{local} ranks on this machine need a CUDA device each; it has {torch.cuda.device_count()} "
                "(--device cpu trains on gloo)"
            )
    return world


def _train_config(args):
    """``(resumed checkpoint or None, the config)`` of ``fastvec train``'s flags; ValueError
    or ConfigError on bad input, before any process starts."""
    from ..config.presets import check_env_id

    resume = None
    if args.resume is not None:
        if args.mix or args.env_kwargs is not None:
            raise ValueError("--resume continues the run's envs; it does not take --mix or --env-kwargs")
        resume = _resume_target(args)
        args.env_id = resume[1]["env_id"]
        cfg = resume_config(resume[1], args)
    elif args.env_id is None:
        raise ValueError("give an env id (e.g. CartPole-v1) or --resume RUN_DIR")
    else:
        check_env_id(args.env_id)
        cfg = build_config(args.env_id, args)
        if args.mix:  # (counts and ids here; run_training builds one env of each group)
            from ..config.mix import resolve_mix

            resolve_mix(args.mix, args.env_id, cfg.num_envs)
    if args.backend != "ray" and (args.ray_address is not None or args.actors is not None):
        raise ValueError("--ray-address and --actors need --backend ray")
    if args.actors is not None and args.actors < 1:
        raise ValueError(f"--actors must be a positive integer, got {args.actors}")
    if args.actors is not None and args.actors > cfg.num_envs:
        raise ValueError(f"--actors {args.actors} exceeds num_envs={cfg.num_envs}")
    check_backend(cfg, backend=args.backend)
    args.track_settings = track_settings(args)
    if args.backend == "ray" and not args.list_keys:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ValueError('--backend ray needs Ray: pip install "fastvec[ray]"') from None
    return resume, cfg


def _train_run(call, card=None) -> int:
    """``call(stop)``, the run (stopped at a safe point by Ctrl-C or SIGTERM): its JSON
    line and exit code; ``card(result)`` writes its model card."""
    from ...errors import WorkerError
    from ..compute.ranks import OTHER_RANK_FAILED, RankError
    from ..config.settings import ConfigError
    from ..run.stops import StopOnSignal

    stop = StopOnSignal()
    try:
        with stop:
            result = call(stop)
    except WorkerError as exc:  # an env failed (also an instance of the env's exception type)
        return fail_line("train", exc, 1)
    except ConfigError as exc:
        return fail_line("train", exc, 2)
    except RankError as exc:  # another rank failed first: the launcher names that one
        fail_line("train", exc, 1)
        return OTHER_RANK_FAILED
    except KeyboardInterrupt:
        print("fastvec train: interrupted", file=sys.stderr)
        return 128 + (stop.last or signal.SIGINT)
    except Exception as exc:  # env failures (WorkerError), spaces the policy cannot handle
        return fail_line("train", exc, 1)
    if os.environ.get("RANK", "0") == "0":  # a data-parallel run's line is rank 0's
        if card is not None:
            card(result)
        print(json.dumps(result), flush=True)
    return 128 + stop.signum if result.get("interrupted") else 0


def _resume_target(args) -> tuple[str, dict]:
    """``(checkpoint path, checkpoint)`` for ``--resume``, after the flags that cannot go
    with it are refused."""
    from ..algo.checkpoints import resume_checkpoint

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
            "fastvec.train.commands.cli.run_training(venv=..., resume=...)"
        )
    if args.env_id is not None and args.env_id != run_env:
        raise ValueError(f"{args.resume} is a run of {run_env}, not {args.env_id}")
    return found


def _eval(argv) -> int:
    args = _eval_parser().parse_args(argv)
    if args.episodes < 1:
        return fail_line("eval", ValueError(f"--episodes must be positive, got {args.episodes}"), 2)
    from ...env_ids import parse_settings
    from ...errors import WorkerError
    from ..algo.checkpoints import load_checkpoint
    from .evaluate import evaluate
    from .filming import headless_gl

    if args.video is not None:
        headless_gl()  # (before any env's renderer is made)
    try:
        path, member = member_path(args.checkpoint, args.member)
        ckpt = load_checkpoint(path)
        settings = None if args.video_settings is None else parse_settings(args.video_settings, "--video-settings")
    except ValueError as exc:
        return fail_line("eval", exc, 2)
    try:
        result = evaluate(
            ckpt,
            episodes=args.episodes,
            seed=args.seed,
            deterministic=not args.stochastic,
            env_id=args.env,
            num_envs=args.num_envs,
            video_dir=args.video,
            video_settings=settings,
        )
    except WorkerError as exc:  # an env failed (also an instance of the env's exception type)
        return fail_line("eval", exc, 1)
    except ValueError as exc:
        return fail_line("eval", exc, 2)
    except Exception as exc:
        return fail_line("eval", exc, 1)
    print(json.dumps(result if member is None else {"member": member, **result}))
    return 0


def main(name: str, argv: list[str]) -> int:
    if name == "train":
        return _train(argv)
    if name == "eval":
        return _eval(argv)
    print(f"fastvec: unknown command {name!r}", file=sys.stderr)
    return 2
