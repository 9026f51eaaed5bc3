"""Videos of a policy: ``fastvec eval --video DIR`` and ``fastvec train --video-every N``.

The files are decoded again (imageio's ffmpeg reader) and held against what they film:
one frame per step plus the reset's, the frames of the episode replayed by hand in a
fresh env with the same seed, the returns ``fastvec eval`` reports without filming, the
steps a short run reaches its safe points at, and TensorBoard's scalars. Every bad
input is one line, before any worker starts; an error mid-run leaves no recorder
process and no half-written file behind."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest
import torch
from helpers import one_line_error

from fastvec.train import PPOConfig, load_checkpoint, run_training
from fastvec.train.algo.checkpoints import policy_from_checkpoint
from fastvec.train.commands.cli import main as cli_main
from fastvec.train.config.presets import env_factory
from fastvec.train.config.settings import ConfigError

imageio = pytest.importorskip("imageio.v2")
pytest.importorskip("imageio_ffmpeg")

NAME = re.compile(r"^(episode-\d{3}|step-\d{9})-return-(-?\d+\.\d)-len-(\d+)\.mp4$")
SMALL = ["--num-envs", "8", "--num-workers", "1", "--no-progress", "--device", "cpu", "--set", "n_steps=64"]


def frames(path) -> list[np.ndarray]:
    with imageio.get_reader(str(path), format="FFMPEG") as r:
        return [np.asarray(f) for f in r]


def diff(a, b) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A briefly trained CartPole run (episodes of some 100-500 steps)."""
    d = tmp_path_factory.mktemp("video") / "run"
    assert (
        cli_main("train", ["CartPole-v1", "--total-steps", "4096", "--logdir", str(d), "--no-tensorboard", *SMALL]) == 0
    )
    return d


def replay(ckpt, seed: int) -> tuple[list[np.ndarray], float]:
    """One episode of the checkpoint's deterministic policy in a fresh env reset with
    ``seed``, by hand: the env's own render after the reset and after every step, and
    the return."""
    pol = policy_from_checkpoint(ckpt)
    env = env_factory("CartPole-v1", {"render_mode": "rgb_array"})()
    obs, _ = env.reset(seed=seed)
    shots, ret, done = [env.render()], 0.0, False
    while not done:
        with torch.no_grad():
            logits = pol.actor_params(torch.as_tensor(obs[None], dtype=torch.float32))
        obs, r, term, trunc, _ = env.step(int(logits.argmax(-1)))
        shots.append(env.render())
        ret, done = ret + r, term or trunc
    env.close()
    return shots, ret


def test_eval_video_files_frames_and_returns(run, tmp_path, capsys):
    out = tmp_path / "videos"
    assert cli_main("eval", [str(run), "--episodes", "4", "--seed", "5", "--video", str(out)]) == 0
    filmed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cli_main("eval", [str(run), "--episodes", "4", "--seed", "5"]) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    index = json.load(open(out / "videos.json"))["videos"]
    names = sorted(f for f in os.listdir(out) if f.endswith(".mp4"))
    assert names == [e["file"] for e in index] == [os.path.basename(v["file"]) for v in filmed["videos"]]
    assert len(names) == 4 and sorted(os.listdir(out)) == [*names, "videos.json"]  # nothing temporary left
    returns = [e["return"] for e in index]
    for k, e in enumerate(index):  # the name says the episode, its return and its length
        m = NAME.match(e["file"])
        assert m and m.group(1) == f"episode-{k:03d}", e["file"]
        assert float(m.group(2)) == pytest.approx(e["return"], abs=0.05) and int(m.group(3)) == e["length"]
        assert len(frames(out / e["file"])) == e["length"] + 1  # the reset's frame, then one per step
    # filming changes no episode: the returns are those eval reports without it
    assert float(np.mean(returns)) == plain["mean_return"] == filmed["mean_return"]
    assert (min(returns), max(returns)) == (plain["min_return"], plain["max_return"])
    assert float(np.mean([e["length"] for e in index])) == plain["mean_length"]


def test_eval_video_frames_are_the_envs_own_renders(run, tmp_path, capsys):
    out = tmp_path / "one"
    assert cli_main("eval", [str(run), "--episodes", "1", "--seed", "7", "--num-envs", "1", "--video", str(out)]) == 0
    capsys.readouterr()
    (entry,) = json.load(open(out / "videos.json"))["videos"]
    video = frames(out / entry["file"])
    shots, ret = replay(load_checkpoint(str(run)), seed=7)
    assert ret == entry["return"] and len(video) == len(shots) == entry["length"] + 1
    assert video[0].shape == shots[0].shape == (400, 600, 3)
    # each frame is its own step's render (lossy codec: close), and not another step's
    # (here: codec noise about 0.08 of 255 per pixel on average, one step apart about 0.18, up to 0.9)
    near = [diff(v, s) for v, s in zip(video, shots, strict=True)]
    shifted = [diff(v, s) for v, s in zip(video[1:], shots[:-1], strict=True)]  # one step off
    assert max(near) < 0.3, max(near)
    assert np.mean(shifted) > 2 * np.mean(near), (np.mean(shifted), np.mean(near))
    assert diff(video[0], shots[-1]) > 10 * near[0] and diff(video[-1], shots[0]) > 10 * near[-1]


def test_video_every_films_at_the_safe_points(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    d = tmp_path / "run"
    assert (
        cli_main("train", ["CartPole-v1", "--total-steps", "4096", "--video-every", "1000", "--logdir", str(d), *SMALL])
        == 0
    )
    # rollouts of 8 x 64 = 512 steps: safe points at 0, 512, ..., 3584; the first at or
    # after 1000, 2000 and 3000 film; 4000 has none before the run ends at 4096
    index = json.load(open(d / "videos" / "videos.json"))["videos"]
    assert [e["env_steps"] for e in index] == [1024, 2048, 3072]
    assert sorted(os.listdir(d / "videos")) == sorted([e["file"] for e in index] + ["videos.json"])
    for e in index:
        m = NAME.match(e["file"])
        assert m and m.group(1) == f"step-{e['env_steps']:09d}"
        # (--video-every films an episode's first 10 s: 500 frames at CartPole's 50 fps)
        assert len(frames(d / "videos" / e["file"])) == e["frames"] == min(e["length"] + 1, 500)
        assert e["return"] == e["length"]  # (CartPole: +1 a step)
    acc = EventAccumulator(str(d)).Reload()
    logged = [(s.step, s.value) for s in acc.Scalars("videos/return")]
    assert logged == [(e["env_steps"], e["return"]) for e in index]


def test_an_error_mid_run_ends_the_recorder(tmp_path):
    calls = {"n": 0}

    def stop():  # asked at every safe point: videos are due at the 2nd and 3rd, then it fails
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("boom")
        return False

    cfg = PPOConfig(num_envs=8, n_steps=64, total_steps=8192, video_every=512, num_workers=1, device="cpu")
    with pytest.raises(RuntimeError, match="boom"):
        run_training("CartPole-v1", cfg, run_dir=str(tmp_path / "run"), progress=False, tensorboard=False, stop=stop)
    left = [
        p for p in psutil.Process().children(recursive=True) if "fastvec.train.commands.videos" in " ".join(p.cmdline())
    ]
    assert left == []
    assert [f for f in os.listdir(tmp_path / "run" / "videos") if f.startswith(".")] == []


NO_RENDER = """
import gymnasium as gym
import numpy as np


class Plain(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, True, {}


def make_plain():
    return Plain()
"""


def test_bad_input_one_line(tmp_path, capsys, monkeypatch, run):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    one_line_error(capsys, cli_main("eval", [str(run), "--video", str(blocker / "videos")]), "cannot write videos into")
    for bad in ("0", "-5", "0.5"):
        one_line_error(
            capsys, cli_main("train", ["CartPole-v1", "--video-every", bad]), "--video-every must be a positive integer"
        )
    (tmp_path / "fvnorender.py").write_text(textwrap.dedent(NO_RENDER))
    monkeypatch.syspath_prepend(str(tmp_path))
    d = tmp_path / "plain"
    code = cli_main("train", ["fvnorender:make_plain", "--video-every", "100", "--logdir", str(d), "--no-progress"])
    one_line_error(capsys, code, "fvnorender:make_plain has no rgb_array rendering to film (its render_modes: none)")
    assert not d.exists()  # refused before the run directory, the monitor or any worker
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # (import fails)
    one_line_error(capsys, cli_main("eval", [str(run), "--video", str(tmp_path / "v")]), 'pip install "fastvec[envs]"')
    with pytest.raises(ConfigError, match="imageio-ffmpeg"):
        run_training("CartPole-v1", PPOConfig(video_every=100), run_dir=str(tmp_path / "r2"), progress=False)
    monkeypatch.delitem(sys.modules, "imageio_ffmpeg")
    with pytest.raises(ConfigError, match="run directory"):
        run_training("CartPole-v1", PPOConfig(video_every=100), run_dir=None, progress=False)
    with pytest.raises(ConfigError, match="video_every must be a non-negative integer"):
        PPOConfig(video_every=-1).validate()


def test_old_configs_load_without_the_key():
    old = PPOConfig().to_dict()
    del old["video_every"]  # a checkpoint written before the key
    assert PPOConfig.from_dict(old).video_every == 0


MASKED = "envs:MaskedChoiceEnv"  # (tests/envs.py: an invalid action ends the episode at once, with -1)


def test_a_masked_run_is_filmed_acting_among_the_valid_actions(tmp_path, capsys):
    """Eval's videos, and the recorder's during training, play the masked policy: an
    untrained policy without its masks picks an invalid action within a few steps, ending
    the episode early; with them every episode runs its 10 steps. The first frame is the
    mask of the env reset with the episode's seed."""
    import envs

    d = tmp_path / "run"
    args = [MASKED, "--action-mask", "info", "--total-steps", "2048", "--video-every", "1000", "--logdir", str(d)]
    assert cli_main("train", [*args, *SMALL]) == 0
    capsys.readouterr()
    during = json.load(open(d / "videos" / "videos.json"))["videos"]
    assert [e["env_steps"] for e in during] == [1024] and during[0]["length"] == 10
    out = tmp_path / "eval"
    assert cli_main("eval", [str(d), "--episodes", "6", "--seed", "4", "--num-envs", "1", "--video", str(out)]) == 0
    filmed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cli_main("eval", [str(d), "--episodes", "6", "--seed", "4", "--num-envs", "1"]) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    index = json.load(open(out / "videos.json"))["videos"]
    assert [e["length"] for e in index] == [10] * 6 and filmed["mean_return"] == plain["mean_return"]
    assert all(e["return"] > 0 for e in index)  # (an invalid action would have cost -1)
    first = frames(out / index[0]["file"])
    assert len(first) == 11
    env = envs.MaskedChoiceEnv()
    env.reset(seed=4)  # (one env: the first episode is the reset with eval's seed)
    assert (first[0][4, 4::8, :].mean(-1) > 128).tolist() == env.mask.tolist()


def test_tracking_gets_the_runs_videos(tmp_path, monkeypatch):
    """With ``--track wandb`` the tracker logs every video of ``RUN_DIR/videos`` at the
    run's end, after the recorder has finished them (a stand-in ``wandb`` module)."""
    from test_tracking import FakeWandb

    for k in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # (no ~/.netrc: no key)
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake.module)
    d = tmp_path / "run"
    args = ["CartPole-v1", "--total-steps", "4096", "--video-every", "1000", "--logdir", str(d), "--track", "wandb"]
    assert cli_main("train", [*args, *SMALL]) == 0
    index = json.load(open(d / "videos" / "videos.json"))["videos"]
    assert len(index) == 3
    step, media = fake.logs[-1]
    assert step == 4096 and media == {
        f"videos/{e['file'][:-4]}": ("video", str(d / "videos" / e["file"])) for e in index
    }


SIZED = """
import gymnasium as gym
import numpy as np


class Sized(gym.Env):
    \"\"\"A step counter that renders a frame ``width`` wide, its brightness the count.\"\"\"

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None, width=32):
        self.render_mode, self.width, self.t = render_mode, int(width), 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(1, self.t / 10, np.float32), 1.0, False, self.t >= 10, {}

    def render(self):
        return np.full((16, self.width, 3), 20 * self.t, np.uint8)


gym.register("Sized-v0", entry_point=__name__ + ":Sized")
"""


def test_video_settings_reach_the_filmed_env_only(tmp_path, capsys, monkeypatch):
    """``--video-settings width=64``: the videos' frames are 64 wide (the env's default
    32), in ``fastvec eval`` and in ``fastvec train --video-every``; the run's own envs
    never get the setting (its checkpoint's env settings stay empty); a setting the env
    does not take, or bad text, is one line before anything is filmed."""
    (tmp_path / "fvsized.py").write_text(textwrap.dedent(SIZED))
    monkeypatch.syspath_prepend(str(tmp_path))
    d = tmp_path / "run"
    args = ["fvsized:Sized-v0", "--total-steps", "256", "--logdir", str(d), *SMALL]
    args += ["--video-every", "128", "--video-settings", "width=64", "--set", "n_steps=16", "--num-envs", "4"]
    assert cli_main("train", args) == 0
    capsys.readouterr()
    index = json.loads((d / "videos" / "videos.json").read_text())["videos"]
    assert index and all(frames(d / "videos" / e["file"])[0].shape == (16, 64, 3) for e in index)
    ckpt = load_checkpoint(str(d))
    assert not ckpt.get("env_kwargs") and ckpt["config"]["video_settings"] == "width=64"
    out = tmp_path / "eval"
    assert cli_main("eval", [str(d), "--episodes", "2", "--video", str(out), "--video-settings", "width=48"]) == 0
    capsys.readouterr()
    shots = frames(next(out.glob("*.mp4")))
    assert len(shots) == 11 and shots[0].shape == (16, 48, 3)
    one_line_error(
        capsys,
        cli_main("eval", [str(d), "--video", str(out), "--video-settings", "zoom=2"]),
        "does not film with the video settings {'zoom': 2}",
    )
    one_line_error(
        capsys, cli_main("eval", [str(d), "--video", str(out), "--video-settings", "zoom"]), "--video-settings:"
    )
    one_line_error(capsys, cli_main("eval", [str(d), "--video-settings", "width=48"]), "give video_dir too")
    bad = ["fvsized:Sized-v0", "--video-every", "100", "--video-settings", "zoom=2", "--logdir", str(tmp_path / "b")]
    one_line_error(capsys, cli_main("train", [*bad, "--no-progress"]), "does not film with the video settings")
    assert not (tmp_path / "b").exists()


def test_seconds_keep_an_episodes_first_frames(run, tmp_path, capsys):
    """``seconds=0.1`` at CartPole's 50 fps: each file holds the episode's first 5
    frames, those of the whole episode's film; the episodes still play to their end
    (returns and lengths as without filming)."""
    whole, short = tmp_path / "whole", tmp_path / "short"
    for out, extra in ((whole, []), (short, ["--video-settings", "seconds=0.1"])):
        assert cli_main("eval", [str(run), "--episodes", "3", "--seed", "2", "--video", str(out), *extra]) == 0
    capsys.readouterr()
    assert cli_main("eval", [str(run), "--episodes", "3", "--seed", "2"]) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    a, b = (json.load(open(d / "videos.json"))["videos"] for d in (whole, short))
    assert [e["return"] for e in b] == [e["return"] for e in a] and [e["length"] for e in b] == [e["length"] for e in a]
    assert float(np.mean([e["return"] for e in b])) == plain["mean_return"]
    for x, y in zip(a, b, strict=True):
        assert x["length"] > 5 and x["frames"] == x["length"] + 1 and y["frames"] == 5
        full, clip = frames(whole / x["file"]), frames(short / y["file"])
        assert len(clip) == 5 and max(diff(c, f) for c, f in zip(clip, full[:5], strict=True)) < 0.3


def _render_or_skip(env) -> None:
    try:
        env.reset(seed=0)
        env.render()
    except Exception as exc:  # (no OpenGL here: EGL or OSMesa)
        env.close()
        pytest.skip(f"MuJoCo cannot render here: {type(exc).__name__}: {exc}")


def test_draft_look_is_mujoco_without_shadows_reflections_antialiasing(tmp_path):
    """A ``look=draft`` film's frames are those rendered by hand with MuJoCo's
    shadows, reflections and anti-aliasing off (within codec noise), not the full look's."""
    mujoco = pytest.importorskip("mujoco")
    from fastvec.train.commands.filming import filmed_factory, headless_gl

    headless_gl()
    kwargs = {"width": 160, "height": 128, "camera_name": "track"}
    probe = env_factory("HalfCheetah-v5", {**kwargs, "render_mode": "rgb_array"})()
    _render_or_skip(probe)
    probe.close()
    actions = np.random.default_rng(0).uniform(-1, 1, (20, 6)).astype(np.float32)

    def by_hand(draft: bool) -> list[np.ndarray]:
        env = env_factory("HalfCheetah-v5", {**kwargs, "render_mode": "rgb_array"})()
        if draft:
            env.unwrapped.model.vis.quality.offsamples = 0
        env.reset(seed=3)
        shots = [env.render()]
        if draft:
            viewer = env.unwrapped.mujoco_renderer.viewer
            viewer.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            viewer.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
            shots = [env.render()]
        for a in actions:
            env.step(a)
            shots.append(env.render())
        env.close()
        return shots

    def filmed(look: str) -> list[np.ndarray]:
        folder = tmp_path / look
        folder.mkdir()
        env = filmed_factory("HalfCheetah-v5", None, str(folder), {**kwargs, "look": look})()
        env.reset(seed=3)
        for a in actions:
            env.step(a)
        env.writer.close()  # (the episode goes on: its film so far)
        shots = frames(env.path)
        env.writer = None
        env.close()
        return shots

    draft, full = by_hand(True), by_hand(False)

    def blur(x):  # 8x8 blocks' means: the looks' broad differences, not the codec's edges
        return x.reshape(16, 8, 20, 8, 3).mean(axis=(1, 3))

    def gap(xs, ys) -> float:
        return float(np.mean([np.abs(blur(x) - blur(y)).mean() for x, y in zip(xs, ys, strict=True)]))

    assert gap(draft, full) > 1.0  # (the looks differ: here some 1.4 of 255 a pixel)
    for look, ref, other in (("draft", draft, full), ("full", full, draft)):
        video = filmed(look)
        assert len(video) == len(ref) == 21
        near, far = gap(video, ref), gap(video, other)
        assert near < 0.7 * far, (look, near, far)  # (here some 1.1 against 2.2: the codec's colours)


def test_bad_film_settings_one_line(run, tmp_path, capsys):
    out = str(tmp_path / "v")
    for text, expect in (
        ("seconds=-1", "seconds must be a number >= 0"),
        ("seconds=soon", "seconds must be a number >= 0"),
        ("seconds=true", "seconds must be a number >= 0"),
        ("look=pretty", "look must be one of full, draft"),
    ):
        one_line_error(capsys, cli_main("eval", [str(run), "--video", out, "--video-settings", text]), expect)
        d = tmp_path / "never"
        bad = ["CartPole-v1", "--video-every", "100", "--video-settings", text, "--logdir", str(d), "--no-progress"]
        one_line_error(capsys, cli_main("train", bad), expect)
        assert not d.exists()


STAMPED = """
import os
import time

import gymnasium as gym
import numpy as np


class Stamped(gym.Env):
    \"\"\"60 steps of +1, each 0.5 ms. Filmed (rgb_array), each step appends its start
    time (CLOCK_MONOTONIC, the same in every process) to $FV_STAMPS and takes 3 ms.\"\"\"

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}
    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode, self.t = render_mode, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        if self.render_mode == "rgb_array":
            with open(os.environ["FV_STAMPS"], "a") as f:
                f.write(f"{time.monotonic()}\\n")
            time.sleep(0.003)
        else:
            time.sleep(0.0005)  # (the envs' step loop long enough to hold the recorder a while)
        self.t += 1
        return np.full(1, self.t / 60, np.float32), 1.0, False, self.t >= 60, {}

    def render(self):
        return np.full((8, 8, 3), self.t, np.uint8)


gym.register("Stamped-v0", entry_point=__name__ + ":Stamped")
"""


def test_the_recorder_films_only_while_the_trainer_learns(tmp_path, capsys, monkeypatch):
    """The filmed env's steps (stamped in the recorder's process) all start while the
    trainer is learning (between a rollout's end and the next safe point, stamped here),
    or after the run's end; never while the envs step."""
    from fastvec.train.commands.videos import VideoRecorder

    (tmp_path / "fvstamped.py").write_text(textwrap.dedent(STAMPED))
    monkeypatch.syspath_prepend(str(tmp_path))
    stamps = tmp_path / "stamps.txt"
    monkeypatch.setenv("FV_STAMPS", str(stamps))
    marks: list[tuple[float, str]] = []  # (time, "hold" | "go")
    at, learning, finish = VideoRecorder.at, VideoRecorder.learning, VideoRecorder.finish

    def spy(fn, word):
        def wrapped(self, *args):
            out = fn(self, *args)  # (hold: stamped once the recorder is told; go: before)
            marks.append((time.monotonic(), word))
            return out

        def go_first(self, *args):
            marks.append((time.monotonic(), word))
            return fn(self, *args)

        return wrapped if word == "hold" else go_first

    monkeypatch.setattr(VideoRecorder, "at", spy(at, "hold"))
    monkeypatch.setattr(VideoRecorder, "learning", spy(learning, "go"))
    monkeypatch.setattr(VideoRecorder, "finish", spy(finish, "go"))
    d = tmp_path / "run"
    args = ["fvstamped:Stamped-v0", "--total-steps", "12000", "--video-every", "1500", "--logdir", str(d), *SMALL]
    assert cli_main("train", [*args, "--set", "n_epochs=8"]) == 0
    capsys.readouterr()
    index = json.load(open(d / "videos" / "videos.json"))["videos"]
    steps = [float(x) for x in stamps.read_text().split()]
    assert len(index) >= 5 and len(steps) == 60 * len(index)
    end = marks[-1][0]  # (finish: go for good)
    held = [(t, marks[k + 1][0]) for k, (t, w) in enumerate(marks[:-1]) if w == "hold" and marks[k + 1][1] == "go"]
    assert held, marks
    slack = 0.002  # (a step whose gate said go just before the hold)
    inside = [s for s in steps if any(a + slack < s < b for a, b in held)]
    assert inside == [], (len(inside), len(steps))
    assert sum(s < end for s in steps) >= 60  # some filmed while the run went on, not all at its end


def test_a_killed_trainer_leaves_no_recorder(tmp_path):
    """kill -9 of ``fastvec train --video-every`` while its recorder is held: the
    recorder (its gate's pipe and its stdin closed) exits by itself."""
    import signal
    import subprocess
    import time as clock
    from pathlib import Path

    import fastvec

    root = Path(fastvec.__file__).resolve().parent.parent  # (the fastvec under test)
    env = {**os.environ, "PYTHONPATH": str(root)}
    d = tmp_path / "run"
    cmd = [sys.executable, "-m", "fastvec", "train", "CartPole-v1", "--total-steps", "10000000"]
    cmd += ["--video-every", "2048", "--logdir", str(d), "--no-progress", "--no-tensorboard", "--num-workers", "1"]
    trainer = psutil.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, recorder = clock.monotonic() + 120, None
        while recorder is None and clock.monotonic() < deadline:
            kids = [p for p in trainer.children() if "fastvec.train.commands.videos" in " ".join(p.cmdline())]
            recorder = kids[0] if kids else None
            clock.sleep(0.05)
        assert recorder is not None, "no recorder started"
        clock.sleep(1.0)  # (videos under way)
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(30)
    assert recorder.wait(60) is not None or not recorder.is_running()
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if str(d) in " ".join(p.info["cmdline"] or [])]
    assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in leftovers), leftovers
