"""``fastvec train`` (and ``fastvec eval``) run as a user runs them: the command line, a
fresh process, the result JSON it prints last, and the run's ``metrics.jsonl``.

Every benchmark that trains builds its command here, so all measure the same thing:
``python -m fastvec train ENV --seed S ... --no-progress --no-tensorboard`` with the
trainer's defaults for whatever the benchmark does not set.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from .processes import child_env, child_json

FASTVEC = [sys.executable, "-m", "fastvec"]  # the `fastvec` command, on this Python
QUIET = ("--no-progress", "--no-tensorboard")


def train_command(
    env_id: str | None,
    seed: int | None = None,
    *,
    total_steps: int | None = None,
    sets=(),
    extra_args=(),
    logdir: str | None = None,
    checkpoint_every: int | None = None,
) -> list[str]:
    """``python -m fastvec train`` with these settings: ``sets`` each a ``--set key=value``,
    ``extra_args`` any other flags (``--stop-at-return R``, ``--mix``, ``--resume RUN`` with
    no ``env_id``); no progress bar, no TensorBoard."""
    cmd = [*FASTVEC, "train"]
    if env_id is not None:
        cmd.append(env_id)
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if total_steps is not None:
        cmd += ["--total-steps", str(total_steps)]
    for s in sets:
        cmd += ["--set", s]
    cmd += [*extra_args, *QUIET]
    if checkpoint_every is not None:
        cmd += ["--checkpoint-every", str(checkpoint_every)]
    if logdir is not None:
        cmd += ["--logdir", logdir]
    return cmd


def run_fastvec(args: list[str], *, pythonpath: str | None = None, timeout: float | None = None) -> dict:
    """``python -m fastvec ARGS`` in a fresh process, in an empty cwd, importing the fastvec
    in ``pythonpath`` (default: this process's); the JSON it prints last. A failure ends
    the benchmark (``SystemExit`` with the command's stderr)."""
    cmd = [*FASTVEC, *args]
    with tempfile.TemporaryDirectory(prefix="fastvec-bench-") as cwd:
        return child_json(cmd, f"fastvec {' '.join(args)}", timeout, cwd=cwd, env=child_env(pythonpath))


def run_train(
    env_id: str | None, seed: int | None = None, *, pythonpath: str | None = None, timeout=None, **train
) -> dict:
    """One ``fastvec train`` in a fresh process (``train``: ``train_command``'s keywords,
    ``total_steps``, ``sets``, ``extra_args``, ``logdir``, ``checkpoint_every``); its
    result JSON. Without ``logdir`` the run's files go to a folder deleted after it: pass
    one to read its ``metrics.jsonl`` or evaluate its checkpoint."""
    with tempfile.TemporaryDirectory(prefix="fastvec-train-") as tmp:
        if train.get("logdir") is None:
            train["logdir"] = os.path.join(tmp, "run")
        cmd = train_command(env_id, seed, **train)
        return run_fastvec(cmd[len(FASTVEC) :], pythonpath=pythonpath, timeout=timeout)


def metrics_rows(logdir: str) -> list[dict]:
    """The rows of a run's ``metrics.jsonl`` ([] before it exists); a line still being
    written (a run read while it goes, or killed) is left out."""
    rows = []
    try:
        with open(os.path.join(logdir, "metrics.jsonl")) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        return []
    return rows


def return_rows(logdir: str) -> list[dict]:
    """The rows of a run's ``metrics.jsonl`` that log a mean return (the last episodes')."""
    return [r for r in metrics_rows(logdir) if r.get("charts/mean_return") is not None]
