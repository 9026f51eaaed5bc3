"""The measuring code of ``benchmarks/`` (not shipped in the package): the vector-env
benchmark writes its files, bad arguments fail cleanly, the baselines SubprocVecEnv peer
is a correct vector env, the real loops run in fresh processes and report, the GAE
benchmark and the ceilings compute what they claim.

Skipped where ``benchmarks/`` is absent: cibuildwheel tests the installed wheel with a
copy of ``tests/`` only."""

import functools
import json
import math
import pathlib
import sys
import time

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
if not (BENCHMARKS / "harness").is_dir():
    pytest.skip("benchmarks/ is not here (cibuildwheel copies only tests/)", allow_module_level=True)
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import bench_vecenv  # noqa: E402
from harness.envs import LargeObsEnv, make_gym  # noqa: E402
from peers.baselines_subproc import SubprocVecEnv as BaselinesSubprocVecEnv  # noqa: E402


def test_quick_bench_writes_results(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = bench_vecenv.main(["--quick", "--out", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr()
    for name in ("results.md", "results.json", "ratios.png", "scaling.png", "latency.png", "worker-output.log"):
        assert (out / name).is_file(), name
    for name in ("ratios.png", "scaling.png", "latency.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    res = json.loads((out / "results.json").read_text())
    assert [w["workload"] for w in res["vecenv"]] == ["cartpole16"]
    rows = {c["candidate"]: c for c in res["vecenv"][0]["candidates"]}
    assert {"sync", "fastvec", "fastvec_sb3", "baselines", "gym_async"} <= rows.keys()
    for key, c in rows.items():
        assert c["errors"] == [], (key, c["errors"])
        assert c["rounds"] == 2 and c["median_sps"] > 0
        assert c["ratio"]["min"] <= c["ratio"]["median"] <= c["ratio"]["max"]
        assert c["latency_ms"]["p50"] <= c["latency_ms"]["p90"] <= c["latency_ms"]["p99"]
    assert rows["sync"]["ratio"]["median"] == pytest.approx(1.0)
    assert res["vecenv"][0]["fastvec_vs_baselines"]["median"] > 0
    # Optional peers are either measured or explained.
    for key, mod in (("sb3", "stable_baselines3"), ("envpool", "envpool")):
        if key not in rows:
            assert any(mod in n for n in res["notes"]), res["notes"]
    sc = res["scaling"]
    assert {(p["candidate"], p["num_envs"], p["num_workers"]) for p in sc["points"]} == {
        ("sync", 4, None),
        ("fastvec", 4, 1),
        ("fastvec", 4, 2),
        ("sync", 16, None),
        ("fastvec", 16, 1),
        ("fastvec", 16, 2),
    }
    assert all(p["median_sps"] > 0 for p in sc["points"])

    md = (out / "results.md").read_text()
    summary = md.split("## Summary", 1)[1].split("##", 1)[0]
    table = [line for line in summary.splitlines() if line.startswith("| CartPole-v1, 16 envs |")]
    assert len(table) == len(rows)
    labels = [line.split("|")[2].strip() for line in table]
    assert "gymnasium SyncVectorEnv" in labels and "fastvec.AsyncVectorEnv" in labels
    assert "baselines SubprocVecEnv (Pipe/env)" in labels
    sync_row = table[labels.index("gymnasium SyncVectorEnv")]
    assert "| 1.00x |" in sync_row
    assert "## Targets" in md and "## Scaling" in md
    assert "CartPole-v1, 16 envs | fastvec.AsyncVectorEnv / SyncVectorEnv | >= 1.2x" in md
    printed = capsys.readouterr().out
    assert "results.md" in printed


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--repeats", "0"], "--repeats"),
        (["--steps", "abc"], "--steps"),
        (["--only", "nope"], "unknown workload 'nope'"),
        (["--no-peers", "torchrl"], "unknown peer 'torchrl'"),
        (["--frobnicate"], "unrecognized arguments"),
    ],
)
def test_bad_arguments(argv, needle, capsys):
    assert bench_vecenv.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("bench_vecenv: error:") and needle in err


def test_out_is_a_file(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert bench_vecenv.main(["--quick", "--out", str(f)]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_help(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_vecenv.main(["--help"])
    assert exc.value.code == 0
    assert "--quick" in capsys.readouterr().out


def test_baselines_subproc_matches_sync():
    """Same seeds and actions: the peer's observations, rewards and flags equal those of
    SyncVectorEnv with SAME_STEP autoreset (the worker resets in the same step)."""
    n = 4
    fns = [functools.partial(make_gym, "CartPole-v1") for _ in range(n)]
    ref = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env = BaselinesSubprocVecEnv(fns)
    try:
        assert env.num_envs == n and env.action_space == ref.single_action_space
        obs, infos = env.reset(seed=123)
        ref_obs, _ = ref.reset(seed=123)
        np.testing.assert_array_equal(obs, ref_obs)
        assert len(infos) == n
        rng = np.random.default_rng(0)
        episodes = 0
        for _ in range(300):
            actions = rng.integers(0, 2, n)
            o, r, term, trunc, infos = env.step(actions)
            ro, rr, rterm, rtrunc, _ = ref.step(actions)
            np.testing.assert_array_equal(o, ro)
            np.testing.assert_array_equal(r, rr)
            np.testing.assert_array_equal(term, rterm)
            np.testing.assert_array_equal(trunc, rtrunc)
            assert o.shape == (n, 4) and len(infos) == n
            episodes += int(np.sum(term | trunc))
        assert episodes > 5  # autoreset was exercised
        # Reseeding restarts the same episodes.
        obs2, _ = env.reset(seed=123)
        np.testing.assert_array_equal(obs2, ref_obs)
    finally:
        env.close()
        ref.close()
    assert env.closed and all(not p.is_alive() for p in env.ps)
    env.close()  # idempotent


def test_large_obs_env():
    env = LargeObsEnv(obs_shape=(3, 210, 160), dtype="uint8", episode_len=3)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 210, 160) and obs.dtype == np.uint8 and env.observation_space.contains(obs)
    flags = [env.step(1)[2] for _ in range(3)]
    assert flags == [False, False, True]
    big = LargeObsEnv()
    o, _ = big.reset()
    assert o.nbytes == 1 << 20 and big.observation_space.contains(o)


# ------------------------------------------------------------------ real loops
def test_loop_ratios_are_per_round_against_the_baseline():
    from harness.loops import render_markdown, summarize

    case = {"case": "toy", "cands": ("sync", "fastvec")}
    waits = [dict(parent_naps=0.0, parent_sleeps=p, worker_naps=0.5, worker_sleeps=0.1) for p in (0.2, 0.4)]
    runs = {
        "sync": [{"sps": 100.0, "steal": 0.0}, {"sps": 200.0, "steal": 0.01}, {"sps": 50.0, "steal": 0.125}],
        "fastvec": [
            {"sps": 150.0, "waits": waits[0], "steal": 0.02},
            {"sps": 200.0, "waits": waits[1]},
            {"error": "exit code 1"},
        ],
    }
    out = summarize("cleanrl", case, runs)
    rows = {r["candidate"]: r for r in out["candidates"]}
    s = rows["fastvec"]["stats"]["sps"]
    assert s["median"] == pytest.approx(175.0) and (s["min"], s["max"]) == (150.0, 200.0)
    assert s["ratio"] == pytest.approx(1.25) and (s["ratio_min"], s["ratio_max"]) == (1.0, 1.5)
    assert rows["fastvec"]["errors"] == ["exit code 1"]
    assert rows["sync"]["stats"]["sps"]["ratio"] == pytest.approx(1.0)
    assert rows["sync"]["waits"] is None
    assert rows["fastvec"]["waits"] == pytest.approx(
        dict(parent_naps=0.0, parent_sleeps=0.3, worker_naps=0.5, worker_sleeps=0.1)
    )
    md = render_markdown([out])
    assert "| fastvec.AsyncVectorEnv | 175 (150-200) | **1.25x** (1.00-1.50) | 0.30; 0.50, 0.10 |" in md
    assert "| gymnasium SyncVectorEnv | 100 (50-200) | **1.00x** (1.00-1.00) |  |" in md
    # the runs that recorded it: median of (0, 1, 12.5, 2)%, and whose run had the most
    assert "median 1.5%, at most 12.5% (gymnasium SyncVectorEnv, round 3)." in md


def test_loops_run_in_fresh_processes_and_report(tmp_path, monkeypatch, capsys):
    import bench_loops
    from harness import loops

    tiny = {
        "gap": [
            dict(
                case="CartPole x4", env="CartPole-v1", num_envs=4, gaps=(0.0, 0.5), steps=30, cands=("sync", "fastvec")
            )
        ],
        "cleanrl": [
            dict(case="CleanRL CartPole x4", env="CartPole-v1", num_envs=4, steps=512, cands=("sync", "fastvec"))
        ],
    }
    monkeypatch.setattr(loops, "CASES", {**loops.CASES, **tiny})
    out = tmp_path / "loops"
    rc = bench_loops.main(["--loops", "gap", "cleanrl", "--repeats", "2", "--out", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr()
    res = json.loads((out / "results.json").read_text())
    assert [c["case"] for c in res["loops"]] == ["CartPole x4", "CleanRL CartPole x4"]
    for case in res["loops"]:
        for row in case["candidates"]:
            assert row["errors"] == [] and len(row["runs"]) == 2, row
            assert all(0.0 <= res["steal"] <= 1.0 for res in row["runs"]), row["runs"]  # Linux's /proc/stat
            for key, s in row["stats"].items():
                assert s["min"] <= s["median"] <= s["max"] and s["ratio"] > 0, key
    gap = {r["candidate"]: r for r in res["loops"][0]["candidates"]}
    assert set(gap["fastvec"]["stats"]) == {"0 ms", "0.5 ms", "0 ms iter", "0.5 ms iter"}
    # fastvec's waits, counted per step (per gap here); none for the serial baseline
    assert gap["sync"]["waits"] is None and set(gap["fastvec"]["waits"]) == {"0", "0.5"}
    cleanrl = {r["candidate"]: r for r in res["loops"][1]["candidates"]}
    assert cleanrl["sync"]["waits"] is None
    for w in [*gap["fastvec"]["waits"].values(), cleanrl["fastvec"]["waits"]]:
        assert set(w) == {"parent_naps", "parent_sleeps", "worker_naps", "worker_sleeps"}
        assert all(0.0 <= v <= 2.0 for v in w.values()), w
    assert (out / "loops.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "results.md").read_text()
    assert "## Real loops" in md and "#### CleanRL CartPole x4 (cleanrl)" in md
    assert "Waits per step of fastvec.AsyncVectorEnv" in md and "worker naps, sleeps |" in md
    assert md.count("CPU steal during the runs") == 2  # under each case


def test_a_loop_past_its_time_says_where_it_was_and_leaves_nothing(capfd):
    """A child run past its timeout: its stacks and its workers' are printed, it is
    killed, its workers exit and its segment is freed."""
    import glob

    import conftest
    from harness.loops import run_child

    shm_before = set(glob.glob("/dev/shm/fastvec_*"))
    before = {p.pid for p in conftest._live_children()}  # e.g. an earlier test's forkserver
    spec = dict(loop="cleanrl", env="CartPole-v1", num_envs=4, steps=10**9, cand="fastvec", round=0)
    res = run_child(spec, timeout=6.0)
    assert res["error"].startswith("timed out after 6 s (Python stacks of processes"), res
    err = capfd.readouterr().err
    assert "in child_cleanrl" in err  # the child's own stack ...
    assert err.count("in worker_main") == 2  # ... and both workers'
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        conftest._new_children(before) or set(glob.glob("/dev/shm/fastvec_*")) - shm_before
    ):
        time.sleep(0.2)
    assert set(glob.glob("/dev/shm/fastvec_*")) - shm_before == set()
    assert conftest._new_children(before) == []


def test_all_loops_stands_for_every_loop(capsys):
    import bench_loops
    from harness.loops import LOOPS

    parser = bench_loops.build_parser()
    assert bench_loops.plan(parser.parse_args(["--loops", "all"])) == list(LOOPS)
    assert bench_loops.plan(parser.parse_args([])) == list(LOOPS)
    assert bench_loops.plan(parser.parse_args(["--loops", "train", "gap", "train"])) == ["train", "gap"]
    for argv, needle in (
        (["--loops", "nope"], "unknown loop 'nope'"),
        (["--cases", "Nothing"], "match no case"),
        (["--repeats", "0"], "--repeats"),
    ):
        assert bench_loops.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("bench_loops: error:") and needle in err, err


def _ceilings_module():
    import importlib.util

    path = BENCHMARKS / "ceilings.py"
    spec = importlib.util.spec_from_file_location("fastvec_ceilings", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ceilings_are_computed_from_the_measurements():
    """benchmarks/ceilings.py: the vector-env ceiling is cores x one env's steps/s over
    SyncVectorEnv's; the trainer's bounds follow its time breakdown."""
    ceil = _ceilings_module()
    loop = {"pong:8": [800.0, 820.0], "halfcheetah:16": [6300.0, 6400.0], "halfcheetah:4": [6000.0, 6600.0]}
    sync = {"pong:8": [760.0, 780.0], "halfcheetah:32": [5800.0, 6000.0], "halfcheetah:8": [5500.0, 6000.0]}
    runs = {f"loop:{k}": [{"sps": v} for v in vs] for k, vs in loop.items()}
    runs |= {f"sync:{k}": [{"sps": v} for v in vs] for k, vs in sync.items()}
    times = {"act": 1.0, "env": 8.0, "prepare": 0.2, "learn": 7.0}
    cpu = {"cpu_s": 20.0, "process_wall_s": 19.0}
    runs["train:sync"] = [{"wall_s": 17.0, "times": times, **cpu}, {"wall_s": 18.0, "times": times, **cpu}]
    # 22 CPU seconds, 2 of them the child's start-up on one core (16 s of process wall, 14 s of run)
    engine_run = {"wall_s": 14.0, "cpu_s": 22.0, "process_wall_s": 16.0, "times": {**times, "act": 1.4}}
    runs["train:engine"] = [{**engine_run, "env_groups": 1}] * 2
    b = ceil.bounds(runs, 2, 102_400)
    pong = b[ceil.VEC_GOALS[0][0]]
    assert pong["goal"] == 2.1 and pong["per_round"] == pytest.approx([2 * 800 / 760, 2 * 820 / 780])
    assert b[ceil.VEC_GOALS[2][0]]["per_round"] == pytest.approx([2 * 6300 / 5800, 2 * 6400 / 6000])
    hc8 = [2 * 6000 / 5500, 2 * 6600 / 6000]  # 4 envs a core in a plain loop
    assert b[ceil.VEC_GOALS[3][0]]["per_round"] == pytest.approx(hc8)
    engine = b["fastvec train HalfCheetah-v5 (102.4k steps), engine over its Sync backend"]
    assert engine["goal"] == 1.3
    assert engine["per_round"] == pytest.approx(
        [17.0 / (17.0 - 8.0 + 8.0 / hc8[0]), 18.0 / (18.0 - 8.0 + 8.0 / hc8[1])]
    )
    groups = b["fastvec train HalfCheetah-v5 (102.4k steps), batch groups over lock-step"]
    assert groups["goal"] == 1.15 and groups["per_round"] == pytest.approx([14.0 / 12.6] * 2)
    asy = b["fastvec train HalfCheetah-v5 (102.4k steps), async pipeline over lock-step"]
    assert asy["goal"] == 1.2 and asy["per_round"] == pytest.approx([14.0 / (20.0 / 2)] * 2)
    md = ceil.render(runs, b, 2, 2, 1.0, ["--rounds", "2"])
    assert (
        "| Pong, 16 envs in batches of 8 (ready mode), over SyncVectorEnv x8 | 2.10x | 2.10x (2.10-2.11) | 100% |" in md
    )
    assert f"| 1.15x | 1.11x (1.11-1.11) | {100 * 1.15 / (14.0 / 12.6):.0f}% (above every round's) |" in md
    assert "| train:sync wall_s (s) | 17.50 (17.00-18.00) |" in md
    assert "| train:engine cpu_s (s) | 22.00 (22.00-22.00) |" in md
    # a groups run is not a lock-step one: refused, not mixed in
    runs["train:engine"] = [{**runs["train:engine"][0], "env_groups": 2}] * 2
    with pytest.raises(RuntimeError, match="lock-step"):
        ceil.bounds(runs, 2, 102_400)


def test_ceilings_child_measures_real_envs():
    pytest.importorskip("mujoco")
    ceil = _ceilings_module()
    for kind in ("loop", "sync"):
        res = ceil.child({"kind": kind, "workload": "halfcheetah", "steps": 40, "envs": 2})
        assert res["sps"] > 0, kind


def test_train_loop_child_runs_the_learner_it_names():
    """The train loop's ``*_autograd`` ablation runs torch's autograd; the default the
    numpy learner (CartPole's MLP on the CPU), on both backends."""
    from harness.loop_children import child_train

    for cand, learner in (("sync", "numpy"), ("engine_autograd", "torch")):
        res = child_train({"env": "CartPole-v1", "steps": 1024, "cand": cand})
        assert res["learner"] == learner and res["times"]["learn"] > 0, cand
        assert res["lost_wakeups"] == (None if cand == "sync" else 0), res


def test_gae_benchmark_writes_results(tmp_path, capsys):
    """benchmarks/bench_gae.py: the table on stdout and, with --out, results.md/json."""
    import bench_gae

    out = tmp_path / "gae"
    assert bench_gae.main(["--quick", "--T", "64", "--N", "4", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["T"] == 64 and res["N"] == 4
    assert res["methods"]["fastvec"]["median_s"] > 0
    md = (out / "results.md").read_text()
    assert md.startswith("# GAE") and "| fastvec.gae (allocates outputs) |" in md
    assert "fastvec.gae vs numpy loop:" in md and "fastvec.gae vs numpy loop:" in capsys.readouterr().out


def test_gae_benchmark_times_what_it_checked():
    """bench_gae.run_gae_bench: rows for the sizes asked, every implementation's output
    equal to the numpy loop's (or the torch loop's) before it is timed, and speed-ups that
    are the quotients of the timings it reports."""
    from bench_gae import run_gae_bench

    msgs = []
    res = run_gae_bench(T=16, N=3, dtype="float64", repeats=2, progress=msgs.append, min_time=1e-4, include_torch=True)
    assert msgs and msgs[-1] == "done"
    assert (res["T"], res["N"], res["elements"], res["dtype"], res["repeats"]) == (16, 3, 48, "float64", 2)
    methods = res["methods"]
    assert {"fastvec", "fastvec_out", "fastvec_from_dones", "numpy_loop"} <= set(methods)
    for m in methods.values():
        assert m["min_s"] <= m["median_s"] <= m["max_s"]
        assert m["elements_per_s"] == pytest.approx(48 / m["median_s"])
    assert res["max_abs_diff"]["fastvec_vs_numpy"] <= 1e-9
    fv = methods["fastvec"]["median_s"]
    assert res["speedup_vs_numpy"] == pytest.approx(methods["numpy_loop"]["median_s"] / fv)
    if "torch_cleanrl" in methods:
        assert res["max_abs_diff"]["from_dones_vs_torch"] <= 1e-9
        assert res["speedup_vs_torch"] == pytest.approx(methods["torch_cleanrl"]["median_s"] / fv)
    else:
        assert res["speedup_vs_torch"] is None and res["torch_error"]
    import bench_gae

    md = bench_gae.markdown(res).splitlines()
    assert md[0].startswith("GAE, T=16, N=3, float64, 2 repeats")
    assert [line.split(" | ")[0] for line in md[4 : 4 + len(methods)]] == [
        f"| {m['description']}" for m in methods.values()
    ]
    with pytest.raises(ValueError):
        run_gae_bench(T=4, N=2, dtype="int32")


def test_run_train_is_fastvec_train_as_a_user_runs_it(tmp_path):
    """harness.cli_runs: the command line every benchmark trains with, run in a fresh
    process; its result JSON, its metrics log; a failing run ends the benchmark with
    the command and the trainer's error."""
    from harness.cli_runs import metrics_rows, return_rows, run_train, train_command
    from harness.processes import last_json

    cmd = train_command(
        "CartPole-v1",
        3,
        total_steps=2048,
        sets=["n_epochs=1"],
        extra_args=["--stop-at-return", "500"],
        logdir="/x",
        checkpoint_every=0,
    )
    assert cmd == [sys.executable, "-m", "fastvec", "train", "CartPole-v1", "--seed", "3", "--total-steps", "2048"] + [
        "--set", "n_epochs=1", "--stop-at-return", "500", "--no-progress", "--no-tensorboard",
        "--checkpoint-every", "0", "--logdir", "/x",
    ]  # fmt: skip
    assert train_command(None, extra_args=["--resume", "/r"])[3:] == [
        "train", "--resume", "/r", "--no-progress", "--no-tensorboard"
    ]  # fmt: skip
    run = tmp_path / "run"
    res = run_train("CartPole-v1", 3, total_steps=1024, sets=["n_epochs=1"], logdir=str(run), checkpoint_every=0)
    assert res["env_steps"] == 1024 and res == json.loads((run / "result.json").read_text())
    rows = metrics_rows(str(run))
    assert rows and all(r["env_steps"] <= 1024 for r in rows)
    assert all(r["charts/mean_return"] is not None for r in return_rows(str(run)))
    assert metrics_rows(str(tmp_path / "none")) == []
    with pytest.raises(SystemExit, match="fastvec train No-Such-Env-v0 --seed 1"):
        run_train("No-Such-Env-v0", 1, total_steps=8)
    assert last_json('noise\n{"a": 1}\n{"b": 2\n') == {"a": 1} and last_json("no json") is None


def test_preset_candidates_train_evaluate_and_report(tmp_path, capsys):
    """benchmarks/bench_presets.py: each candidate and seed trained and evaluated in fresh
    processes; the table's medians and worst seed are those of the runs it saved."""
    import argparse

    import bench_presets

    with pytest.raises(argparse.ArgumentTypeError, match="name:key=value"):
        bench_presets.parse_candidate("no_colon")
    with pytest.raises(argparse.ArgumentTypeError, match="expected key=value"):
        bench_presets.parse_candidate("x:lr")
    argv = ["CartPole-v1", "--steps", "1024", "--seeds", "1", "2", "--episodes", "2", "--out", str(tmp_path)]
    argv += ["--candidate", "preset:", "--candidate", "fast:lr=1e-3,n_epochs=2"]
    assert bench_presets.main(argv) == 0
    res = json.loads((tmp_path / "CartPole-v1.json").read_text())
    assert set(res["runs"]) == {"preset", "fast"} and res["runs"]["fast"]["1"]["sets"] == ["lr=1e-3", "n_epochs=2"]
    md = (tmp_path / "CartPole-v1.md").read_text()
    for name, runs in res["runs"].items():
        evals = [r["eval_mean"] for r in runs.values()]
        assert all(r["env_steps"] == 1024 for r in runs.values())
        (row,) = [line for line in md.splitlines() if line.startswith(f"| {name} |")]
        assert row.endswith(f"| {min(evals):.1f} |"), row  # the worst seed's evaluation
    with pytest.raises(SystemExit):
        bench_presets.main(["CartPole-v1", "--steps", "10", "--candidate", "a:", "--candidate", "a:lr=1"])
    assert "candidate names must differ" in capsys.readouterr().err


def test_preset_candidates_by_wall_time(tmp_path, capsys):
    """bench_presets.py --max-time: each run stopped by time (fastvec train --max-time),
    evaluated as usual; the report names the budget. Not with --sb3 (SB3 runs by steps)."""
    import bench_presets

    argv = ["CartPole-v1", "--steps", "100000000", "--max-time", "1", "--seeds", "1", "--episodes", "1"]
    assert bench_presets.main([*argv, "--candidate", "preset:", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "CartPole-v1.json").read_text())
    (r,) = res["runs"]["preset"].values()
    assert res["max_time"] == 1.0 and 1.0 <= r["wall_seconds"] < 10 and 0 < r["env_steps"] < 10**8
    assert "1 s of training (at most 100,000,000 env steps)" in (tmp_path / "CartPole-v1.md").read_text()
    with pytest.raises(SystemExit):
        bench_presets.main(["HalfCheetah-v5", *argv[1:], "--candidate", "a:", "--sb3"])
    assert "not with --max-time" in capsys.readouterr().err


def _search_args(tmp_path, **kw):
    import argparse

    base = dict(seeds=[1, 2, 3], max_time=1.0, trials=6, baseline=[("preset", [])], previous=[], sampler_seed=0)
    return argparse.Namespace(**{**base, **kw})


def test_preset_search_scores_the_worst_seed_and_prunes(tmp_path):
    """benchmarks/search_presets.py against a fake trainer whose returns are known: a trial
    scores its worst seed; a seed at or below the best score so far ends the trial; the
    best of the complete trials is the true best of those drawn; a resumed search adds
    to the same record; a failing run is kept as failed."""
    import search_presets as sp

    space = {"lr": ["1", "2", "3"], "n_epochs": ["1", "2"]}
    calls = []

    def runner(seed, sets, max_time):  # return: lr * 100 + epochs * 10, less 50 on seed 3
        calls.append((seed, tuple(sets)))
        p = dict(s.split("=") for s in sets)
        if p.get("n_epochs") == "0":
            raise SystemExit("fastvec train failed:\nbad value")
        ret = float(p.get("lr", "2")) * 100 + float(p.get("n_epochs", "1")) * 10 - (50 if seed == 3 else 0)
        return {"seed": seed, "train_return": ret, "env_steps": 100, "wall_seconds": max_time, "curve": []}

    saved = []
    trials = sp.search(_search_args(tmp_path), space, runner, lambda t: saved.append(len(t)))
    assert saved == list(range(1, 8)) and [t["name"] for t in trials] == ["preset"] + [f"trial{i}" for i in range(6)]
    assert trials[0]["state"] == "complete" and sp.score([r["train_return"] for r in trials[0]["runs"]]) == 160
    bar = 160.0
    for t in trials[1:]:
        p = t["params"]
        full = float(p["lr"]) * 100 + float(p["n_epochs"]) * 10
        rets = [r["train_return"] for r in t["runs"]]
        if full <= bar:  # seed 1 already at or below the best: pruned after it
            assert t["state"] == "pruned" and rets == [full]
        else:
            assert t["state"] == "complete" and rets == [full, full, full - 50]
            bar = max(bar, full - 50)
    assert sp.best_score(trials) == bar
    md = sp.report("X-v0", 1.0, [1, 2, 3], trials, "X-v0 ...", 60.0)
    best = max(
        (t for t in trials if t["state"] == "complete"), key=lambda t: sp.score([r["train_return"] for r in t["runs"]])
    )
    assert md.splitlines()[6].startswith(f"| {best['name']} | complete | {bar:,.0f} |")
    # resumed: the record goes on from trial6, the baseline is not run again
    calls.clear()
    more = sp.search(_search_args(tmp_path, trials=2, previous=trials), space, runner, lambda t: None)
    assert [t["name"] for t in more[7:]] == ["trial6", "trial7"] and all(s in (1, 2, 3) for s, _ in calls)
    assert not any(sets == () for _, sets in calls)
    # a run the trainer refuses: the trial is failed, the search goes on
    bad = sp.search(
        _search_args(tmp_path, trials=1, baseline=[("zero", ["n_epochs=0"])]), space, runner, lambda t: None
    )
    assert bad[0]["state"] == "failed" and "bad value" in bad[0]["error"] and bad[0]["runs"] == []
    assert bad[1]["state"] == "complete"  # the bar stayed -inf: every seed ran
    drawn = sp.search(_search_args(tmp_path, trials=2, baseline=[]), {"n_epochs": ["0"]}, runner, lambda t: None)
    assert [t["state"] for t in drawn] == ["failed", "failed"]  # told to the sampler as failed
    again = sp.search(
        _search_args(tmp_path, trials=1, baseline=[], previous=drawn), {"n_epochs": ["0"]}, runner, lambda t: None
    )
    assert [t["name"] for t in again] == ["trial0", "trial1", "trial2"]


def test_preset_search_runs_fastvec_train_by_time(tmp_path, capsys):
    """search_presets.py end to end: real runs stopped by --max-time, the JSON and table
    written; one-line refusals."""
    import search_presets as sp

    argv = ["CartPole-v1", "--max-time", "1", "--seeds", "1", "--trials", "1", "--space", "classic"]
    argv += ["--baseline", "preset:", "--out", str(tmp_path)]
    assert sp.main(argv) == 0
    res = json.loads((tmp_path / "CartPole-v1.json").read_text())
    assert [t["name"] for t in res["trials"]] == ["preset", "trial0"]
    for t in res["trials"]:
        (r,) = t["runs"]
        assert r["env_steps"] > 0 and 1.0 <= r["wall_seconds"] < 10
        assert r["curve"][-1] == [r["env_steps"], r["wall_seconds"], r["train_return"]]
    assert sp.main([*argv[:-2], "--out", str(tmp_path), "--resume", "--trials", "1"]) == 0
    res = json.loads((tmp_path / "CartPole-v1.json").read_text())
    assert [t["name"] for t in res["trials"]] == ["preset", "trial0", "trial1"]
    capsys.readouterr()
    for bad, msg in (
        (["--max-time", "0"], "--max-time must be positive"),
        (["--max-time", "1", "--baseline", "trialx:"], "baseline names"),
        (["--max-time", "1", "--resume"], "--resume needs"),
        (["--max-time", "1", "--param", "lr"], "key=value1|value2"),
    ):
        with pytest.raises(SystemExit):
            sp.main(["CartPole-v1", *bad])
        assert msg in capsys.readouterr().err


def test_preset_sb3_anchor(tmp_path, capsys):
    """bench_presets.py --sb3: SB3's PPO with RL Zoo's hyperparameters trained and evaluated
    as one more candidate; the anchor line times each candidate's curve to SB3's return."""
    import bench_presets

    with pytest.raises(SystemExit):
        bench_presets.main(["CartPole-v1", "--steps", "10", "--candidate", "a:", "--sb3"])
    assert "RL Zoo's hyperparameters are here for" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_presets.main(["CartPole-v1", "--steps", "10", "--candidate", "sb3_zoo:lr=1"])
    assert "is --sb3's candidate" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_presets.main(["CartPole-v1", "--steps", "10", "--candidate", "a:", "--sb3-steps", "5"])
    assert "--sb3-steps needs --sb3" in capsys.readouterr().err
    # the candidates may run longer than SB3: the anchor asks for time, not steps
    argv = ["HalfCheetah-v5", "--steps", "2048", "--seeds", "1", "--episodes", "1", "--out", str(tmp_path)]
    assert bench_presets.main([*argv, "--candidate", "preset:", "--sb3", "--sb3-steps", "1024"]) == 0
    res = json.loads((tmp_path / "HalfCheetah-v5.json").read_text())
    sb3 = res["runs"]["sb3_zoo"]["1"]
    assert res["sb3_steps"] == 1024 and res["runs"]["preset"]["1"]["env_steps"] >= 2048
    assert sb3["env_steps"] == 1024 and math.isfinite(sb3["eval_mean"]) and sb3["wall_seconds"] > 0
    assert sb3["curve"][-1][:2] == [1024, round(sb3["wall_seconds"], 2)]
    md = (tmp_path / "HalfCheetah-v5.md").read_text()
    assert "SB3 anchor:" in md and "2,048 env steps, SB3 1,024, 1 seeds" in md


def test_preset_anchor_times_each_curve_to_the_sb3_return():
    """The anchor's arithmetic against a hand-worked case: SB3 ends at a median 100 in a
    median 50 s; one candidate gets there at 10 and 20 s (0.30x), one on one seed only."""
    import bench_presets

    assert bench_presets.time_to([[1, 1.0, None], [2, 2.0, 90.0], [3, 3.0, 100.0]], 100.0) == 3.0
    assert bench_presets.time_to([[1, 1.0, 5.0]], 100.0) is None
    sb3 = {1: {"train_return": 90.0, "wall_seconds": 40.0}, 2: {"train_return": 110.0, "wall_seconds": 60.0}}
    fast = {1: {"curve": [[1, 10.0, 100.0]]}, 2: {"curve": [[1, 5.0, 99.0], [2, 20.0, 120.0]]}}
    slow = {1: {"curve": [[1, 10.0, 100.0]]}, 2: {"curve": [[1, 5.0, 50.0]]}}
    lines = bench_presets.anchor_lines({"fast": fast, "slow": slow, "sb3_zoo": sb3}, [1, 2])
    assert "median 100.0, in a median 50.0 s" in lines[1]
    assert lines[3] == "- fast: reached on 2/2 seeds, 15.0 (10.0-20.0) s: 0.30x SB3's time"
    assert lines[4] == "- slow: reached on 1/2 seeds, 10.0 (10.0-10.0) s: not on every seed"
    assert bench_presets.anchor_lines({"fast": fast}, [1, 2]) == []


def test_presets_page_from_saved_runs(tmp_path):
    """benchmarks/presets_page.py: the results page's rows are the saved runs' figures (the
    return at each minute read off the curve by hand here), with the published figures
    and a chart per task."""
    import presets_page

    curve = [[1000, 30.0, 10.0], [2000, 70.0, 20.0], [3000, 130.0, None], [4000, 200.0, 40.0]]
    run = {"wall_seconds": 200.0, "env_steps": 4000, "train_return": 40.0, "eval_mean": 55.0, "eval_std": 5.0}
    res = {"env_id": "Hopper-v5", "steps": 4000, "command": "Hopper-v5 --steps 4000", "runs": {}}
    res["runs"]["cand"] = {"1": {**run, "curve": curve, "sets": ["lr=1e-3"]}}
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "Hopper-v5.json").write_text(json.dumps(res))
    assert presets_page.return_at(curve, 60) == 10.0 and presets_page.return_at(curve, 150) == 20.0
    assert presets_page.return_at(curve, 300) is None  # the run ended before 5 minutes
    out = tmp_path / "docs" / "results.md"
    out.parent.mkdir()
    assert presets_page.main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    md = out.read_text()
    assert "| cand | 1 | 200 | 40 | 10 | 20 | - | - | 55 +- 5 |" in md
    assert "2,410 +- 10" in md and "- cand: `lr=1e-3`" in md
    assert (tmp_path / "docs" / "results" / "Hopper-v5.png").stat().st_size > 0
    assert (
        presets_page.task_section({**res, "sb3_steps": 1000}, "c.png")[0]
        == "## Hopper-v5, 4,000 env steps (SB3: 1,000)"
    )
    with pytest.raises(SystemExit):
        presets_page.main([str(tmp_path / "docs" / "results"), "--out", str(out)])


def test_placement_benchmark_measures_and_reports(tmp_path, capsys):
    import bench_placement

    out = tmp_path / "placement"
    argv = ["--rounds", "1", "--only", "uneven", "--policies", "none", "--steps-scale", "0.02", "--out", str(out)]
    assert bench_placement.main(argv) == 0
    runs = json.loads((out / "placement.json").read_text())["runs"]
    assert set(runs) == {"none/uneven/sync", "none/uneven/contiguous", "none/uneven/balanced"}
    assert runs["none/uneven/contiguous"][0]["placement"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # The balanced run is placed by the costs its probe measured, and the report says
    # which (what a probe measures on a loaded host is test_placement.py's question).
    from fastvec._core.placement import balance

    balanced = runs["none/uneven/balanced"][0]
    expected = balance(np.asarray(balanced["probe_us"]), 2)
    assert balanced["placement"] == [[int(i) for i in w] for w in expected]
    assert runs["none/uneven/sync"][0]["placement"] is None
    assert all(run[0]["sps"] > 0 for run in runs.values())
    table = (out / "placement.md").read_text()
    assert "| none | uneven | balanced |" in table and "1.00 (1.00-1.00)" in table


@pytest.mark.slow
def test_train_mix_benchmark_checks_and_reports(tmp_path, capsys):
    import bench_train_mix

    out = tmp_path / "mix"
    assert bench_train_mix.main(["--rounds", "1", "--steps", "8192", "--out", str(out)]) == 0
    runs = json.loads((out / "train_mix.json").read_text())["runs"]
    bal, con = runs["balanced"][0], runs["contiguous"][0]
    assert con["placement"]["workers"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert bal["placement"]["workers"] != con["placement"]["workers"]  # the costly four no longer on one worker
    assert bal["placement"]["balance"] > con["placement"]["balance"]
    assert bal["final_mean_return"] == con["final_mean_return"] and bal["first_return"] is not None
    table = (out / "train_mix.md").read_text()
    assert "| balanced |" in table and "| contiguous |" in table and "1.00 (1.00-1.00)x" in table


def test_tune_benchmark_ratios_are_per_round():
    import bench_tune

    meta = {"command": "x", "cpu": "cpu", "cores": 2, "date": "d", "seconds": 1}
    picks = {"pong8/0": {"chosen": "2/groups/4/contiguous", "runner_up": "2/None/None/contiguous"}}
    sps = {
        "pong8/0": {
            "2/None/None/contiguous": [100.0, 200.0],
            "2/groups/4/contiguous": [90.0, 220.0],
            "1/None/None/contiguous": [50.0, 60.0],
        }
    }
    table = bench_tune.render(meta, picks, sps, rounds=2)
    # round 1: the pick 90 of the best 100 (0.90), of the default 100; round 2: the pick is the best (1.00), 1.10 of the default
    assert (
        "| pong8 | 0 | 2 workers, batches of 4 (groups) (2 workers, lock-step) | 0.95 (0.90-1.00) | 1.00 (0.90-1.10) |"
        in table
    )
    assert [layout.num_workers for layout in bench_tune.grid(8, 2) if layout.batch_mode is None] == [1, 2, 3, 4]


def test_minigrid_dict_is_minigrids_observation_without_mission():
    """benchmarks/harness/minigrid_dict.py: the Dict both trainers take is MiniGrid's own
    observation of the same seeded episode, its image as float32 codes, mission dropped."""
    minigrid = pytest.importorskip("minigrid")
    from harness.minigrid_dict import ENV_ID, door_key

    assert minigrid is not None
    env, ref = door_key(), gym.make(ENV_ID)
    assert set(env.observation_space.spaces) == {"image", "direction"}
    assert env.observation_space["image"].dtype == np.float32
    assert env.observation_space["image"].shape == ref.observation_space["image"].shape
    obs, _ = env.reset(seed=3)
    want, _ = ref.reset(seed=3)
    for step in range(40):
        assert env.observation_space.contains(obs)
        np.testing.assert_array_equal(obs["image"], want["image"].astype(np.float32))
        assert obs["direction"] == want["direction"]
        action = step % 3  # left, right, forward: the view and direction change
        obs, *_ = env.step(action)
        want, *_ = ref.step(action)
