"""Filming an env's episodes into MP4 files (``fastvec eval --video DIR``, and the
recorder process of ``fastvec train --video-every N``, ``fastvec.train.commands.videos``).

Each env is built with ``render_mode="rgb_array"`` and wrapped in a ``Film``: its frame
after every reset and after every step goes to imageio's ffmpeg writer (``imageio-ffmpeg``,
the ``envs`` extra), so an episode of ``L`` steps is a file of ``L + 1`` frames, under a
temporary name until it ends. ``Reel`` then names the episodes the evaluation counts
(``episode-003-return-212.5-len-500.mp4``, or the prefix given) and drops the others,
and lists them in the folder's ``videos.json`` (``file``, ``return``, ``length``, ...).
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from typing import Any

import gymnasium as gym
import numpy as np

from ..config.rules import ConfigError

__all__ = ["INDEX", "headless_gl", "check_video", "filmed_factory", "Film", "Reel", "add_to_index"]

INDEX = "videos.json"
TMP_PREFIX = ".tmp-"


def headless_gl() -> None:
    """Where no display is set and ``MUJOCO_GL`` is not, MuJoCo renders off-screen
    through EGL (read when its first renderer is made)."""
    if not os.environ.get("DISPLAY") and not os.environ.get("MUJOCO_GL"):
        os.environ["MUJOCO_GL"] = "egl"


def check_video(env_id: str, env_kwargs: dict | None, folder: str, *, mix=None, settings: dict | None = None) -> str:
    """ConfigError, one line, where videos of ``env_id`` cannot be written into
    ``folder``: imageio-ffmpeg missing, a folder that cannot be written, a mix or a
    PettingZoo env, an env without ``rgb_array`` rendering, ``settings`` (the filmed
    env's own: a frame's size, a camera) it does not take. The folder, made."""
    from ...env_ids import is_pettingzoo
    from ..config.presets import env_factory

    try:
        import imageio_ffmpeg

        imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError):
        raise ConfigError('videos need imageio-ffmpeg: pip install "fastvec[envs]"') from None
    if mix or is_pettingzoo(env_id):
        raise ConfigError(f"videos film one gymnasium env given by its id, not {'a mix' if mix else env_id}")
    env = env_factory(env_id, env_kwargs)()
    try:
        modes = list(env.metadata.get("render_modes") or [])
    finally:
        env.close()
    if "rgb_array" not in modes:
        raise ConfigError(f"{env_id} has no rgb_array rendering to film (its render_modes: {modes or 'none'})")
    if settings:
        try:
            env_factory(env_id, {**(env_kwargs or {}), **settings, "render_mode": "rgb_array"})().close()
        except Exception as exc:  # a setting the env does not take
            text = str(exc).strip().splitlines()
            raise ConfigError(
                f"{env_id} does not film with the video settings {settings}: {type(exc).__name__}: {text[0] if text else ''}"
            ) from None
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=TMP_PREFIX):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot write videos into {folder}: {exc.strerror or exc}") from None
    return folder


def filmed_factory(env_id: str, env_kwargs: dict | None, folder: str, settings: dict | None = None):
    """A picklable factory of ``env_id``'s envs (with ``settings`` besides ``env_kwargs``:
    the filmed env's own) rendering ``rgb_array`` frames, each wrapped in a ``Film``
    writing into ``folder``."""
    from ..config.presets import env_factory

    fn = env_factory(env_id, {**(env_kwargs or {}), **(settings or {}), "render_mode": "rgb_array"})
    return functools.partial(_filmed, fn, folder)


def _filmed(fn, folder: str) -> Film:
    return Film(fn(), folder)


class Film(gym.Wrapper):
    """An env whose every episode is filmed into a file of its own in ``folder``: the
    frame after the reset, then one after each step. An episode that ends is closed and
    its file's path appended to ``ended`` (a temporary name: ``Reel`` names it); one cut
    short by a reset, or by closing, is deleted."""

    def __init__(self, env: gym.Env, folder: str):
        super().__init__(env)
        self.folder = folder
        self.fps = float(env.metadata.get("render_fps") or 30)
        self.writer: Any = None  # imageio's ffmpeg writer of the episode being filmed
        self.path: Any = None  # its file
        self.ended: list[str] = []

    def reset(self, **kwargs):
        out = self.env.reset(**kwargs)
        self._drop()
        import imageio

        fd, self.path = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=".mp4", dir=self.folder)
        os.close(fd)
        self.writer = imageio.get_writer(
            self.path, format="FFMPEG", fps=self.fps, codec="libx264", macro_block_size=2, ffmpeg_log_level="error"
        )
        self._frame()
        return out

    def step(self, action):
        out = self.env.step(action)
        self._frame()
        if out[2] or out[3]:
            self.writer.close()
            self.ended.append(self.path)
            self.writer = self.path = None
        return out

    def _frame(self) -> None:
        frame = self.env.render()
        if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[2] != 3:
            got = type(frame).__name__ if not isinstance(frame, np.ndarray) else f"an array of shape {frame.shape}"
            raise ValueError(f"the env rendered {got}, not an rgb_array frame [height, width, 3]")
        self.writer.append_data(np.ascontiguousarray(frame, dtype=np.uint8))

    def _drop(self) -> None:
        """Delete the episode being filmed (cut short)."""
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # noqa: S110 - a half-written file is deleted anyway
                pass
        if self.path is not None and os.path.exists(self.path):
            os.unlink(self.path)
        self.writer = self.path = None

    def close(self):
        self._drop()
        for path in self.ended:
            if os.path.exists(path):
                os.unlink(path)
        self.ended.clear()
        return super().close()


class Reel:
    """The filmed episodes of a vector env's ``Film`` envs (``venv.envs``, or a wrapper's
    around each, as ``fastvec.action_masks``'): each ended episode named and listed
    (``ended(i, ..., counted=True)``) or deleted."""

    def __init__(self, venv, folder: str, prefix: str | None = None, **extra):
        self.films: list[Film] = [_film_in(env) for env in venv.envs]
        self.folder, self.prefix, self.extra = folder, prefix, extra
        self.entries: list[dict] = []

    def ended(self, i: int, ret: float, length: int, counted: bool) -> None:
        """Env ``i``'s oldest ended episode: kept as the next one, or deleted."""
        path = self.films[i].ended.pop(0)
        if not counted:
            os.unlink(path)
            return
        k = len(self.entries)
        name = f"{self.prefix or f'episode-{k:03d}'}-return-{ret:.1f}-len-{length}.mp4"
        os.chmod(path, 0o644)  # (made private by mkstemp)
        os.replace(path, os.path.join(self.folder, name))
        self.entries.append({"file": name, "episode": k, "return": ret, "length": length, **self.extra})

    def close(self) -> None:
        """List the episodes kept in the folder's ``videos.json``."""
        if self.entries:
            add_to_index(self.folder, self.entries)


def _film_in(env: gym.Env) -> Film:
    """The ``Film`` among ``env``'s wrappers (``env`` itself, or one it wraps)."""
    while not isinstance(env, Film):
        if not isinstance(env, gym.Wrapper):
            raise ValueError(f"{env} is not filmed")
        env = env.env
    return env


def add_to_index(folder: str, entries: list[dict]) -> None:
    """Add ``entries`` to ``folder``'s ``videos.json`` (``{"videos": [...]}``; an entry
    of the same file replaced), written atomically."""
    path = os.path.join(folder, INDEX)
    try:
        with open(path) as f:
            old = json.load(f).get("videos", [])
    except (OSError, ValueError, AttributeError):
        old = []
    names = {e["file"] for e in entries}
    rows = [e for e in old if e.get("file") not in names] + list(entries)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=folder)
    with os.fdopen(fd, "w") as f:
        json.dump({"videos": rows}, f, indent=1)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
