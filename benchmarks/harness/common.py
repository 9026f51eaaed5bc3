"""A benchmark run's bookkeeping: the command line, the machine, the progress bar, the
workers' output and the JSON it writes."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import statistics
import sys


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (``PROG: error: MESSAGE``) and exit 2.
    Not ``fastvec._cli_util``'s: the harness also runs against builds without it."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def span(vals, fmt: str = "{:.2f}") -> str:
    """``median (min-max)`` of the values that are not None ("n/a" for none); ``(min to
    max)`` where a value is negative, so that no minus sign reads as the range's dash."""
    vals = [v for v in vals if v is not None]
    if not vals:
        return "n/a"
    sep = " to " if min(vals) < 0 else "-"
    return f"{fmt.format(statistics.median(vals))} ({fmt.format(min(vals))}{sep}{fmt.format(max(vals))})"


def rotated(names: list, i: int) -> list:
    """``names`` in round ``i``'s order: rotated by ``i``, so that each goes first in turn."""
    k = i % len(names)
    return names[k:] + names[:k]


def parse(parser: argparse.ArgumentParser, argv):
    """``parser.parse_args(argv)``, or the exit status 2 of a usage error (already
    printed); ``--help`` still exits."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code == 2:
            return 2
        raise


def positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def nonneg(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return v


def machine(command: str) -> dict:
    """What a result needs to be read later: command, date, cores, CPU, versions, load."""
    import fastvec
    from fastvec.options import available_cores

    return {
        "command": command,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cores": available_cores(),
        "cpu": cpu_model(),
        "platform": platform.platform(),
        "loadavg_start": loadavg(),
        "versions": versions(),
        "fastvec_path": os.path.dirname(os.path.abspath(fastvec.__file__)),
    }


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist in ("fastvec", "numpy", "gymnasium", "stable-baselines3", "envpool", "ale-py", "mujoco", "torch"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def loadavg() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "n/a"


@contextlib.contextmanager
def capture_process_output(path: str):
    """Send fd 1 and 2 (so the envs' worker processes, which inherit them) to ``path``;
    yield a text stream on the original stderr for the progress bar."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        saved = (os.dup(1), os.dup(2))
    except OSError:  # no usable fds: leave output alone
        yield sys.stderr
        return
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    term = os.fdopen(os.dup(saved[1]), "w", buffering=1, errors="replace")
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield term
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)
        term.close()


class Progress:
    """tqdm on the terminal's stderr; ``progress(desc, n)`` advances by n."""

    def __init__(self, total: int, stream, enabled: bool):
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(
                    total=total,
                    file=stream,
                    unit="run",
                    dynamic_ncols=True,
                    leave=True,
                    bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]",
                )
            except ImportError:  # tqdm is optional: no bar
                self.bar = None

    def __call__(self, desc: str, n: int = 0) -> None:
        if self.bar is None:
            return
        if desc:
            self.bar.set_description_str(desc[:48], refresh=False)
        if n:
            self.bar.update(n)
        else:
            self.bar.refresh()

    def close(self):
        if self.bar is not None:
            self.bar.close()


def write_results(out: str | None, text: str, result: dict, stem: str = "results") -> None:
    """Print a run's markdown; with ``out``, write it and its data there (``STEM.md``,
    ``STEM.json``): the latest run of the benchmark."""
    import json

    print(text)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"{stem}.md"), "w") as f:
            f.write(text if text.endswith("\n") else text + "\n")
        with open(os.path.join(out, f"{stem}.json"), "w") as f:
            json.dump(result, f, indent=1, default=json_default)


def json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, tuple):
        return list(o)
    return str(o)
