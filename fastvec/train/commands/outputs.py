"""What ``fastvec train`` leaves besides TensorBoard and the checkpoints: a tracker's run
(``--track``, ``--track-option``; ``fastvec.train.run.tracking``) and the model card,
``RUN_DIR/README.md`` (``fastvec.train.run.card``)."""

from __future__ import annotations

import argparse
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
