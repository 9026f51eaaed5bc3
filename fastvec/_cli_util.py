"""What the ``fastvec`` subcommands share on the command line."""

from __future__ import annotations

import argparse
import os
import sys


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (``PROG: error: MESSAGE``, no usage dump)
    and exit with status 2, so a typo reads as one clear sentence."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """An argparse ``type`` (``--max-time``): seconds, or a number with s, m or h
    (``90s``, ``5m``, ``1.5h``)."""
    t = text.strip().lower()
    scale = _UNITS.get(t[-1:], None)
    try:
        v = float(t[:-1] if scale else t) * (scale or 1.0)
    except ValueError:
        v = float("nan")
    if not (v > 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive duration like 300, 90s, 5m or 1.5h, got {text!r}")
    return v


def settings_arg(text: str) -> dict:
    """An argparse ``type`` (``--env-kwargs``): ``key=value,...`` as a dict, values read
    as JSON where they parse (``fastvec.env_ids.parse_settings``)."""
    from .env_ids import parse_settings

    try:
        return parse_settings(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_env_kwargs(parser: argparse.ArgumentParser) -> None:
    """The ``--env-kwargs KEY=VALUE,...`` flag every command that makes envs takes."""
    parser.add_argument(
        "--env-kwargs",
        type=settings_arg,
        default=None,
        metavar="KEY=VALUE,...",
        help="the env's settings: gymnasium.make's keyword arguments, or an entry point's (MODULE:CALLABLE)",
    )


def fail_line(cmd: str, exc: BaseException, code: int) -> int:
    """``exc`` as ``fastvec CMD: error: ...`` on stderr, one line (with its type where
    ``code`` is 1, a failure rather than bad input; the resume command where a checkpoint
    was saved; the rank in a data-parallel run); returns ``code``. ``FASTVEC_DEBUG=1``
    raises it instead, with its traceback."""
    if os.environ.get("FASTVEC_DEBUG"):
        raise exc
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if os.environ.get("WORLD_SIZE", "1") not in ("", "1") and not msg.startswith("rank "):
        msg = f"rank {os.environ.get('RANK')}: {msg}"
    if code == 1:
        msg = f"{type(exc).__name__}: {msg}"
        if getattr(exc, "resume_from", None):
            msg += f" (checkpoint saved; continue with: fastvec train --resume {exc.resume_from})"
    print(f"fastvec {cmd}: error: {msg}", file=sys.stderr)
    return code
