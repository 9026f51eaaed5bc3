"""``fastvec report`` on run directories: fake ones written with the trainer's own
writers (its ``Monitor`` for ``metrics.jsonl``, ``result.json``'s keys), two real tiny
CartPole runs, and every kind of bad input (one line each, exit status 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fastvec import run_stats
from fastvec.cli import main as cli
from fastvec.train.run.monitor import Monitor


def write_run(path, curve, final=None, wall=None, result=True):
    """A run directory as the trainer leaves it: ``curve`` ``[(env steps, mean return)]``
    logged through its Monitor (wall time 1 s per 1000 steps, the last row, as the
    trainer's final one, without), and ``result.json`` with ``final_mean_return`` (by
    default the curve's last value)."""
    monitor = Monitor(str(path), tensorboard=False)
    for k, (step, ret) in enumerate(curve):
        scalars = {"charts/mean_return": ret, "charts/episodes": 10 * (k + 1)}
        if k < len(curve) - 1:
            scalars["time/wall_s"] = step / 1000
        monitor.log(step, scalars)
    monitor.close()
    if result:
        steps = curve[-1][0] if curve else 0
        out = {
            "env_id": "CartPole-v1",
            "env_steps": steps,
            "wall_seconds": steps / 1000 if wall is None else wall,
            "final_mean_return": curve[-1][1] if final is None and curve else final,
            "seed": 0,
        }
        with open(os.path.join(path, "result.json"), "w") as f:
            json.dump(out, f)
    return str(path)


def fake_groups(tmp_path):
    """Group a: 4 runs ending at 100..130, group b: 3 runs ending at 50..90."""
    for k, end in enumerate((100.0, 110.0, 130.0, 120.0)):
        write_run(tmp_path / f"a-{k}", [(1000, 10.0), (2000, 10.0 + end / 2), (3000, end)])
    for k, end in enumerate((50.0, 90.0, 70.0)):
        write_run(tmp_path / f"b-{k}", [(1000, 10.0), (2000, 20.0), (3000, end)])
    return {"a": [100.0, 110.0, 130.0, 120.0], "b": [50.0, 90.0, 70.0]}


def report(argv, capsys):
    try:
        rc = cli(["report", *argv])
    except SystemExit as e:  # argparse's errors
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_report_of_fake_runs(tmp_path, capsys):
    scores = fake_groups(tmp_path)
    out_dir = tmp_path / "out"
    rc, out, err = report([f"{tmp_path}/a-*", f"bee={tmp_path}/b-*", "--out", str(out_dir), "--seed", "3"], capsys)
    assert rc == 0, err
    got = json.loads((out_dir / "report.json").read_text())
    assert list(got["groups"]) == ["a-*", "bee"]
    a, b = got["groups"]["a-*"], got["groups"]["bee"]
    assert sorted(a["scores"]) == sorted(scores["a"]) and sorted(b["scores"]) == sorted(scores["b"])
    assert a["n"] == 4 and b["n"] == 3
    want = run_stats.aggregate(a["scores"], seed=3)
    assert a["iqm"] == pytest.approx(list(want["iqm"])) and a["mean"] == pytest.approx(list(want["mean"]))
    assert a["iqm"][0] == pytest.approx(115.0)  # 110 and 120, the middle two of four
    assert b["median"][0] == pytest.approx(70.0)
    # every run of a beats every run of b
    assert got["improvement"]["a-*"]["bee"] == [1.0, 1.0, 1.0]
    assert got["improvement"]["bee"]["a-*"] == [0.0, 0.0, 0.0]
    # the curves: group a's, at each grid point, the IQM of the runs' interpolated returns
    steps = a["curves"]["env_steps"]
    assert steps["x"][0] == 1000 and steps["x"][-1] == 3000 and len(steps["x"]) == 100
    for x, value in zip(steps["x"], steps["iqm"]):
        runs = [np.interp(x, [1000, 2000, 3000], [10, 10 + e / 2, e]) for e in scores["a"]]
        assert value == pytest.approx(run_stats.iqm(runs))
    wall = a["curves"]["wall_seconds"]
    assert wall["x"][0] == 1.0 and wall["x"][-1] == 3.0  # the last row's wall time from result.json
    md = (out_dir / "report.md").read_text()
    assert "| bee | 3 |" in md and "## P(row beats column)" in md and "1.00 [1.00, 1.00]" in md
    assert (out_dir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "P(a-* > bee) = 1.00 [1.00, 1.00]" in out and "bee" in out


def test_report_at_steps(tmp_path, capsys):
    fake_groups(tmp_path)
    out_dir = tmp_path / "out"
    rc, _out, err = report([f"{tmp_path}/a-*", f"{tmp_path}/b-*", "--at-steps", "2500", "--out", str(out_dir)], capsys)
    assert rc == 0, err
    got = json.loads((out_dir / "report.json").read_text())
    # halfway between 10 + end / 2 (2000 steps) and end (3000 steps)
    assert sorted(got["groups"]["a-*"]["scores"]) == pytest.approx(sorted(0.75 * e + 5 for e in (100, 110, 130, 120)))
    assert sorted(got["groups"]["b-*"]["scores"]) == pytest.approx([35.0, 45.0, 55.0])
    assert got["score"] == "mean return at 2500 env steps"


def test_a_name_with_an_equals_sign_that_matches_is_a_pattern(tmp_path, capsys, monkeypatch):
    for k in range(2):
        write_run(tmp_path / f"lr=1e-3-{k}", [(1000, 10.0 + k), (2000, 20.0 + k)])
    monkeypatch.chdir(tmp_path)
    rc, out, err = report(["lr=1e-3-*", "x=lr=1e-3-*"], capsys)
    assert rc == 0, err
    assert "lr=1e-3-*" in out and "P(x > lr=1e-3-*) = 0.50" in out


# ------------------------------------------------------------------ bad input
def _bad(tmp_path):
    fake_groups(tmp_path)
    (tmp_path / "empty").mkdir()
    write_run(tmp_path / "noscore-0", [(1000, 5.0)], final=None)
    write_run(tmp_path / "noscore-1", [], result=True)  # no episode finished: final_mean_return null
    write_run(tmp_path / "unfinished-0", [(1000, 5.0), (2000, 6.0)], result=False)
    write_run(tmp_path / "unfinished-1", [(1000, 5.0), (2000, 7.0)], result=False)
    (tmp_path / "file.txt").write_text("x")


@pytest.mark.parametrize(
    "args, lines",
    [
        (["{d}/empty", "{d}/a-*"], ["{d}/empty is not a run directory (no result.json or metrics.jsonl)"]),
        (["{d}/file.txt", "{d}/a-*"], ["{d}/file.txt is not a run directory"]),
        (["{d}/nothing-*", "{d}/a-*"], ["'{d}/nothing-*' matches nothing"]),
        (["{d}/a-*", "{d}/a-*"], ["two groups are named 'a-*': name them, NAME=PATTERN"]),
        (
            ["{d}/a-*", "{d}/b-*", "--at-steps", "3001"],
            ["{d}/a-0: no mean return at 3001 env steps (its curve covers 1000 to 3000)"] + ["3001"] * 6,
        ),
        (["{d}/a-*", "{d}/noscore-*"], ["{d}/noscore-1: result.json has no final_mean_return"]),
        (["{d}/a-*", "{d}/unfinished-*"], ["{d}/unfinished-0 has no result.json", "{d}/unfinished-1 has no"]),
        (["{d}/a-0", "{d}/b-*"], ["group 'a-0' has 1 run ({d}/a-0): its interval is undefined"]),
        (["{d}/nothing", "{d}/empty"], ["'{d}/nothing' matches nothing", "{d}/empty is not a run directory"]),
        (["{d}/a-*", "{d}/b-*", "--at-steps", "ten"], ["fastvec report: error: argument --at-steps"]),
        (["{d}/a-*", "{d}/b-*", "--out", "{d}/file.txt"], ["fastvec report: error: --out {d}/file.txt is a file"]),
    ],
)
def test_bad_input(tmp_path, capsys, args, lines):
    _bad(tmp_path)
    rc, out, err = report([a.format(d=tmp_path) for a in args], capsys)
    assert rc == 2
    got = err.strip().splitlines()
    assert len(got) == len(lines), err
    for line, want in zip(got, lines):
        assert line.startswith("fastvec report: error: ")
        assert want.format(d=tmp_path) in line, (line, want)
    assert out == ""


def test_bad_input_exit_status_from_the_command_line(tmp_path):
    fake_groups(tmp_path)
    p = subprocess.run(
        [sys.executable, "-m", "fastvec", "report", f"{tmp_path}/none-*", f"{tmp_path}/a-*"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        cwd=tmp_path,  # (not the source tree, whose unbuilt fastvec would come first)
    )
    assert p.returncode == 2 and p.stderr.strip() == f"fastvec report: error: '{tmp_path}/none-*' matches nothing"


def test_report_imports_no_torch(tmp_path):
    fake_groups(tmp_path)
    code = (
        "import sys; from fastvec.cli import main; "
        f"rc = main(['report', '{tmp_path}/a-*', '{tmp_path}/b-*', '--out', '{tmp_path}/o', '--resamples', '200']); "
        "assert rc == 0 and 'torch' not in sys.modules, (rc, 'torch imported')"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        cwd=tmp_path,  # (not the source tree, whose unbuilt fastvec would come first)
    )


# ------------------------------------------------------------------ real runs
@pytest.fixture(scope="module")
def cartpole_runs(tmp_path_factory):
    """Two tiny real CartPole runs (4096 env steps, seeds 1 and 2), logging often."""
    root = tmp_path_factory.mktemp("runs")
    for seed in (1, 2):
        cmd = [sys.executable, "-m", "fastvec", "train", "CartPole-v1", "--total-steps", "4096", "--seed", str(seed)]
        cmd += ["--logdir", str(root / f"cp-{seed}"), "--no-progress", "--no-tensorboard", "--set", "log_every_s=0.02"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=120, cwd=root)
    return root


def test_report_of_real_runs(cartpole_runs, tmp_path, capsys):
    out_dir = tmp_path / "out"
    rc, out, err = report([f"{cartpole_runs}/cp-*", f"same={cartpole_runs}/cp-*", "--out", str(out_dir)], capsys)
    assert rc == 0, err
    got = json.loads((out_dir / "report.json").read_text())
    g = got["groups"]["cp-*"]
    finals = [json.loads((cartpole_runs / f"cp-{s}" / "result.json").read_text())["final_mean_return"] for s in (1, 2)]
    assert g["scores"] == finals and g["mean"][0] == pytest.approx(np.mean(finals))
    assert got["improvement"]["cp-*"]["same"][0] == 0.5  # a group against itself
    assert g["curves"]["env_steps"] is not None and g["curves"]["wall_seconds"] is not None
    assert g["curves"]["env_steps"]["x"][-1] == 4096
    assert (out_dir / "report.png").stat().st_size > 10_000


def test_real_runs_at_steps(cartpole_runs, tmp_path, capsys):
    rc, _out, err = report([f"{cartpole_runs}/cp-*", f"same={cartpole_runs}/cp-*", "--at-steps", "3000"], capsys)
    assert rc == 0, err
    for seed in (1, 2):
        rows = [json.loads(line) for line in (cartpole_runs / f"cp-{seed}" / "metrics.jsonl").read_text().splitlines()]
        pts = [(r["env_steps"], r["charts/mean_return"]) for r in rows if "charts/mean_return" in r]
        assert pts[0][0] <= 3000, pts  # the tiny run logged a return before 3000 steps
        want = np.interp(3000, *zip(*pts))
        rc, out, err = report([f"{cartpole_runs}/cp-{seed}", f"{cartpole_runs}/cp-*", "--at-steps", "3000"], capsys)
        assert rc == 2 and "has 1 run" in err  # a run alone is not a group
        from fastvec.report import read_run

        assert read_run(str(cartpole_runs / f"cp-{seed}")).score(3000) == pytest.approx(want)
