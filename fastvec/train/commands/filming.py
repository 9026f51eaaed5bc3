"""Filming an env's episodes into MP4 files (``fastvec eval --video DIR``, and the
recorder process of ``fastvec train --video-every N``, ``fastvec.train.commands.videos``).

Each env is built with ``render_mode="rgb_array"`` and wrapped in a ``Film``: its frame
after every reset and after every step goes to imageio's ffmpeg writer (``imageio-ffmpeg``,
the ``envs`` extra), so an episode of ``L`` steps is a file of ``L + 1`` frames, under a
temporary name until it ends. ``Reel`` then names the episodes the evaluation counts
(``episode-003-return-212.5-len-500.mp4``, or the prefix given) and drops the others,
and lists them in the folder's ``videos.json`` (``file``, ``return``, ``length``, ...).

Two video settings are fastvec's own, not the env's (``FILM_KEYS``): ``seconds``, the
most of an episode a file holds (its first seconds at the env's ``render_fps``; the
episode still plays to its end, and its return and length are the whole episode's; 0:
all of it), and ``look``: ``full``, or ``draft``, MuJoCo's frames without shadows,
reflections and anti-aliasing, which in software rendering cost some twentieth as much
(other envs render as they do). ``fastvec train --video-every`` films with
``TRAINING_FILM`` unless told otherwise: those videos share the machine with the run.
"""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
from typing import Any

import gymnasium as gym
import numpy as np

from ..config.rules import ConfigError

__all__ = [
    "INDEX",
    "FILM_KEYS",
    "pace_with",
    "TRAINING_FILM",
    "film_settings",
    "headless_gl",
    "check_video",
    "filmed_factory",
    "Film",
    "Reel",
    "add_to_index",
]

INDEX = "videos.json"
TMP_PREFIX = ".tmp-"
FILM_KEYS = ("seconds", "look")  # the video settings fastvec takes; the others go to the env
LOOKS = ("full", "draft")
TRAINING_FILM = {"seconds": 10, "look": "draft"}  # --video-every's own, under the user's
_pace = None  # called before each reset and step of a filmed env (pace_with)


def pace_with(fn) -> None:
    """Call ``fn`` before each reset and step of every filmed env in this process (the
    ``--video-every`` recorder's gate: it films only while the trainer learns)."""
    global _pace
    _pace = fn


def film_settings(settings: dict | None) -> tuple[dict, dict]:
    """``settings`` split into the env's and fastvec's (``FILM_KEYS``, checked);
    ConfigError, one line, on a bad ``seconds`` or ``look``."""
    env = {k: v for k, v in (settings or {}).items() if k not in FILM_KEYS}
    film = {k: v for k, v in (settings or {}).items() if k in FILM_KEYS}
    seconds = film.get("seconds", 0)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < math.inf:
        raise ConfigError(f"the video setting seconds must be a number >= 0 (0: the whole episode), got {seconds!r}")
    if film.get("look", "full") not in LOOKS:
        raise ConfigError(f"the video setting look must be one of {', '.join(LOOKS)}, got {film['look']!r}")
    return env, film


def headless_gl() -> None:
    """Where no display is set and ``MUJOCO_GL`` is not, MuJoCo renders off-screen
    through EGL (read when its first renderer is made)."""
    if not os.environ.get("DISPLAY") and not os.environ.get("MUJOCO_GL"):
        os.environ["MUJOCO_GL"] = "egl"


def check_video(env_id: str, env_kwargs: dict | None, folder: str, *, mix=None, settings: dict | None = None) -> str:
    """ConfigError, one line, where videos of ``env_id`` cannot be written into
    ``folder``: imageio-ffmpeg missing, a folder that cannot be written, a mix or a
    PettingZoo env, an env without ``rgb_array`` rendering, ``settings`` (the filmed
    env's own: a frame's size, a camera) it does not take, a bad ``seconds`` or
    ``look``. The folder, made."""
    from ...env_ids import is_pettingzoo
    from ..config.presets import env_factory

    settings, _ = film_settings(settings)
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
    the filmed env's own, and ``seconds`` and ``look``) rendering ``rgb_array`` frames,
    each wrapped in a ``Film`` writing into ``folder``."""
    from ..config.presets import env_factory

    settings, film = film_settings(settings)
    fn = env_factory(env_id, {**(env_kwargs or {}), **settings, "render_mode": "rgb_array"})
    return functools.partial(_filmed, fn, folder, film)


def _filmed(fn, folder: str, film: dict) -> Film:
    return Film(fn(), folder, **film)


def _draft_look(env: gym.Env) -> None:
    """A MuJoCo env's frames without anti-aliasing, shadows and reflections (others
    untouched); before its first frame."""
    base = env.unwrapped
    renderer, model = getattr(base, "mujoco_renderer", None), getattr(base, "model", None)
    if renderer is None or model is None:
        return
    import mujoco

    model.vis.quality.offsamples = 0  # (read when the renderer's context is made, by the render below)
    env.render()
    for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION):
        renderer.viewer.scn.flags[flag] = 0


class Film(gym.Wrapper):
    """An env whose every episode is filmed into a file of its own in ``folder``: the
    frame after the reset, then one after each step, for at most ``seconds`` (0: all),
    in the ``look`` given. An episode that ends is closed and its file's path and frame
    count appended to ``ended`` (a temporary name: ``Reel`` names it); one cut short by
    a reset, or by closing, is deleted."""

    def __init__(self, env: gym.Env, folder: str, seconds: float = 0, look: str = "full"):
        super().__init__(env)
        self.folder = folder
        self.fps = float(env.metadata.get("render_fps") or 30)
        self.most = max(1, math.ceil(seconds * self.fps)) if seconds else None  # frames a file holds
        self.draft = look == "draft"  # (set up at the first reset)
        self.writer: Any = None  # imageio's ffmpeg writer of the episode being filmed
        self.path: Any = None  # its file
        self.frames = 0  # its frames so far
        self.ended: list[tuple[str, int]] = []

    def reset(self, **kwargs):
        if _pace is not None:
            _pace()
        out = self.env.reset(**kwargs)
        self._drop()
        import imageio

        if self.draft:
            _draft_look(self.env)
            self.draft = False

        fd, self.path = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=".mp4", dir=self.folder)
        os.close(fd)
        self.writer = imageio.get_writer(
            self.path,
            format="FFMPEG",
            fps=self.fps,
            codec="libx264",
            macro_block_size=2,
            ffmpeg_log_level="error",
            output_params=["-preset", "veryfast"],  # (half x264's default work; files some 10% larger)
        )
        self._frame()
        return out

    def step(self, action):
        if _pace is not None:
            _pace()
        out = self.env.step(action)
        self._frame()
        if out[2] or out[3]:
            self.writer.close()
            self.ended.append((self.path, self.frames))
            self.writer = self.path = None
        return out

    def _frame(self) -> None:
        if self.most is not None and self.frames >= self.most:
            return  # (the rest of the episode plays unfilmed: no render, the cost of filming)
        frame = self.env.render()
        if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[2] != 3:
            got = type(frame).__name__ if not isinstance(frame, np.ndarray) else f"an array of shape {frame.shape}"
            raise ValueError(f"the env rendered {got}, not an rgb_array frame [height, width, 3]")
        self.writer.append_data(np.ascontiguousarray(frame, dtype=np.uint8))
        self.frames += 1

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
        self.frames = 0

    def close(self):
        self._drop()
        for path, _ in self.ended:
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
        path, frames = self.films[i].ended.pop(0)
        if not counted:
            os.unlink(path)
            return
        k = len(self.entries)
        name = f"{self.prefix or f'episode-{k:03d}'}-return-{ret:.1f}-len-{length}.mp4"
        os.chmod(path, 0o644)  # (made private by mkstemp)
        os.replace(path, os.path.join(self.folder, name))
        entry = {"file": name, "episode": k, "return": ret, "length": length, "frames": frames}
        self.entries.append({**entry, **self.extra})

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
