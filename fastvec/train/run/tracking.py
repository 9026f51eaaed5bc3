"""Experiment tracking besides TensorBoard: ``fastvec train --track wandb``.

A tracker is one more sink of ``fastvec.train.run.monitor.Monitor``: at each logging
point it receives the scalars (and histograms) that TensorBoard and ``metrics.jsonl``
receive, at the same env step; at the end, the run's result, and the videos the run
wrote into ``RUN_DIR/videos/*.mp4``. Only the run's rank 0 tracks (it is the one with a
run directory).

Weights & Biases (``pip install "fastvec[track]"``) is the one backend so far. Its
options (``--track-option KEY=VALUE``): ``project`` (default ``fastvec``), ``entity``,
``group``, ``name`` (default: the run directory's name), ``tags`` (comma separated),
``notes``, ``job_type`` and ``mode`` (``online``, ``offline``, ``disabled``). Without a
``mode``, W&B runs offline where ``WANDB_MODE`` is not set and no API key is found
(``WANDB_API_KEY``, or the W&B host in ``~/.netrc``): its files go into
``RUN_DIR/wandb/``, for ``wandb sync`` to upload later. The W&B run's id is kept in
``RUN_DIR/tracking.json``, so ``--resume`` continues the same W&B run.
"""

from __future__ import annotations

import glob
import json
import netrc
import os
import shutil
from typing import Any
from urllib.parse import urlparse

import numpy as np

__all__ = ["TRACKERS", "WANDB_OPTIONS", "check_tracking", "has_wandb_key", "wandb_mode", "open_tracker", "WandbTracker"]

TRACKERS = ("wandb",)
WANDB_OPTIONS = ("project", "entity", "group", "name", "tags", "notes", "job_type", "mode")
_MODES = ("online", "offline", "disabled")
STATE_FILE = "tracking.json"


def check_tracking(track: str | None, options: dict | None = None) -> dict:
    """``options`` checked for the backend ``track`` (None: no tracking, and no options
    allowed): ValueError in one line for an unknown backend or option, or a backend
    that is not installed, before anything starts. Returns the options as strings."""
    options = dict(options or {})
    if track is None:
        if options:
            raise ValueError(f"tracking options {sorted(options)} need --track")
        return {}
    if track not in TRACKERS:
        raise ValueError(f"unknown tracker {track!r}: choose from {', '.join(TRACKERS)}")
    unknown = sorted(set(options) - set(WANDB_OPTIONS))
    if unknown:
        raise ValueError(f"unknown tracking option {unknown[0]!r} for {track}: choose from {', '.join(WANDB_OPTIONS)}")
    if options.get("mode", "online") not in _MODES:
        raise ValueError(f"tracking option mode must be one of {', '.join(_MODES)}, got {options['mode']!r}")
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ValueError('--track wandb needs Weights & Biases: pip install "fastvec[track]"') from None
    return {k: str(v) for k, v in options.items()}


def has_wandb_key() -> bool:
    """Whether W&B would find an API key: ``WANDB_API_KEY``, or its host in ``~/.netrc``."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc().authenticators(host or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode(options: dict) -> str | None:
    """The mode W&B runs in: the option's, else W&B's own choice where ``WANDB_MODE``
    is set or an API key is found (None), else ``offline``."""
    if "mode" in options:
        return options["mode"]
    if os.environ.get("WANDB_MODE") or has_wandb_key():
        return None
    return "offline"


def open_tracker(track: str, run_dir: str | None, config: dict, options: dict, resumed: bool) -> WandbTracker:
    """The tracker of a run in ``run_dir``: a new W&B run, or where ``resumed`` and the
    run directory names one, that W&B run continued (its options kept, those given
    here over them)."""
    if run_dir is None:
        raise ValueError("--track needs a run directory to keep the tracker's files in")
    state_path = os.path.join(run_dir, STATE_FILE)
    kept: dict = {}
    if resumed and os.path.exists(state_path):
        with open(state_path) as f:
            kept = json.load(f).get(track, {})
    return WandbTracker(run_dir, config, {**kept, **options}, state_path)


class WandbTracker:
    """A W&B run as a sink of the monitor: ``log`` (a logging point), ``result`` (the
    run's end), ``close``. ``options``: ``WANDB_OPTIONS``, and ``id`` to continue a run."""

    def __init__(self, run_dir: str, config: dict, options: dict, state_path: str):
        import wandb

        self.wandb: Any = wandb  # (its stubs are stricter than the calls it takes)
        self.run_dir = run_dir
        run_id = options.get("id")
        tags = [t for t in options.get("tags", "").split(",") if t] or None
        self.run: Any = self.wandb.init(
            project=options.get("project", "fastvec"),
            entity=options.get("entity"),
            group=options.get("group"),
            name=options.get("name", os.path.basename(os.path.normpath(run_dir))),
            tags=tags,
            notes=options.get("notes"),
            job_type=options.get("job_type"),
            mode=wandb_mode(options),
            dir=run_dir,
            config=config,
            id=run_id,
            resume="allow" if run_id else None,
            settings=self.wandb.Settings(console="off", silent=True),  # stdout stays the CLI's JSON line
        )
        kept = {k: v for k, v in options.items() if k in WANDB_OPTIONS and k != "mode"}
        with open(state_path, "w") as f:
            json.dump({"wandb": {**kept, "id": self.run.id}}, f, indent=1)
        self.step: int | None = None

    def log(self, step: int, scalars: dict, histograms: dict | None = None) -> None:
        """One logging point: ``scalars`` as TensorBoard got them, at env step ``step``."""
        row = dict(scalars)
        for k, values in (histograms or {}).items():
            values = np.asarray(values, dtype=np.float64)
            if values.size:
                row[k] = self.wandb.Histogram(values)
        self.run.log(row, step=int(step))
        self.step = int(step)

    def result(self, result: dict) -> None:
        """The run's end: ``result`` into the W&B run's summary (and ``result.json`` as
        a file of it where the run directory has one), the videos as media."""
        self.run.summary.update({"result": result})
        path = os.path.join(self.run_dir, "result.json")
        if os.path.exists(path):  # the W&B run's files directory is uploaded with it
            shutil.copy(path, os.path.join(self.run.dir, "result.json"))
        videos = sorted(glob.glob(os.path.join(self.run_dir, "videos", "*.mp4")))
        if videos:
            media = {f"videos/{os.path.splitext(os.path.basename(v))[0]}": self.wandb.Video(v) for v in videos}
            self.run.log(media, step=self.step)

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
