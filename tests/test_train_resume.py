"""Long runs lose nothing: periodic checkpoints, ``--resume``, SIGINT / SIGTERM / kill -9,
flaky envs (``restart_on_error``) and the restart limit.

The exactness reference: N updates, a checkpoint, then the envs reset and M more updates
in the same process, against a fresh process that loads the checkpoint, resets the envs
the same way and runs M updates: the weights must be identical.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import conftest
import gymnasium as gym
import numpy as np
import psutil
import pytest
import torch
from helpers import run_clock

from fastvec.engine import Engine
from fastvec.train import PPO, EngineStorage, PPOConfig, apply_overrides, load_checkpoint
from fastvec.train.algo.checkpoints import resume_checkpoint, save_checkpoint
from fastvec.train.commands.cli import main as cli_main
from fastvec.train.commands.cli import run_training
from fastvec.train.config.presets import env_factory, preset_for
from fastvec.train.config.seeding import env_seeds
from fastvec.train.run.loop import run_env_seeds

HERE = os.path.dirname(os.path.abspath(__file__))
FLAKY_ID = "FastvecTestFlakyCartPole-v0"


class FlakyCartPole(gym.Wrapper):
    """CartPole-v1 whose ``step`` raises with probability ``p`` (its own RNG)."""

    def __init__(self, p: float = 1 / 20_000):
        super().__init__(gym.make("CartPole-v1"))
        self.p = p
        self.rng = np.random.default_rng([os.getpid(), id(self)])

    def step(self, action):
        if self.rng.random() < self.p:
            raise RuntimeError("flaky env: injected step failure")
        return self.env.step(action)


if FLAKY_ID not in gym.registry:  # forked workers inherit the registration
    gym.register(FLAKY_ID, entry_point=FlakyCartPole)


def cartpole_cfg(**changes) -> PPOConfig:
    cfg = apply_overrides(PPOConfig(), preset_for("CartPole-v1"))
    apply_overrides(cfg, {"device": "cpu", "torch_threads": 1, "seed": 3, **changes})
    return cfg.validate()


def storage(cfg: PPOConfig, env_id="CartPole-v1") -> EngineStorage:
    eng = Engine(
        [env_factory(env_id, {})] * cfg.num_envs,
        num_workers=cfg.num_workers,
        context="fork",
        num_slots=cfg.n_steps + 1,
        autoreset_mode="same_step",
    )
    return EngineStorage(eng)


def iterate(ppo: PPO, n: int) -> None:
    """n rollouts and updates, as the training loop runs them."""
    ro = ppo.rollout
    for _ in range(n):
        ppo.collect()
        ppo.prepare()
        ppo.update()
        ro.obs[0].copy_(ro.obs[ro.T])


# ============================================================================ exactness
@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"normalize_obs": True, "normalize_reward": True, "ent_coef": 0.01},
        {"policy_core": "lstm", "core_size": 16, "normalize_obs": True},  # the states restart with the episodes
    ],
)
def test_resume_is_exact(tmp_path, changes):
    """Checkpoint after N updates; the same process then resets its envs and runs M more,
    a fresh PPO resumes from the file, resets the envs the same way and runs M: the
    weights, optimiser moments and statistics come out identical."""
    N, M = 3, 4
    cfg = cartpole_cfg(total_steps=20_000, **changes)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    st = storage(cfg)
    try:
        ppo = PPO(cfg, st, torch.device("cpu"))
        st.reset(run_env_seeds(cfg, ppo))
        iterate(ppo, N)
        path = save_checkpoint(str(tmp_path / "c.pt"), ppo, "CartPole-v1", {}, train_state=ppo.train_state())
        ppo.restart_envs(run_env_seeds(cfg, ppo, resumed=True))
        iterate(ppo, M)
        ref_params = ppo.flat_param.detach().clone()
        ref_m, ref_v = ppo.opt.m.clone(), ppo.opt.v.clone()
        ref = (ppo.env_steps, ppo.updates, ppo.tracker.episodes, list(ppo.tracker.window), ppo.opt.t)
        ref_scaler = None if ppo.reward_scaler is None else ppo.reward_scaler.state()
    finally:
        st.close()

    torch.manual_seed(12345)  # whatever the new process's RNG holds is overwritten
    np.random.seed(12345)
    ckpt = load_checkpoint(path)
    from fastvec.train.algo.checkpoints import policy_from_checkpoint

    st2 = storage(cfg)
    try:
        pol = policy_from_checkpoint(ckpt)
        pol.train()
        ppo2 = PPO(cfg, st2, torch.device("cpu"), pol)
        ppo2.load_train_state(ckpt["train_state"])
        ppo2.restart_envs(run_env_seeds(cfg, ppo2, resumed=True))
        iterate(ppo2, M)
        assert torch.equal(ppo2.flat_param.detach(), ref_params)
        assert torch.equal(ppo2.opt.m, ref_m) and torch.equal(ppo2.opt.v, ref_v)
        assert (ppo2.env_steps, ppo2.updates, ppo2.tracker.episodes, list(ppo2.tracker.window), ppo2.opt.t) == ref
        if ref_scaler is not None:
            assert ppo2.reward_scaler.state() == ref_scaler
    finally:
        st2.close()


def test_resume_exactness_check_can_fail(tmp_path):
    """The comparison above is not vacuous: the same resume with the RNG state not
    restored (reseeded after loading) ends with other weights."""
    cfg = cartpole_cfg(total_steps=20_000)
    torch.manual_seed(cfg.seed)
    st = storage(cfg)
    try:
        ppo = PPO(cfg, st, torch.device("cpu"))
        st.reset(run_env_seeds(cfg, ppo))
        iterate(ppo, 2)
        state = ppo.train_state()
        weights = {k: v.clone() for k, v in ppo.policy.state_dict().items()}
        ppo.restart_envs(run_env_seeds(cfg, ppo, resumed=True))
        iterate(ppo, 3)
        ref = ppo.flat_param.detach().clone()
    finally:
        st.close()
    st2 = storage(cfg)
    try:
        from fastvec.train.model.actor_critic import make_policy

        pol = make_policy(
            st2.single_observation_space,
            st2.single_action_space,
            hidden=cfg.hidden,
            activation=cfg.activation,
            ortho_init=False,
        )
        pol.load_state_dict(weights)
        ppo2 = PPO(cfg, st2, torch.device("cpu"), pol)
        ppo2.load_train_state(state)
        torch.manual_seed(999)
        ppo2.restart_envs(run_env_seeds(cfg, ppo2, resumed=True))
        iterate(ppo2, 3)
        assert not torch.equal(ppo2.flat_param.detach(), ref)
    finally:
        st2.close()


def test_run_training_resume_continues_counters_and_logs(tmp_path, monkeypatch):
    """Stop after 5 updates (the loop's stop hook, as Ctrl-C does), resume to the end:
    one metrics.jsonl with strictly increasing steps, TensorBoard without duplicates,
    the whole run's steps in the result, its wall time counted on from the first part's,
    ``resumed`` and ``interrupted`` set right."""
    run = str(tmp_path / "run")
    cfg = cartpole_cfg(
        total_steps=16 * 256, log_every_s=1e-6, checkpoint_every=1024, keep_checkpoints=2, stop_at_return=1e9
    )
    calls = {"n": 0}

    def stop():
        calls["n"] += 1
        return calls["n"] > 5

    first = run_training("CartPole-v1", cfg, run_dir=run, progress=False, stop=stop)
    assert first["interrupted"] and not first["resumed"]
    assert first["updates"] == 5 and first["env_steps"] == 5 * 256
    ckpts = sorted(os.listdir(os.path.join(run, "checkpoints")))
    assert ckpts == ["step-000000001024.pt"], ckpts
    path, ck = resume_checkpoint(run)
    assert path.endswith("checkpoint.pt") and ck["train_state"]["env_steps"] == 1280

    clock = run_clock(monkeypatch)
    second = run_training(resume=run, progress=False)
    assert second["resumed"] and not second["interrupted"]
    assert second["env_steps"] == 16 * 256 and second["updates"] == 15  # the last rollout is not learned
    # the second part's clock starts from the first's wall time, kept in its checkpoint
    assert ck["train_state"]["wall_seconds"] == pytest.approx(first["wall_seconds"], abs=1e-4)
    assert clock and {before for _phase, before, _s in clock} == {ck["train_state"]["wall_seconds"]}
    assert second["episodes"] >= first["episodes"]
    assert len(os.listdir(os.path.join(run, "checkpoints"))) == 2  # keep_checkpoints
    steps = [json.loads(line)["env_steps"] for line in open(os.path.join(run, "metrics.jsonl"))]
    assert steps == sorted(set(steps)), steps
    assert steps[-1] == 16 * 256

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run)
    acc.Reload()
    tb = [e.step for e in acc.Scalars("charts/mean_return")]
    assert tb == sorted(set(tb)) and tb[-1] == 16 * 256, tb


def test_resume_refuses_changes_to_the_learning(tmp_path):
    run = str(tmp_path / "run")
    cfg = cartpole_cfg(total_steps=512)
    run_training("CartPole-v1", cfg, run_dir=run, progress=False, tensorboard=False)
    bad = cartpole_cfg(total_steps=1024, lr=0.1)
    with pytest.raises(ValueError, match="cannot change lr"):
        run_training(resume=run, config=bad, progress=False, tensorboard=False)
    ok = cartpole_cfg(total_steps=1024, log_every_s=5.0)
    res = run_training(resume=run, config=ok, progress=False, tensorboard=False)
    assert res["resumed"] and res["env_steps"] == 1024
    with pytest.raises(ValueError, match="a run of CartPole-v1, not Acrobot-v1"):
        run_training("Acrobot-v1", resume=run, progress=False, tensorboard=False)


# ============================================================================ CLI, bad input
def _one_line_error(capsys, code, expect):
    err = capsys.readouterr().err.strip()
    assert code == 2, (code, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert expect in err, err


def test_cli_resume_bad_input(tmp_path, capsys):
    _one_line_error(capsys, cli_main("train", ["--resume", str(tmp_path / "none")]), "no run directory")
    (tmp_path / "empty").mkdir()
    _one_line_error(capsys, cli_main("train", ["--resume", str(tmp_path / "empty")]), "holds no checkpoint")
    _one_line_error(capsys, cli_main("train", []), "give an env id")
    run = tmp_path / "run"
    assert (
        cli_main(
            "train", ["CartPole-v1", "--total-steps", "512", "--logdir", str(run), "--no-progress", "--no-tensorboard"]
        )
        == 0
    )
    capsys.readouterr()
    r = str(run)
    _one_line_error(capsys, cli_main("train", ["Acrobot-v1", "--resume", r]), "a run of CartPole-v1, not Acrobot-v1")
    _one_line_error(capsys, cli_main("train", ["--resume", r, "--set", "gamma=0.9"]), "cannot change gamma")
    _one_line_error(capsys, cli_main("train", ["--resume", r, "--num-envs", "4"]), "cannot change num_envs")
    _one_line_error(capsys, cli_main("train", ["--resume", r, "--seed", "9"]), "cannot change seed")
    _one_line_error(capsys, cli_main("train", ["--resume", r, "--init-from", r]), "does not take --init-from")
    _one_line_error(capsys, cli_main("train", ["--resume", r, "--logdir", str(tmp_path / "x")]), "drop --logdir")
    _one_line_error(capsys, cli_main("train", ["--resume", r, "--checkpoint-every", "-1"]), "checkpoint-every")
    # a checkpoint of an incompatible version: the newer format, and the weights-only format 1
    ck = torch.load(run / "checkpoint.pt", weights_only=False)
    torch.save({**ck, "format": "fastvec-ppo-99", "fastvec_version": "9.0"}, run / "checkpoint.pt")
    _one_line_error(capsys, cli_main("train", ["--resume", r]), "incompatible fastvec version")
    torch.save({**ck, "format": "fastvec-ppo-1", "train_state": None}, run / "checkpoint.pt")
    _one_line_error(capsys, cli_main("train", ["--resume", r]), "incompatible fastvec version")
    assert cli_main("eval", [str(run / "checkpoint.pt"), "--episodes", "1"]) == 0  # format 1 still evaluates


def test_periodic_checkpoints_keep_the_last_k_and_skip_broken_files(tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        cli_main(
            "train",
            [
                "CartPole-v1",
                "--total-steps",
                "3000",
                "--logdir",
                str(run),
                "--no-progress",
                "--no-tensorboard",
                "--checkpoint-every",
                "5e2",
                "--set",
                "keep_checkpoints=2",
                "--set",
                "stop_at_return=1e9",
            ],
        )
        == 0
    )
    names = sorted(os.listdir(run / "checkpoints"))
    assert len(names) == 2 and all(n.startswith("step-") for n in names), names
    assert not [n for n in os.listdir(run) if n.startswith(".tmp")]
    steps = [int(n[5:-3]) for n in names]
    assert steps == sorted(steps) and steps[-1] < 3000
    # A torn newest file (as if the disk had lied) is skipped with a warning.
    newest = run / "checkpoints" / names[-1]
    final = run / "checkpoint.pt"
    final.unlink()
    newest.write_bytes(newest.read_bytes()[:100])
    capsys.readouterr()
    path, ck = resume_checkpoint(str(run))
    assert path.endswith(names[0]) and ck["train_state"]["env_steps"] == steps[0]
    assert "skipping" in capsys.readouterr().err


# ============================================================================ signals, kill -9
def _child_env():
    """The children's environment. Every child runs with a cwd outside the source tree,
    so ``-m fastvec`` imports the installed package (CI installs it; the checkout has no
    built extensions)."""
    env = dict(os.environ)
    env.pop("FASTVEC_DEBUG", None)
    return env


def _train_cmd(run, *extra):
    return [
        sys.executable,
        "-m",
        "fastvec",
        "train",
        "CartPole-v1",
        "--logdir",
        str(run),
        "--no-progress",
        "--set",
        "log_every_s=0.05",
        *extra,
    ]


def _wait_for(cond, timeout, what):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _metrics_rows(run):
    try:
        with open(os.path.join(run, "metrics.jsonl")) as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _what_it_holds(pid):
    """(worker pids, fastvec shared-memory segments) of a running trainer."""
    proc = psutil.Process(pid)
    kids = [p.pid for p in proc.children(recursive=True)]
    segs = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if "/dev/shm/fastvec_" in line:
                segs.add(line.split("/dev/shm/")[1].split()[0])
    return kids, segs


def _assert_nothing_left(kids, segs, timeout=10.0):
    def gone():
        alive = [p for p in kids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        return not alive and not [s for s in segs if os.path.exists("/dev/shm/" + s)]

    _wait_for(gone, timeout, f"workers {kids} and segments {segs} to go")


def _start(cmd, run, rows=2):
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_child_env(), cwd=str(run.parent)
    )
    try:
        _wait_for(lambda: _metrics_rows(run) >= rows or p.poll() is not None, 120, "the run to start logging")
        assert p.poll() is None, p.communicate()
        held = _what_it_holds(p.pid)
        assert held[0] and held[1], held
    except BaseException:
        p.kill()
        p.communicate()
        raise
    return p, held


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_at_a_safe_point_with_a_checkpoint(tmp_path, sig, code):
    run = tmp_path / "run"
    p, held = _start(_train_cmd(run, "--total-steps", "1e6", "--set", "stop_at_return=1e9"), run)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    res = json.loads(out.strip().splitlines()[-1])
    assert res["interrupted"] is True and 0 < res["env_steps"] < 1e6
    assert "stopping at the next safe point" in err and "Traceback" not in err
    ck = load_checkpoint(str(run / "checkpoint.pt"))
    assert ck["train_state"]["env_steps"] == res["env_steps"]
    _assert_nothing_left(*held)
    if sig != signal.SIGINT:
        return  # resuming after an interruption: once is enough (SIGINT)
    # ... and the run continues from there
    out2 = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastvec",
            "train",
            "--resume",
            str(run),
            "--no-progress",
            "--total-steps",
            str(res["env_steps"] + 1000),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=_child_env(),
        cwd=str(tmp_path),
    )
    assert out2.returncode == 0, out2.stderr
    res2 = json.loads(out2.stdout.strip().splitlines()[-1])
    assert res2["resumed"] and not res2["interrupted"] and res2["env_steps"] >= res["env_steps"] + 1000


def test_second_ctrl_c_exits_at_once(tmp_path):
    run = tmp_path / "run"
    # long rollouts: the first Ctrl-C has a while to wait for its safe point
    p, held = _start(
        _train_cmd(run, "--total-steps", "1e6", "--set", "n_steps=4096", "--set", "stop_at_return=1e9"), run, rows=1
    )
    p.send_signal(signal.SIGINT)
    time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    _assert_nothing_left(*held)


def test_kill_9_then_resume_counts_every_step_once(tmp_path):
    """kill -9 at a moment after the first periodic checkpoint; --resume finishes the
    run: its env steps are the uninterrupted run's (within one rollout), the metrics
    continue without a duplicate, nothing is left behind."""
    total = 16_000
    run = tmp_path / "run"
    p, held = _start(
        _train_cmd(run, "--total-steps", str(total), "--checkpoint-every", "2048", "--set", "stop_at_return=1e9"), run
    )
    _wait_for(lambda: os.path.isdir(run / "checkpoints") and os.listdir(run / "checkpoints"), 60, "a checkpoint")
    time.sleep(np.random.default_rng().uniform(0.0, 0.5))
    p.kill()
    p.communicate()
    _assert_nothing_left(*held)
    out = subprocess.run(
        [sys.executable, "-m", "fastvec", "train", "--resume", str(run), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
        env=_child_env(),
        cwd=str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    rollout = 8 * 32  # the CartPole preset: 8 envs x n_steps 32
    assert res["resumed"] and total <= res["env_steps"] < total + rollout
    steps = [json.loads(line)["env_steps"] for line in open(run / "metrics.jsonl")]
    assert steps == sorted(set(steps))


def test_resuming_a_finished_run_logs_no_second_row_at_its_last_step(tmp_path):
    """What the kill -9 test meets when the run ends before the kill (a loaded host): the
    resumed run has nothing left to do, and metrics.jsonl keeps one row per step."""
    run = tmp_path / "run"
    cmd = _train_cmd(run, "--total-steps", "1024", "--set", "stop_at_return=1e9", "--no-tensorboard")
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_child_env(), cwd=str(tmp_path))
    assert first.returncode == 0, first.stderr
    again = [sys.executable, "-m", "fastvec", "train", "--resume", str(run), "--no-progress", "--no-tensorboard"]
    out = subprocess.run(again, capture_output=True, text=True, timeout=120, env=_child_env(), cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["env_steps"] == 1024
    steps = [json.loads(line)["env_steps"] for line in open(run / "metrics.jsonl")]
    assert steps == sorted(set(steps)) and steps[-1] == 1024


KILL_DURING_WRITE = r"""
import os, sys, time
import fastvec.train.algo.checkpoints as C
real = C.torch.save
calls = {"n": 0}
def save(obj, f):
    calls["n"] += 1
    if calls["n"] == 2:  # the second checkpoint: write part of it, then hang until killed
        f.write(b"partial checkpoint bytes")
        f.flush()
        open(sys.argv[1], "w").close()
        time.sleep(600)
    return real(obj, f)
C.torch.save = save
from fastvec.train.commands.cli import main
sys.exit(main("train", sys.argv[2:]))
"""


def test_kill_9_during_a_checkpoint_write_leaves_the_previous_one(tmp_path):
    run = tmp_path / "run"
    marker = tmp_path / "writing"
    script = tmp_path / "harness.py"
    script.write_text(KILL_DURING_WRITE)
    cmd = [
        sys.executable,
        str(script),
        str(marker),
        "CartPole-v1",
        "--logdir",
        str(run),
        "--no-progress",
        "--total-steps",
        "8000",
        "--checkpoint-every",
        "1024",
        "--set",
        "stop_at_return=1e9",
    ]
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_child_env(), cwd=str(tmp_path)
    )
    try:
        _wait_for(lambda: marker.exists() or p.poll() is not None, 120, "the second checkpoint write")
        assert p.poll() is None, p.communicate()
        held = _what_it_holds(p.pid)
    finally:
        p.kill()
        p.communicate()
    _assert_nothing_left(*held)
    files = os.listdir(run / "checkpoints")
    assert "step-000000001024.pt" in files and any(f.startswith(".tmp-") for f in files), files
    path, ck = resume_checkpoint(str(run))  # the torn temporary is removed, the first one loads
    assert path.endswith("step-000000001024.pt") and ck["train_state"]["env_steps"] == 1024
    assert not [f for f in os.listdir(run / "checkpoints") if f.startswith(".tmp-")]
    out = subprocess.run(
        [sys.executable, "-m", "fastvec", "train", "--resume", str(run), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
        env=_child_env(),
        cwd=str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["env_steps"] >= 8000


@pytest.mark.slow
def test_kill_9_at_random_moments_still_solves(tmp_path):
    """Kill -9 twice at random moments, resume each time: the run reaches the
    --stop-at-return target (CartPole 475), as the uninterrupted run on that seed does."""
    rng = np.random.default_rng()
    run = tmp_path / "run"
    base = ["--stop-at-return", "475", "--total-steps", "300000", "--checkpoint-every", "4096"]
    first = True
    for _ in range(2):
        cmd = (
            _train_cmd(run, *base)
            if first
            else [sys.executable, "-m", "fastvec", "train", "--resume", str(run), "--no-progress"]
        )
        rows = _metrics_rows(run)
        p = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_child_env(), cwd=str(tmp_path)
        )
        _wait_for(lambda: _metrics_rows(run) > rows + 1 or p.poll() is not None, 120, "progress")
        if first:  # a run killed before its first checkpoint has nothing to resume from
            _wait_for(
                lambda: (run / "checkpoints").is_dir() and os.listdir(run / "checkpoints") or p.poll() is not None,
                120,
                "the first checkpoint",
            )
        if p.poll() is not None:
            break  # solved before the kill
        time.sleep(rng.uniform(0.0, 1.5))
        p.kill()
        p.communicate()
        first = False
    out = subprocess.run(
        [sys.executable, "-m", "fastvec", "train", "--resume", str(run), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
        env=_child_env(),
        cwd=str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["solved"] and res["final_mean_return"] >= 475, res


# ============================================================================ flaky envs
def test_restart_limit_ends_the_run_with_a_checkpoint(tmp_path, capsys):
    """An env that fails all the time ends the run (exit 1, one line) instead of looping,
    and leaves a checkpoint to continue from."""
    gym.register("FastvecTestBrokenCartPole-v0", entry_point=FlakyCartPole, kwargs={"p": 0.02})
    try:
        run = tmp_path / "run"
        code = cli_main(
            "train",
            [
                "FastvecTestBrokenCartPole-v0",
                "--total-steps",
                "50000",
                "--logdir",
                str(run),
                "--no-progress",
                "--no-tensorboard",
                "--set",
                "max_restarts=3",
                "--set",
                "num_workers=2",
            ],
        )
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1
        m = re.match(
            r"fastvec train: error: RestartLimitError: (\d) worker restarts within 50000 env steps "
            r"\(max_restarts=3\); the last: env \d raised RuntimeError: flaky env",
            err[-1],
        )
        assert m and m.group(1) in "45", err[-1]  # 5: two workers failed in the same step
        assert "--resume" in err[-1]
        ck = load_checkpoint(str(run / "checkpoint.pt"))
        assert ck["train_state"]["restarts"] == int(m.group(1))
    finally:
        gym.registry.pop("FastvecTestBrokenCartPole-v0", None)


def test_restart_on_error_false_fails_on_the_first_error(tmp_path, capsys):
    gym.register("FastvecTestBrokenCartPole-v1", entry_point=FlakyCartPole, kwargs={"p": 0.02})
    try:
        code = cli_main(
            "train",
            [
                "FastvecTestBrokenCartPole-v1",
                "--total-steps",
                "50000",
                "--logdir",
                str(tmp_path / "r"),
                "--no-progress",
                "--no-tensorboard",
                "--set",
                "restart_on_error=false",
            ],
        )
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and "WorkerError" in err[-1] and "flaky env" in err[-1], err
        assert os.path.exists(tmp_path / "r" / "checkpoint.pt")
    finally:
        gym.registry.pop("FastvecTestBrokenCartPole-v1", None)


class HangingCartPole(gym.Wrapper):
    """CartPole-v1 whose env 0 (seeded as env 0 of a run with seed 3, ``cartpole_cfg``'s)
    hangs at its ``at``-th step: it sleeps two minutes, far past the test's bound, once per
    process (a replaced worker's envs are not env 0 of a seeded reset, and do not hang)."""

    ENV_0_SEED = env_seeds(3, 0, 1)[0]

    def __init__(self, at: int = 300):
        super().__init__(gym.make("CartPole-v1"))
        self.at, self.n, self.index = at, 0, None

    def reset(self, **kw):
        if kw.get("seed") is not None:  # the first reset: env 0 gets the rule's seed for it
            self.index = 0 if kw["seed"] == self.ENV_0_SEED else None
        return self.env.reset(**kw)

    def step(self, action):
        self.n += 1
        if self.index == 0 and self.n == self.at and not os.environ.get("FASTVEC_TEST_HUNG"):
            os.environ["FASTVEC_TEST_HUNG"] = "1"  # this process only (a forked worker)
            time.sleep(120)
        return self.env.step(action)


@pytest.mark.parametrize("restart", [True, False])
def test_hung_env_is_replaced_after_step_timeout(tmp_path, capsys, restart):
    """An env that stops answering: after ``step_timeout`` its worker is replaced and the
    run goes on (a restart counted), or with ``restart_on_error=false`` the run ends with
    a one-line error naming the wait, after a checkpoint; no process is left behind."""
    gym.register("FastvecTestHangingCartPole-v0", entry_point=HangingCartPole)
    before = {p.pid for p in conftest._live_children()}  # e.g. an earlier test's forkserver
    try:
        t0 = time.monotonic()
        code = cli_main(
            "train",
            [
                "FastvecTestHangingCartPole-v0",
                "--total-steps",
                "4000",
                "--seed",
                "3",
                "--logdir",
                str(tmp_path / "r"),
                "--no-progress",
                "--no-tensorboard",
                "--set",
                "step_timeout=2",
                "--set",
                f"restart_on_error={restart}",
            ],
        )
        took = time.monotonic() - t0
    finally:
        gym.registry.pop("FastvecTestHangingCartPole-v0", None)
    captured = capsys.readouterr()
    assert took < 60, took  # the hung step was not waited out
    if restart:
        assert code == 0, captured.err
        res = json.loads(captured.out.strip().splitlines()[-1])
        assert res["restarts"] == 1 and res["env_steps"] >= 4000, res
    else:
        err = captured.err.strip().splitlines()
        assert code == 1 and "WorkerError" in err[-1] and "did not answer within 2 s" in err[-1], err
        assert os.path.exists(tmp_path / "r" / "checkpoint.pt")
    left = conftest._new_children(before)
    assert left == [], left  # the hung worker was killed, not left sleeping


def test_flaky_env_trains_through_its_failures(tmp_path):
    """1 failure in 2,000 steps, 20k steps: the run completes and counts its restarts
    (in the result, TensorBoard's scalars and the checkpoint). The issue's 200k steps at
    1 in 20,000, learning to 475, is ``benchmarks/bench_resume.py --flaky``."""
    gym.register("FastvecTestFlakierCartPole-v0", entry_point=FlakyCartPole, kwargs={"p": 1 / 2000})
    try:
        cfg = cartpole_cfg(total_steps=20_000, log_every_s=0.05)
        with pytest.warns(RuntimeWarning, match="restarted"):
            res = run_training(
                "FastvecTestFlakierCartPole-v0", cfg, run_dir=str(tmp_path / "run"), progress=False, tensorboard=False
            )
    finally:
        gym.registry.pop("FastvecTestFlakierCartPole-v0", None)
    assert res["env_steps"] >= 20_000 and not res["interrupted"]
    assert 1 <= res["restarts"] <= cfg.max_restarts, res
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert rows[-1]["health/restarts"] == res["restarts"]
    assert load_checkpoint(str(tmp_path / "run" / "checkpoint.pt"))["train_state"]["restarts"] == res["restarts"]


def test_learning_curves_stay_bounded():
    from fastvec.train.algo.statistics import CURVE_POINTS, thin

    pts = []
    for i in range(10 * CURVE_POINTS):
        pts.append((i, float(i)))
        thin(pts)
        assert len(pts) <= CURVE_POINTS
    assert pts[0] == (0, 0.0) and pts[-1] == (10 * CURVE_POINTS - 1, 10.0 * CURVE_POINTS - 1)
    steps = [s for s, _ in pts]
    assert steps == sorted(steps) and len(pts) > CURVE_POINTS // 2
