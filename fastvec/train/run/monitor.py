"""Run directory, TensorBoard, JSON-lines metrics, learning-curve PNG, health probes.

A run directory holds:

- ``events.out.tfevents.*``: TensorBoard scalars and histograms
  (``charts/*``: returns, episode lengths, SPS; ``losses/*``: policy/value/entropy
  losses, approx KL, clip fraction, explained variance; ``health/*``: workers alive,
  step latency, process memory; ``time/*``: where the wall time goes (acting, waiting
  for the envs, targets, learning, the wall clock); ``device/*``: the learner device's
  busy fraction, and NVML's utilisation on CUDA with nvidia-ml-py, ``fastvec.train.compute.busy``);
- ``metrics.jsonl``: one JSON object per logging point (same scalars);
- ``learning_curve.png``: mean episode return against env steps (matplotlib, Agg; a
  small palette PNG, which the model card shows);
- ``videos/``: with ``--video-every``, the videos and ``videos.json``
  (``fastvec.train.commands.videos``);
- ``checkpoint.pt``: written by the trainer (see ``fastvec.train.algo.checkpoints``).

Further sinks (``sinks``: a tracker, ``fastvec.train.run.tracking``) receive each logging
point's scalars as TensorBoard and ``metrics.jsonl`` receive them, at the same step, and
the run's result at its end.

The TensorBoard writer is created (and ``torch.utils.tensorboard`` imported, ~1-2 s)
before the trainer starts its clock; writing happens at most every ``log_every_s``.
"""

from __future__ import annotations

import io
import json
import math
import os
import time

import numpy as np

from ..algo.statistics import thin

__all__ = ["Monitor", "default_run_dir", "process_rss", "worker_health"]


def default_run_dir(env_id: str, seed: int, root: str = "runs") -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = env_id.replace("/", "_").replace(":", "_")  # (ALE/..., pettingzoo:...)
    base = os.path.join(root, f"{safe}-seed{seed}-{stamp}")
    path, k = base, 1
    while os.path.exists(path):
        k += 1
        path = f"{base}-{k}"
    return path


def process_rss(pids=None) -> dict:
    """Resident set size in bytes of this process and of ``pids`` (0 for gone ones)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency of the monitor only
        return {}
    out = {"main": psutil.Process().memory_info().rss}
    for pid in pids or ():
        try:
            out[pid] = psutil.Process(pid).memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            out[pid] = 0
    return out


def worker_health(pids) -> dict:
    """How many of ``pids`` are alive (not zombies), and their total RSS."""
    try:
        import psutil
    except ImportError:  # pragma: no cover
        return {}
    alive, rss = 0, 0
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                alive += 1
                rss += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return {"workers_alive": alive, "workers_total": len(pids), "workers_rss_bytes": rss}


def _jsonable(v):
    if isinstance(v, (np.floating, np.integer)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _truncate_jsonl(path: str, last_step: int) -> int | None:
    """Keep the rows of ``path`` up to env step ``last_step`` (and no torn last line);
    the step of the last row kept (None: none)."""
    keep, kept = [], None
    with open(path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            if row.get("env_steps", 0) <= last_step:
                keep.append(line if line.endswith("\n") else line + "\n")
                kept = row.get("env_steps", 0)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(keep)
    os.replace(tmp, path)
    return kept


class Monitor:
    """Writes scalars to TensorBoard and ``metrics.jsonl``; draws the PNG at close."""

    def __init__(
        self, run_dir: str | None, tensorboard: bool = True, resume_step: int | None = None, sinks: tuple = ()
    ):
        """``resume_step``: a resumed run continues from this env step: the rows logged
        after it (by the run that was interrupted) are dropped from ``metrics.jsonl`` and
        hidden from TensorBoard (``purge_step``), so both continue without a gap or a
        duplicate step. ``sinks``: objects with ``log(step, scalars, histograms)``,
        ``result(result)`` and ``close()`` (a tracker), given every logging point too;
        the monitor closes them."""
        self.run_dir = run_dir
        self.sinks = list(sinks)
        self.writer = None
        self._jsonl = None
        self.points: list[tuple[int, float]] = []  # (env steps, mean return), thinned
        self.last_step: int | None = None
        if run_dir is None:
            return
        os.makedirs(run_dir, exist_ok=True)
        path = os.path.join(run_dir, "metrics.jsonl")
        if resume_step is not None and os.path.exists(path):
            # (a run resumed from its last step logs no second row there)
            self.last_step = _truncate_jsonl(path, resume_step)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            self.writer = SummaryWriter(run_dir, flush_secs=10, purge_step=purge)
        self._jsonl = open(path, "a", buffering=1)

    # ---------------------------------------------------------------- writing
    def log(self, step: int, scalars: dict, histograms: dict | None = None) -> None:
        row = {"env_steps": int(step)}
        logged = {}  # what TensorBoard and the sinks get
        for k, v in scalars.items():
            if v is None:
                continue
            v = _jsonable(v)
            row[k] = v
            if v is not None:
                logged[k] = v
        if self.writer is not None:
            for k, v in logged.items():
                self.writer.add_scalar(k, v, step)
        for sink in self.sinks:
            sink.log(row["env_steps"], logged, histograms)
        if self.writer is not None and histograms:
            for k, values in histograms.items():
                values = np.asarray(values, dtype=np.float64)
                if values.size:
                    self.writer.add_histogram(k, values, step)
        self.last_step = row["env_steps"]
        if row.get("charts/mean_return") is not None:
            self.points.append((row["env_steps"], row["charts/mean_return"]))
            thin(self.points)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(row) + "\n")

    def text(self, tag: str, text: str) -> None:
        if self.writer is not None:
            self.writer.add_text(tag, text)

    def video(self, step: int, path: str, ret: float, length: int) -> None:
        """A video filmed at env step ``step`` (``--video-every``): its return and length as
        TensorBoard scalars ``videos/return`` and ``videos/length``, its file as text
        (not in ``metrics.jsonl``, whose rows go forward in steps)."""
        if self.writer is not None:
            self.writer.add_scalar("videos/return", ret, step)
            self.writer.add_scalar("videos/length", length, step)
            self.writer.add_text("videos/file", path, step)

    # ---------------------------------------------------------------- closing
    def plot(self, path: str | None = None, title: str = "", curve=None, threshold=None) -> str | None:
        """Learning curve (mean return of the last episodes vs env steps) as a PNG:
        ``curve`` (a point per rollout that ended episodes) or the logged points."""
        if self.run_dir is None and path is None:
            return None
        path = path or os.path.join(self.run_dir, "learning_curve.png")
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt

        pts = [(s, r) for s, r in (curve or ()) if r is not None] or self.points
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        if pts:
            x, y = zip(*pts, strict=True)
            ax.plot(x, y, marker="." if len(pts) < 50 else None)
        else:
            ax.text(0.5, 0.5, "no finished episodes", ha="center", va="center", transform=ax.transAxes)
        if threshold is not None:
            ax.axhline(threshold, color="gray", linestyle="--", linewidth=1, label=f"target {threshold:g}")
            ax.legend(loc="lower right")
        ax.set_xlabel("env steps")
        ax.set_ylabel("mean return (last episodes)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        plt.close(fig)
        from PIL import Image  # (matplotlib's own dependency)

        with Image.open(buf) as im:  # a palette PNG: a third of the RGBA one's size, for a model card
            im.convert("RGB").quantize(colors=64).save(path, optimize=True)
        return path

    def result(self, result: dict) -> None:
        """The run's result, to the sinks (``result.json`` is the run's to write)."""
        for sink in self.sinks:
            sink.result(result)

    def close(self) -> None:
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close()
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
