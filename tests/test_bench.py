"""``fastvec bench``: the thin command a user runs measures both vector envs on their env,
prints one short table, and turns bad input into one line and exit status 2. (The
project's own benchmarks, in ``benchmarks/``, are tested in test_benchmarks.py.)"""

import subprocess
import sys
import types

import pytest

pytest.importorskip("gymnasium")

from fastvec.bench import main, run  # noqa: E402


def test_bench_measures_both_vector_envs(capsys):
    assert (
        main("bench", ["CartPole-v1", "--num-envs", "4", "--steps", "50", "--repeats", "2", "--num-workers", "2"]) == 0
    )
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("CartPole-v1, 4 envs, 50 timed steps x 2 rounds") and "num_workers: 2" in lines[0]
    sync = next(ln for ln in lines if ln.startswith("gymnasium SyncVectorEnv"))
    fast = next(ln for ln in lines if ln.startswith("fastvec.AsyncVectorEnv"))
    assert sync.endswith("1.00x (1.00-1.00)")
    assert fast.rstrip().endswith(")") and "x (" in fast


def test_run_returns_every_round(monkeypatch):
    """Against a clock that only the vector envs' steps move (1 ms a step of
    SyncVectorEnv, 0.25 ms of fastvec's), each round's figure is exactly its timed steps
    x envs over their time, so only the timed steps count (not the reset, nor the
    warm-up), and the ratio is 4 in every round; the rounds alternate which goes first."""
    import gymnasium as gym

    import fastvec
    from fastvec import bench

    clock = {"now": 0.0}
    order = []
    for cls, key, tick in ((gym.vector.SyncVectorEnv, "sync", 1e-3), (fastvec.AsyncVectorEnv, "fastvec", 2.5e-4)):

        def step(self, actions, _step=cls.step, _tick=tick):
            clock["now"] += _tick
            return _step(self, actions)

        def reset(self, *args, _reset=cls.reset, _key=key, **kwargs):
            order.append(_key)  # each measurement resets its fresh vector env once
            return _reset(self, *args, **kwargs)

        monkeypatch.setattr(cls, "step", step)
        monkeypatch.setattr(cls, "reset", reset)
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"]))
    res = run("CartPole-v1", num_envs=3, steps=20, repeats=3)
    assert res["repeats"] == 3 and res["num_envs"] == 3
    assert res["sps"] == {"sync": [pytest.approx(3 / 1e-3)] * 3, "fastvec": [pytest.approx(3 / 2.5e-4)] * 3}
    assert res["ratios"] == [pytest.approx(4.0)] * 3
    assert order == ["sync", "fastvec", "fastvec", "sync", "sync", "fastvec"]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["Nope-v9"], "unknown env id 'Nope-v9'"),
        (["--num-envs", "0"], "--num-envs"),
        (["--repeats", "0"], "--repeats"),
        (["--steps", "abc"], "--steps"),
        (["--num-workers", "-1"], "--num-workers"),
        (["--frobnicate"], "unrecognized arguments"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    assert main("bench", argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("fastvec bench: error:") and needle in err


def test_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main("bench", ["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--num-envs" in out and "CartPole-v1" in out


def test_the_command_line_door_and_no_torch(tmp_path):
    """``fastvec bench`` through the ``fastvec`` entry point; the command does not import torch.
    The children run outside the source tree, so they import the installed package."""
    code = (
        "import sys; from fastvec.cli import main; rc = main(['bench', '--num-envs', '2', '--steps', '10', "
        "'--repeats', '1']); print('torch' in sys.modules); sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "fastvec.AsyncVectorEnv" in proc.stdout and proc.stdout.splitlines()[-1] == "False"
    bad = subprocess.run(
        [sys.executable, "-m", "fastvec", "bench", "--steps", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "fastvec bench: error:" in bad.stderr
