"""``fastvec train --track wandb`` (``fastvec.train.run.tracking``).

Two references. A recording stand-in for the ``wandb`` module checks that the tracker
gets, step for step and key for key, the scalars TensorBoard's writer gets (recorded
from ``SummaryWriter.add_scalar``) and ``metrics.jsonl`` holds; the run's result; the
videos in ``RUN_DIR/videos``; and on ``--resume`` the same W&B run id. Then the real
W&B, offline, in a fresh interpreter on two ranks: its run file (``run-ID.wandb``, read
here record by record) holds the config, the metrics of ``metrics.jsonl`` and the
result, and only rank 0 made one. Bad input, and no ``wandb`` installed, in one line
before any env starts.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys
import types
import zlib

import pytest
from helpers import one_line_error

from fastvec.train import PPOConfig, run_training
from fastvec.train.commands import cli
from fastvec.train.commands.cli import main as cli_main

ARGS = ["CartPole-v1", "--total-steps", "2048", "--no-progress", "--seed", "3", "--set", "log_every_s=0.01"]


class FakeWandb:
    """A ``wandb`` module that records what a run is given."""

    def __init__(self):
        self.inits: list[dict] = []
        self.logs: list[tuple[int | None, dict]] = []
        self.summary: dict = {}
        self.finished = 0
        self.module = types.ModuleType("wandb")
        self.module.init = self.init  # type: ignore[attr-defined]
        self.module.Settings = dict  # type: ignore[attr-defined]
        self.module.Histogram = lambda values: ("histogram", list(values))  # type: ignore[attr-defined]
        self.module.Video = lambda path: ("video", path)  # type: ignore[attr-defined]

    def init(self, **kw):
        self.inits.append(kw)
        fake = self
        files = os.path.join(kw["dir"], "fake-files")
        os.makedirs(files, exist_ok=True)

        class Run:
            id = kw["id"] or f"run{len(fake.inits)}"
            dir = files
            summary = fake.summary

            def log(self, row, step=None):
                fake.logs.append((step, dict(row)))

            def finish(self):
                fake.finished += 1

        return Run()


@pytest.fixture
def fake_wandb(monkeypatch, tmp_path):
    for k in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no key
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake.module)
    return fake


def _tensorboard_scalars(monkeypatch) -> list:
    from torch.utils.tensorboard import SummaryWriter

    got: list = []
    add = SummaryWriter.add_scalar

    def recording(self, tag, value, step=None, *args, **kwargs):
        got.append((step, tag, value))
        return add(self, tag, value, step, *args, **kwargs)

    monkeypatch.setattr(SummaryWriter, "add_scalar", recording)
    return got


def _by_step(triples) -> list:
    out: list = []
    for step, tag, value in triples:
        if not out or out[-1][0] != step:
            out.append((step, {}))
        out[-1][1][tag] = value
    return out


def test_tracker_gets_what_tensorboard_and_metrics_get(tmp_path, monkeypatch, fake_wandb):
    run = tmp_path / "run"
    (run / "videos").mkdir(parents=True)
    (run / "videos" / "step-1024.mp4").write_bytes(b"not decoded")
    tb = _tensorboard_scalars(monkeypatch)
    code = cli_main("train", [*ARGS, "--logdir", str(run), "--track", "wandb", "--track-option", "tags=a,b"])
    assert code == 0
    (init,) = fake_wandb.inits
    assert init["config"] == {
        "env_id": "CartPole-v1",
        "env_kwargs": None,
        "mix": None,
        "backend": "engine",
        **_checkpoint_config(run),
    }
    assert (init["mode"], init["project"], init["tags"], init["name"]) == ("offline", "fastvec", ["a", "b"], "run")
    assert init["dir"] == str(run) and init["id"] is None

    *points, (video_step, media) = fake_wandb.logs
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert len(rows) >= 3
    expect = [(r.pop("env_steps"), r) for r in rows]
    scalars = [(step, {k: v for k, v in row.items() if not isinstance(v, tuple)}) for step, row in points]
    assert scalars == expect  # the same keys in the same order, the same values, at the same steps
    assert scalars == _by_step(tb)
    # the histograms hold every finished episode once
    returns = [v for _, row in points for k, (_, vs) in _tuples(row) if k == "charts/episode_returns" for v in vs]
    result = json.loads((run / "result.json").read_text())
    assert len(returns) == result["episodes"] > 0
    assert fake_wandb.summary == {"result": result}
    assert json.loads((run / "fake-files" / "result.json").read_text()) == result
    assert video_step == expect[-1][0] and media == {
        "videos/step-1024": ("video", str(run / "videos" / "step-1024.mp4"))
    }
    assert fake_wandb.finished == 1
    assert json.loads((run / "tracking.json").read_text()) == {"wandb": {"tags": "a,b", "id": "run1"}}


def _tuples(row: dict):
    return [(k, v) for k, v in row.items() if isinstance(v, tuple)]


def _checkpoint_config(run) -> dict:
    from fastvec.train import load_checkpoint

    return PPOConfig.from_dict(load_checkpoint(str(run / "checkpoint.pt"))["config"]).to_dict()


def test_resume_continues_the_same_run(tmp_path, fake_wandb):
    run = tmp_path / "run"
    first = [
        *ARGS,
        "--logdir",
        str(run),
        "--track",
        "wandb",
        "--track-option",
        "project=p",
        "--track-option",
        "group=g",
    ]
    assert cli_main("train", first) == 0
    steps = [s for s, _ in fake_wandb.logs]
    assert cli_main("train", ["--resume", str(run), "--total-steps", "4096", "--no-progress", "--track", "wandb"]) == 0
    one, two = fake_wandb.inits
    assert two["id"] == "run1" and two["resume"] == "allow" and one["resume"] is None
    assert (two["project"], two["group"]) == ("p", "g")  # the run's own, kept in tracking.json
    later = [s for s, _ in fake_wandb.logs[len(steps) :]]
    assert later[0] > 2048 and later == sorted(later) and later[-1] == 4096  # the curve goes on past the checkpoint


def test_without_wandb_refused_before_any_env(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb fails

    def no_envs(*args, **kwargs):
        raise AssertionError("envs started")

    monkeypatch.setattr(cli, "run_training", no_envs)
    code = cli_main("train", [*ARGS, "--logdir", str(tmp_path / "r"), "--track", "wandb"])
    one_line_error(
        capsys, code, 'fastvec train: error: --track wandb needs Weights & Biases: pip install "fastvec[track]"'
    )
    assert code == 2 and not (tmp_path / "r").exists()
    from fastvec.train.commands import launch

    monkeypatch.setattr(launch, "build_storage", no_envs)
    with pytest.raises(ValueError, match="needs Weights & Biases"):
        run_training("CartPole-v1", run_dir=str(tmp_path / "r"), track="wandb")


@pytest.mark.parametrize(
    "extra, expect",
    [
        (["--track", "mlflow"], "unknown tracker 'mlflow': choose from wandb"),
        (["--track", "wandb", "--track-option", "colour=red"], "unknown tracking option 'colour' for wandb"),
        (["--track", "wandb", "--track-option", "project"], "--track-option takes KEY=VALUE, got 'project'"),
        (["--track", "wandb", "--track-option", "mode=loud"], "tracking option mode must be one of online"),
        (["--track-option", "project=p"], "tracking options ['project'] need --track"),
    ],
)
def test_bad_tracking_input_is_one_line(capsys, fake_wandb, extra, expect):
    one_line_error(capsys, cli_main("train", [*ARGS, *extra]), expect)


def test_a_key_or_wandb_mode_leaves_the_mode_to_wandb(monkeypatch, tmp_path):
    from fastvec.train.run.tracking import wandb_mode

    for k in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert wandb_mode({}) == "offline"
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password k\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert wandb_mode({}) is None
    (tmp_path / ".netrc").unlink()
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode({}) is None
    assert wandb_mode({"mode": "offline"}) == "offline"


# ---------------------------------------------------------------- the real W&B, offline


def wandb_records(path: str):
    """The records of a W&B run file: a 7-byte header, then 32 KiB blocks of records
    (CRC-32 of type and data, length, type: whole, first, middle, last), each a
    ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7]) if room >= 7 else (0, 0, 0)
        if kind == 0:  # the rest of a block, or of the file, is padding
            pos += room
            continue
        body = data[pos + 7 : pos + 7 + n]
        assert zlib.crc32(bytes([kind]) + body) == crc
        pos, parts = pos + 7 + n, parts + body
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def test_real_wandb_offline_on_two_ranks(tmp_path):
    pytest.importorskip("wandb")
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(HOME=str(tmp_path), PYTHONPATH=os.pathsep.join(sys.path))
    cmd = [sys.executable, "-m", "fastvec", "train", *ARGS, "--logdir", str(run), "--device", "cpu"]
    cmd += ["--nproc", "2", "--no-tensorboard", "--track", "wandb", "--track-option", "group=smoke"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    (run_file,) = glob.glob(str(run / "wandb" / "offline-run-*" / "run-*.wandb"))  # rank 0's only
    history, summary, config = [], {}, {}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config = {u.key: json.loads(u.value_json) for u in record.run.config.update if u.key != "_wandb"}
            assert (
                record.run.run_group == "smoke"
                and record.run.run_id == json.loads((run / "tracking.json").read_text())["wandb"]["id"]
            )
        elif kind == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            history.append((record.history.step.num, items))
        elif kind == "summary":
            summary.update({"/".join(u.nested_key) or u.key: json.loads(u.value_json) for u in record.summary.update})
    assert config == {
        "env_id": "CartPole-v1",
        "env_kwargs": None,
        "mix": None,
        "backend": "engine",
        **_checkpoint_config(run),
    }
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert len(history) == len(rows) >= 3
    for (step, items), row in zip(history, rows, strict=True):
        assert step == row.pop("env_steps")
        assert {k: v for k, v in items.items() if k in row} == row
    assert summary["result"] == result == json.loads((run / "result.json").read_text())
