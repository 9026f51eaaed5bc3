"""What ``fastvec train`` leaves besides TensorBoard and the checkpoints: a tracker's run
(``--track``, ``--track-option``; ``fastvec.train.run.tracking``) and the model card,
``RUN_DIR/README.md`` (``fastvec.train.run.card``)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

__all__ = ["add_track_flags", "track_settings", "model_card"]


def add_track_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--track",
        default=None,
        metavar="TRACKER",
        help='log the run to an experiment tracker too: wandb (pip install "fastvec[track]"; offline, '
        "into RUN_DIR/wandb, where no W&B API key is found and WANDB_MODE is not set)",
    )
    p.add_argument(
        "--track-option",
        dest="track_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a tracker setting (repeatable): project, entity, group, name, tags, notes, job_type, mode",
    )


def track_settings(args) -> dict:
    """``--track-option``'s ``KEY=VALUE`` texts as a dict, checked for ``--track``
    (ValueError in one line, also where the tracker is not installed)."""
    from ..run.tracking import check_tracking

    options = {}
    for text in args.track_options:
        key, eq, value = text.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--track-option takes KEY=VALUE, got {text!r}")
        options[key.strip()] = value.strip()
    return options if args.list_keys else check_tracking(args.track, options)


def model_card(args, cfg, result: dict) -> None:
    """The run directory's ``README.md`` for ``fastvec train``'s arguments ``args.argv``
    (a warning, not a failure, where it cannot be written)."""
    from ..compute.ranks import launched_world
    from ..run.card import command_line, record_command, write_model_card

    if not result.get("run_dir"):
        return
    try:
        line = command_line(args.argv, launched_world())
        commands = record_command(result["run_dir"], line, args.resume is not None)
        write_model_card(result["run_dir"], cfg, result, commands)
    except OSError as exc:
        print(f"fastvec train: warning: no model card written: {exc}", file=sys.stderr)


def member_cards(args, result: dict) -> None:
    """Each member's ``README.md`` after ``fastvec train --seeds/--sweep``: its config (from
    its checkpoint) and result, reproduced by the population's command line or by its run
    alone (``--seed S`` and its setting: a member equals it up to float rounding)."""
    from ..algo.checkpoints import load_checkpoint
    from ..config.settings import PPOConfig
    from ..run.card import command_line, record_command, write_model_card

    line = command_line(args.argv)
    shared = _without_members(args.argv)
    pbt = args.pbt or "pbt.jsonl" in os.listdir(result.get("run_dir") or ".")
    for r in result.get("results", []):
        run_dir = r.get("run_dir")
        if not run_dir or not os.path.isfile(os.path.join(run_dir, "checkpoint.pt")):
            continue
        try:
            cfg = PPOConfig.from_dict(load_checkpoint(run_dir)["config"])
            label = os.path.basename(run_dir)
            commands = record_command(run_dir, line, args.resume is not None)
            if not pbt and args.resume is None:  # (PBT's members change settings as they go: no run alone is theirs)
                alone = ["fastvec", "train", *shared, "--seed", str(r["seed"])]
                for part in label.split(",")[:-1]:  # (the swept settings; the seed last)
                    alone += ["--set", part]
                commands = [*commands, f"# member {label} alone: " + shlex.join(alone)]
            write_model_card(run_dir, cfg, r, commands)
        except (OSError, ValueError) as exc:
            print(f"fastvec train: warning: no model card written in {run_dir}: {exc}", file=sys.stderr)


def _without_members(argv: list[str]) -> list[str]:
    """``fastvec train``'s arguments less the population's own (``--seeds``, ``--sweep``,
    ``--pbt``, ``--pbt-every``, ``--logdir``, ``--seed``): what each member's run alone shares."""
    drop_value = {"--seeds", "--sweep", "--pbt-every", "--logdir", "--seed"}
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in drop_value:
            skip = True
        elif a != "--pbt" and a.split("=", 1)[0] not in drop_value:
            out.append(a)
    return out
