"""``fastvec train ENV --seeds K [--sweep KEY=V1,V2 ...]``, and ``run_members`` from Python.

K members (``fastvec.train.config.members``) trained at once on one engine of ``K * N``
envs (``fastvec.train.run.members``). The population's directory holds ``members.json``
(what it trains: the env, the config, the seeds and the sweep), one run directory per
member (named by its label: ``seed-3``, ``lr=0.001,seed-3``; each what a run alone
writes, so ``fastvec eval``, ``fastvec export`` and ``fastvec report`` take it), and
``result.json`` with every member's result and the comparison of the groups
(``report.md``, ``report.json``, ``report.png``: ``fastvec.report``'s).

``--resume DIR`` continues every member from its newest checkpoint (a member that had
finished stays finished; one killed before its first checkpoint starts again).

What members do not do is refused before any process starts: ``pipeline=async``,
several ranks, recurrent cores, PettingZoo agent rows, mixes of envs, Ray, a vector env
of one's own, ``--init-from``, ``--video-every``.
"""

from __future__ import annotations

import json
import math
import os
import time

from ..config.members import PBT_KEYS, PBT_MIN_MEMBERS, Member, member_configs, parse_seeds, parse_sweep
from ..config.settings import ConfigError, PPOConfig

__all__ = ["run_members", "add_member_flags", "check_members", "is_population", "members_result", "PLAN"]

PLAN = "members.json"
"""The population directory's plan: what ``--resume`` rebuilds the members from."""


def add_member_flags(p) -> None:
    p.add_argument(
        "--seeds",
        default=None,
        metavar="K|S1,S2,...",
        help="train K members at once on one engine, seeds --seed .. --seed+K-1 (or the seeds listed), "
        "each its own run in the run directory",
    )
    p.add_argument(
        "--pbt",
        action="store_true",
        help="population-based training: every --pbt-every env steps the bottom quarter of the members copy "
        "a top-quarter member's weights and settings, then perturb lr, ent_coef, clip_coef, vf_coef, "
        "max_grad_norm, gae_lambda (x0.8 or x1.2); needs --seeds of 4 or more",
    )
    p.add_argument(
        "--pbt-every",
        type=float,
        default=None,
        metavar="N",
        help="env steps (each member's) between PBT's exploits (default: a tenth of --total-steps)",
    )
    p.add_argument(
        "--sweep",
        action="append",
        default=None,
        metavar="KEY=V1,V2,...",
        help="members for each value (repeatable: the grid of the keys' values), times the seeds; "
        "scalar hyperparameters only, e.g. --sweep lr=1e-4,3e-4,1e-3",
    )


def is_population(run_dir: str | None) -> bool:
    """Whether ``run_dir`` is a population's directory (it holds ``members.json``)."""
    return bool(run_dir) and os.path.isfile(os.path.join(run_dir, PLAN))


def check_members(cfg: PPOConfig, env_id: str | None, *, nproc: int = 1, mix=None, backend="engine", init=None) -> None:
    """ConfigError (one line, before any process starts) where members cannot serve the run."""
    from ...env_ids import is_pettingzoo

    why = None
    if cfg.pipeline == "async":
        why = "pipeline=async (members learn in lock-step: --set pipeline=lockstep)"
    elif nproc > 1:
        why = f"--nproc {nproc} (members share one process; run the ranks' runs one by one)"
    elif cfg.policy_core != "none":
        why = f"a recurrent core (policy_core={cfg.policy_core})"
    elif is_pettingzoo(env_id):
        why = "PettingZoo agent rows"
    elif mix:
        why = "--mix (each member's envs are one env id's)"
    elif backend != "engine":
        why = f"--backend {backend} (members run on this machine's engine)"
    elif init is not None:
        why = "--init-from (members start from their own seeds' weights)"
    elif cfg.env_groups != 1:
        why = f"env_groups={cfg.env_groups} (members step every env together)"
    elif cfg.video_every:
        why = f"--video-every {cfg.video_every} (videos film a run alone; film a member with fastvec eval --video)"
    if why is not None:
        raise ConfigError(f"--seeds/--sweep: members cannot train with {why}")


def _resumed_plan(run_dir: str, changes=None) -> tuple[dict, PPOConfig]:
    """The population's plan and config, with ``changes`` (a function that applies the
    command line's safe changes to a config) applied and checked."""
    from ..config.overrides import check_resume_config

    with open(os.path.join(run_dir, PLAN)) as f:
        plan = json.load(f)
    run_cfg = PPOConfig.from_dict(plan["config"])
    cfg = PPOConfig.from_dict(plan["config"])
    if changes is not None:
        changes(cfg)
    check_resume_config(run_cfg, cfg)
    return plan, cfg.validate()


def _member_state(member: Member, run_dir: str, cfg: PPOConfig):
    """``(checkpoint to resume or None, finished)`` of a resumed population's member."""
    from ..algo.checkpoints import resume_checkpoint

    path = os.path.join(run_dir, member.label)
    result = None
    if os.path.isfile(os.path.join(path, "result.json")):
        with open(os.path.join(path, "result.json")) as f:
            result = json.load(f)
    if result and not result.get("interrupted") and (result.get("solved") or result["env_steps"] >= cfg.total_steps):
        return None, True
    try:
        return resume_checkpoint(path)[1], False
    except ValueError:  # killed before its first checkpoint: it starts again
        return None, False


def run_members(
    env_id: str | None = None,
    config: PPOConfig | None = None,
    *,
    seeds: int | str | list[int] = 1,
    sweep: dict | list[str] | None = None,
    run_dir: str,
    env_kwargs: dict | None = None,
    progress: bool = True,
    tensorboard: bool = True,
    pbt_every: int | None = None,
    resume: bool = False,
    changes=None,
    stop=None,
) -> dict:
    """Train the members of ``config`` on ``env_id`` at once: ``seeds`` (a count K, seeds
    ``config.seed .. + K - 1``, or a list of seeds) times the grid ``sweep`` (``{key:
    [values]}`` or ``["key=v1,v2", ...]``), into ``run_dir`` (see the module's docstring).
    ``pbt_every``: population-based training, an exploit every that many env steps
    (``fastvec.train.run.pbt``; None: the members train independently). ``resume``:
    continue the population in ``run_dir`` (``env_id``, ``config``, ``seeds``, ``sweep``
    and ``pbt_every`` are its own; ``changes(cfg)`` may change safe keys). ``stop``: asked
    at every safe point. Returns ``members_result``'s dict."""
    from ..compute.torch_state import warm_up_torch
    from ..config.presets import check_env
    from .launch import settle_mask_source

    plan = _settle(env_id, env_kwargs, config, seeds, sweep, pbt_every, run_dir=run_dir, resume=resume, changes=changes)
    env_id, env_kwargs, cfg = plan["env_id"], plan["env_kwargs"], plan["cfg"]
    check_members(cfg, env_id)
    check_env(env_id, env_kwargs)
    cfg = settle_mask_source(cfg, env_id, env_kwargs)  # (as a run alone records it)
    members = member_configs(cfg, plan["seeds"], plan["sweep"])
    states = [_member_state(m, run_dir, m.cfg) for m in members] if resume else [(None, False)] * len(members)
    if not resume:
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, PLAN), "w") as f:
            json.dump({**{k: v for k, v in plan.items() if k != "cfg"}, "config": cfg.to_dict()}, f, indent=1)
    pbt = _pbt(plan["pbt_every"], members, states, run_dir, cfg)
    monitors = _monitors(members, states, run_dir, tensorboard)
    warm_up_torch()
    t_start = time.perf_counter()
    try:
        trained = _train(
            members,
            cfg,
            monitors,
            env=(env_id, env_kwargs),
            states=states,
            pbt=pbt,
            stop=stop,
            progress=progress,
            t_start=t_start,
        )
    except BaseException as exc:
        if getattr(exc, "resume_from", None):  # (a member's checkpoint saved: the population resumes as one)
            exc.resume_from = run_dir  # type: ignore[attr-defined]
        raise
    wall = time.perf_counter() - t_start
    return members_result(
        members, trained["results"], run_dir, wall, one_by_one=trained["one_by_one"], acted=trained["acted_at_once"]
    )


def _train(members, cfg: PPOConfig, monitors, *, env, states, pbt, stop, progress, t_start) -> dict:
    """``train_members`` on one engine of every member's envs, split into their rows."""
    from ..run.members import train_members
    from ..storage.member_rows import MemberEnvs
    from .launch import build_storage

    try:
        num_envs = len(members) * cfg.num_envs
        storage = build_storage(env[0], PPOConfig.from_dict({**cfg.to_dict(), "num_envs": num_envs}), env_kwargs=env[1])
    except BaseException:
        for mon in monitors:
            mon.close()
        raise
    return train_members(
        members,
        MemberEnvs(storage, len(members)),
        monitors,
        env_id=env[0],
        env_kwargs=env[1],
        resumes=[s[0] for s in states],
        done=[s[1] for s in states],
        pbt=pbt,
        stop=stop,
        progress=progress,
        t_start=t_start,
    )


def _settle(env_id, env_kwargs, config, seeds, sweep, pbt_every, *, run_dir: str, resume: bool, changes) -> dict:
    """``run_members``' arguments settled as a plan (``env_id``, ``env_kwargs``, ``cfg``,
    ``seeds``, ``sweep``, ``pbt_every``): a resumed population's own (its config with
    ``changes``)."""
    if resume:
        plan, cfg = _resumed_plan(run_dir, changes)
        return {**plan, "cfg": cfg, "pbt_every": plan.get("pbt_every")}
    if is_population(run_dir):
        raise ValueError(f"{run_dir} holds a population already: continue it with --resume {run_dir}")
    cfg = (config or PPOConfig()).validate()
    grid = parse_sweep(sweep) if isinstance(sweep, list) else parse_sweep(_sweep_items(sweep))
    seed_list = parse_seeds(seeds, cfg.seed)
    if pbt_every is not None:
        check_pbt(pbt_every, len(seed_list) * max(1, math.prod(len(v) for v in grid.values())))
    return {
        "env_id": env_id,
        "env_kwargs": env_kwargs,
        "cfg": cfg,
        "seeds": seed_list,
        "sweep": grid,
        "pbt_every": pbt_every,
    }


def check_pbt(every, members: int) -> None:
    """ConfigError (one line) where PBT cannot run: fewer than ``PBT_MIN_MEMBERS``
    members, or an interval that is not a positive number of env steps."""
    if members < PBT_MIN_MEMBERS:
        raise ConfigError(
            f"--pbt needs {PBT_MIN_MEMBERS} members or more (the bottom quarter copies the top), got {members}"
        )
    if isinstance(every, bool) or not float(every).is_integer() or every < 1:
        raise ConfigError(f"--pbt-every must be a positive integer of env steps, got {every}")


def _pbt(every, members: list[Member], states: list, run_dir: str, cfg: PPOConfig):
    """The population's ``Pbt`` (None without ``every``); on a resume, each member's
    PBT settings are its checkpoint's, and the lineage goes on from their steps."""
    if every is None:
        return None
    from ..run.pbt import Pbt

    steps = [int(ckpt["train_state"]["env_steps"]) for ckpt, _done in states if ckpt is not None]
    for m, (ckpt, _done) in zip(members, states):
        if ckpt is not None:
            for key in PBT_KEYS:
                setattr(m.cfg, key, ckpt["config"][key])
    return Pbt(run_dir, int(every), cfg.seed, [m.label for m in members], resumed_steps=min(steps) if steps else None)


def _monitors(members: list[Member], states: list, run_dir: str, tensorboard: bool) -> list:
    """Each member's monitor, in its run directory (continuing where its checkpoint was)."""
    from ..run.monitor import Monitor

    return [
        Monitor(
            os.path.join(run_dir, m.label),
            tensorboard=tensorboard,
            resume_step=None if ckpt is None else int(ckpt["train_state"]["env_steps"]),
        )
        for m, (ckpt, _done) in zip(members, states)
    ]


def _sweep_items(sweep: dict | None) -> list[str]:
    return [f"{k}={','.join(map(str, v))}" for k, v in (sweep or {}).items()]


def members_result(
    members: list[Member],
    results: list[dict | None],
    run_dir: str,
    wall: float,
    one_by_one: str | None = None,
    acted: bool = False,
) -> dict:
    """The population's result, written to ``run_dir/result.json``: every member's (read
    back from its directory where it finished before a resume), the population's wall
    time, env steps and where the time went, and the comparison of its groups
    (``fastvec.report``: ``report.md``, ``report.json``, ``report.png`` beside it; for a
    group of one member the scores only, no interval)."""
    from ... import report

    for k, m in enumerate(members):
        if results[k] is None:
            with open(os.path.join(run_dir, m.label, "result.json")) as f:
                results[k] = json.load(f)
    times = {
        k: round(sum(r["time_breakdown"][k] for r in results if r["time_breakdown"]), 4)
        for k in ("act", "prepare", "learn")
    }
    times["env"] = max(
        r["time_breakdown"]["env"] for r in results
    )  # (one engine: every member's env time is the same wait)
    steps = sum(r["env_steps"] for r in results)
    out = {
        "env_id": results[0]["env_id"],
        "members": len(members),
        "labels": [m.label for m in members],
        "solved": all(r["solved"] for r in results),
        "env_steps": steps,
        "wall_seconds": round(wall, 4),
        "sps": round(steps / wall, 1) if wall > 0 else None,
        "time_breakdown": times,
        "interrupted": any(r["interrupted"] for r in results),
        # the members' updates: at once (fastvec.train.algo.stacked), or one by one and why
        "learned_at_once": one_by_one is None,
        "one_by_one": one_by_one,
        "acted_at_once": acted,  # every member's acting step as one batched pass (StackedActor)
        "run_dir": run_dir,
        "results": results,
    }
    groups: dict[str, list] = {}
    for m in members:
        groups.setdefault(m.group, []).append(report.read_run(os.path.join(run_dir, m.label)))
    # (a member with no finished episode, or one that diverged, has no score to compare)
    scored = all(r["final_mean_return"] is not None and math.isfinite(r["final_mean_return"]) for r in results)
    if scored and all(len(g) > 1 for g in groups.values()):
        rep = report.make_report(groups)
        out["aggregate"] = {
            name: {k: g[k] for k in ("n", "scores", "mean", "median", "iqm")} for name, g in rep["groups"].items()
        }
        out["improvement"] = rep["improvement"]
        with open(os.path.join(run_dir, "report.md"), "w") as f:
            f.write(report.render_markdown(rep))
        with open(os.path.join(run_dir, "report.json"), "w") as f:
            json.dump(rep, f, indent=1)
        report.plot(rep, os.path.join(run_dir, "report.png"))
    else:
        out["aggregate"] = {m.group: {"n": 1, "scores": [r["final_mean_return"]]} for m, r in zip(members, results)}
    with open(os.path.join(run_dir, "result.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


def members_call(args, build_config, apply_flags):
    """``fastvec train``'s flags for members, checked (ConfigError or ValueError, one line,
    before any process starts): the call that runs them, given the stop request.
    ``build_config(env_id, args)`` builds a new population's config; ``apply_flags(cfg)``
    applies the command line's changes to a resumed one's."""
    from ..config.presets import check_env_id
    from ..run.monitor import default_run_dir

    if getattr(args, "track", None):
        raise ValueError(
            "--seeds/--sweep: members cannot train with --track yet (each member's run directory has TensorBoard's events)"
        )
    if args.resume is not None:
        if not is_population(args.resume):
            raise ValueError(f"--seeds/--sweep: {args.resume} is a run alone; continue it without them")
        if args.seeds is not None or args.sweep is not None or args.pbt or args.pbt_every is not None:
            raise ValueError("--resume continues the population's members; drop --seeds, --sweep and --pbt")
        _resumed_plan(args.resume, apply_flags)  # (the changes checked here)
        run_dir, env_id, cfg, resume, pbt_every = args.resume, None, None, True, None
    else:
        if args.env_id is None:
            raise ValueError("give an env id (e.g. CartPole-v1) or --resume RUN_DIR")
        check_env_id(args.env_id)
        cfg = build_config(args.env_id, args)
        check_members(cfg, args.env_id, nproc=args.nproc or 1, mix=args.mix, backend=args.backend, init=args.init_from)
        count = len(member_configs(cfg, parse_seeds(args.seeds or 1, cfg.seed), parse_sweep(args.sweep or [])))
        if args.pbt_every is not None and not args.pbt:
            raise ValueError("--pbt-every needs --pbt")
        default_every = max(1, cfg.total_steps // 10)
        pbt_every = (default_every if args.pbt_every is None else args.pbt_every) if args.pbt else None
        if pbt_every is not None:
            check_pbt(pbt_every, count)
        run_dir = args.logdir or default_run_dir(args.env_id, cfg.seed) + "-members"
        if is_population(run_dir):
            raise ValueError(f"{run_dir} holds a population already: continue it with --resume {run_dir}")
        env_id, resume = args.env_id, False
    return lambda stop: run_members(
        env_id,
        cfg,
        seeds=args.seeds or 1,
        sweep=args.sweep or [],
        pbt_every=pbt_every,
        run_dir=run_dir,
        env_kwargs=args.env_kwargs,
        progress=not args.no_progress,
        tensorboard=not args.no_tensorboard,
        resume=resume,
        changes=apply_flags,
        stop=stop,
    )


def member_path(path: str, which: str | None) -> tuple[str, str | None]:
    """``fastvec eval --member``: the run directory of a population's member (``which``:
    its index from 0, its label, or ``best``, the highest final mean return among those
    finished) and its label; ``(path, None)`` without ``which``. ValueError (one line)
    where ``path`` is no population or names no such member."""
    if which is None:
        return path, None
    if not is_population(path):
        raise ValueError(f"--member needs a population's run directory (fastvec train --seeds); {path} is none")
    with open(os.path.join(path, PLAN)) as f:
        plan = json.load(f)
    labels = [m.label for m in member_configs(PPOConfig.from_dict(plan["config"]), plan["seeds"], plan["sweep"])]
    if which == "best":
        scores = {}
        for label in labels:
            result = os.path.join(path, label, "result.json")
            if os.path.isfile(result):
                with open(result) as f:
                    score = json.load(f).get("final_mean_return")
                if score is not None:
                    scores[label] = score
        if not scores:
            raise ValueError(f"--member best: no member of {path} has finished with a mean return yet")
        label = max(scores, key=scores.__getitem__)
    elif which in labels:
        label = which
    elif which.isdigit() and int(which) < len(labels):
        label = labels[int(which)]
    else:
        raise ValueError(
            f"--member {which}: {path} has members 0..{len(labels) - 1} ({', '.join(labels[:4])}, ...) and best"
        )
    return os.path.join(path, label), label
