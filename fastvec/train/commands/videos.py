"""``fastvec train --video-every N``: one deterministic evaluation episode filmed every N
env steps, in a process of its own, while the run goes on.

At the first safe point at or after each multiple of N env steps, ``VideoRecorder.at``
writes the acting policy's weights (a CPU copy, the observation normaliser with them: a
weights-only checkpoint, ``.job-*.pt``) into the run directory's ``videos/`` and names
the file on the recorder's stdin. The recorder (``main``, started at the first video, in
a session of its own so Ctrl-C reaches the trainer only) films one episode per job on
one ``evaluate.Evaluation`` (its env and renderer made once; seed: the run's; by default
the episode's first 10 s in MuJoCo's draft look, ``filming.TRAINING_FILM``, which
``video_settings`` overrides), named ``step-000050000-return-212.5-len-500.mp4`` and
listed in ``videos.json``, and answers with one JSON line; the trainer reads the answers
without waiting at its safe points and logs ``videos/return`` and ``videos/length`` at
the video's step to TensorBoard (not the video itself: TensorBoard's ``add_video`` needs
moviepy).

The recorder films only while the trainer learns. On a machine with no spare core the
envs' step loop pays for any busy process, even one in Linux's lowest class
(``SCHED_IDLE``, where the recorder, its render threads and ffmpeg run; elsewhere
``nice 19``): a woken worker waits for the core. So the trainer holds the recorder at
each safe point and lets it go after each rollout, one byte on a pipe of their own
(``_Gate``), read before its imports and before each of the filmed env's steps.

At the run's end the trainer lets it go and waits for the jobs still queued (at most
``VIDEO_WAIT_S``; after the envs are closed and the run's clock stopped, the wait in the
result's ``video_wait_seconds``); on an error or a second Ctrl-C the recorder is ended
at once. Its env is its own, never the engine's.
"""

from __future__ import annotations

import glob
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from ..config.rules import ConfigError
from .filming import TMP_PREFIX, TRAINING_FILM, check_video

__all__ = ["VIDEO_WAIT_S", "VideoRecorder", "video_folder", "main"]

VIDEO_WAIT_S = 120.0  # the most a run's end waits for its queued videos
_JOB_PREFIX = ".job-"
# The recorder's first lines: held until the trainer first learns, even its imports (a
# core-second and more of torch's and the env's), then ``main``; argv: folder, gate fd.
_BOOT = (
    "import os, sys\n"
    "while os.read(int(sys.argv[2]), 1) not in (b'g', b''): pass\n"
    "from fastvec.train.commands.videos import main\n"
    "sys.exit(main(sys.argv[1:], go=True))\n"
)


def video_folder(cfg, env_id: str | None, env_kwargs: dict | None, run_dir: str | None, *, venv=None, mix=None):
    """Where ``cfg.video_every`` films the run (``RUN_DIR/videos``; None: no videos);
    ConfigError, one line, before any worker starts, where it cannot."""
    if not cfg.video_every:
        return None
    if venv is not None or env_id is None:
        raise ConfigError("video_every films an env given by its id, not a vector env of your own")
    if run_dir is None:
        raise ConfigError("video_every writes into the run directory: give one")
    return check_video(env_id, env_kwargs, os.path.join(run_dir, "videos"), mix=mix, settings=_film_settings(cfg))


def _film_settings(cfg) -> dict:
    """The filmed env's settings (a frame's size, a camera) and the film's: the
    user's ``video_settings`` over ``TRAINING_FILM``."""
    from ..config.rules import video_settings

    return {**TRAINING_FILM, **video_settings(cfg)}


class VideoRecorder:
    """The trainer's side of ``--video-every``: jobs handed to the recorder process at
    safe points (``at``), its answers logged to ``monitor`` (``Monitor.video``), the queue
    waited for at the end (``finish``), the process ended (``close``)."""

    def __init__(self, folder: str, cfg, monitor, *, env_id: str | None, env_kwargs: dict | None):
        self.folder, self.every, self.monitor = folder, int(cfg.video_every), monitor
        self.env_id, self.env_kwargs, self.seed = env_id, env_kwargs, cfg.seed
        self.settings = _film_settings(cfg)
        self.proc: subprocess.Popen | None = None
        self.gate: int | None = None  # the pipe that holds the recorder (b"p") and lets it go (b"g")
        self.said = b""  # what it said last
        self.next: int | None = None  # the env step the next video is due at
        self.pending = 0  # jobs handed over, not answered
        self.failed = False
        self._buf = b""

    def at(self, ppo) -> None:
        """A safe point (the envs step next): the answers so far logged, a job handed
        over where one is due, the recorder held."""
        self.poll()
        steps = int(ppo.env_steps)
        if self.next is None:
            self.next = (steps // self.every + 1) * self.every
        if steps >= self.next and not self.failed:
            self.next = (steps // self.every + 1) * self.every
            self._hand_over(ppo)
        self._say(b"p")

    def learning(self) -> None:
        """The envs are done stepping until the next safe point: the recorder may film."""
        self._say(b"g")

    def _say(self, byte: bytes) -> None:
        if self.gate is None or self.said == byte:
            return
        try:
            os.write(self.gate, byte)
            self.said = byte
        except OSError:  # (a full pipe: a recorder that reads nothing; it is ended at finish)
            pass

    def _hand_over(self, ppo) -> None:
        from ..algo.checkpoints import save_checkpoint

        if self.proc is None:
            self.proc, self.gate = _start_recorder(self.folder)
        fd, job = tempfile.mkstemp(prefix=_JOB_PREFIX, suffix=".pt", dir=self.folder)
        os.close(fd)
        extra = {"video_seed": self.seed, "video_settings": self.settings}
        save_checkpoint(job, ppo, self.env_id, self.env_kwargs, extra=extra)
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(job.encode() + b"\n")
            self.proc.stdin.flush()
            self.pending += 1
        except OSError:  # (the recorder died: said once, the run goes on without videos)
            os.unlink(job)
            self._fail(f"the video recorder exited (code {self.proc.poll()})")

    def poll(self) -> None:
        """Log the recorder's answers so far, without waiting."""
        if self.proc is None or self.proc.stdout is None:
            return
        fd = self.proc.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            self._answer(json.loads(line))

    def _answer(self, row: dict) -> None:
        self.pending -= 1
        if "error" in row:
            self._fail(f"the video at step {row.get('env_steps')} failed: {row['error']}")
        else:
            self.monitor.video(row["env_steps"], os.path.join(self.folder, row["file"]), row["return"], row["length"])

    def _fail(self, msg: str) -> None:
        if not self.failed:
            print(f"fastvec train: note: {msg}; no more videos this run", file=sys.stderr, flush=True)
        self.failed = True

    def finish(self) -> float:
        """The run's end: wait for the queued videos (at most ``VIDEO_WAIT_S``), then end
        the recorder; the seconds waited."""
        if self.proc is None:
            return 0.0
        t0 = time.monotonic()
        self._say(b"g")
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()  # the recorder exits once its queue is done
            except OSError:
                pass
        deadline = time.monotonic() + VIDEO_WAIT_S
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            self.poll()
        self.poll()
        if self.pending > 0:
            print(
                f"fastvec train: note: {self.pending} video(s) not finished within {VIDEO_WAIT_S:.0f} s: left out",
                file=sys.stderr,
                flush=True,
            )
        self.close()
        return time.monotonic() - t0

    def close(self) -> None:
        """End the recorder now (an error, a second Ctrl-C, or after ``finish``) and remove
        its unfinished files."""
        proc, self.proc = self.proc, None
        if self.gate is not None:
            os.close(self.gate)
            self.gate = None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        for path in glob.glob(os.path.join(self.folder, _JOB_PREFIX + "*")) + glob.glob(
            os.path.join(self.folder, TMP_PREFIX + "*")
        ):
            try:
                os.unlink(path)
            except OSError:
                pass


def _start_recorder(folder: str) -> tuple[subprocess.Popen, int]:
    """The recorder process, importing the fastvec (and the env modules) this process
    imports, at the lowest priority, held; and the gate's end that lets it go."""
    import fastvec

    root = os.path.dirname(os.path.dirname(os.path.abspath(fastvec.__file__)))
    env = dict(os.environ)
    path = dict.fromkeys([root, *(p for p in sys.path if p)])  # (the modules this process finds, envs of one's own)
    env["PYTHONPATH"] = os.pathsep.join(path)
    if not env.get("DISPLAY") and not env.get("MUJOCO_GL"):
        env["MUJOCO_GL"] = "egl"
    env.setdefault("LP_NUM_THREADS", "1")  # (Mesa's software renderer on one core: the one the learner leaves)
    folder = os.path.abspath(folder)
    hold, gate = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, folder, str(hold)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=folder,  # (not this process's cwd: `-c` puts it first, and a fastvec source tree there would shadow)
            start_new_session=True,
            pass_fds=(hold,),
        )
    except BaseException:
        os.close(gate)
        raise
    finally:
        os.close(hold)
    _idle_priority(proc.pid)  # (from its start on: its imports too)
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    os.set_blocking(gate, False)  # (the trainer never waits on it)
    return proc, gate


class _Filming:
    """The recorder's jobs, each one deterministic episode filmed, on one ``Evaluation``
    made at the first job (the run's env and settings: a renderer made once)."""

    def __init__(self, folder: str):
        self.folder = folder
        self.run: Any = None  # the Evaluation

    def film(self, job: str) -> dict:
        """One job: the episode filmed, its ``videos.json`` entry (the error where it failed)."""
        from ..algo.checkpoints import load_checkpoint
        from .evaluate import Evaluation

        steps = None
        try:
            ckpt = load_checkpoint(job)
            steps = int(ckpt["env_steps"])
            extra = ckpt.get("extra") or {}
            seed, settings = int(extra.get("video_seed", 0)), extra.get("video_settings") or None
            if self.run is None:
                self.run = Evaluation(ckpt, 1, num_envs=1, video_dir=self.folder, video_settings=settings)
            res = self.run.play(ckpt, seed, video_prefix=f"step-{steps:09d}")
            entry = dict(res["videos"][0])
            entry["file"] = os.path.basename(entry["file"])
            return entry
        except Exception as exc:
            text = str(exc).strip().splitlines()
            return {"env_steps": steps, "error": f"{type(exc).__name__}: {text[0] if text else ''}"}
        finally:
            if os.path.exists(job):
                os.unlink(job)

    def close(self) -> None:
        if self.run is not None:
            self.run.close()


def _idle_priority(pid: int = 0) -> None:
    """Process ``pid`` (0: this one) and the threads and processes it starts (the
    renderer's, ffmpeg) at the lowest priority: ``SCHED_IDLE``, else nice 19."""
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # (not Linux)
        if pid == 0:
            os.nice(19)


class _Gate:
    """The recorder's side of the gate: ``wait`` returns at once while the trainer's
    last word is go (b"g") and blocks while it is hold (b"p"); the pipe's end (the
    trainer gone or done) is go for good."""

    def __init__(self, fd: int, go: bool = False):
        self.fd: int | None = fd
        self.go = go
        os.set_blocking(fd, False)

    def wait(self) -> None:
        while (fd := self.fd) is not None:
            try:
                words = os.read(fd, 4096)
            except BlockingIOError:
                words = None
            if words == b"":
                os.close(fd)
                self.fd, self.go = None, True
            elif words:
                self.go = words[-1:] == b"g"
            if self.go:
                return
            if words is None:
                select.select([fd], [], [])


def main(argv: list[str] | None = None, go: bool = False) -> int:
    """The recorder: one job per line of stdin (a weights-only checkpoint's path), one
    JSON line per job on stdout, filming only while the gate (the fd after the folder;
    ``go``: its last word so far) says go; it exits when stdin closes."""
    from .filming import pace_with

    folder, *gate = argv if argv is not None else sys.argv[1:]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer decides when it ends
    _idle_priority()
    if gate:
        pace_with(_Gate(int(gate[0]), go).wait)
    filming = _Filming(folder)
    try:
        for line in sys.stdin:
            job = line.strip()
            if job:
                print(json.dumps(filming.film(job)), flush=True)
    finally:
        filming.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
