"""Members: K runs trained at once on one engine (``fastvec train --seeds K --sweep ...``).

The reference is the run alone: member k of a population must compute what
``run_training`` computes with its seed and settings, to the bit (the same code acts and
learns for it, with its own random numbers), whatever the other members do.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest
import torch

import fastvec
from fastvec.train import PPOConfig, apply_overrides, load_checkpoint, preset_for, run_training
from fastvec.train.algo.population import Population
from fastvec.train.commands.members import run_members
from fastvec.train.config.members import member_configs, parse_seeds, parse_sweep
from fastvec.train.config.settings import ConfigError


def _cfg(env_id: str, **over) -> PPOConfig:
    cfg = PPOConfig()
    apply_overrides(cfg, preset_for(env_id))
    apply_overrides(cfg, {"num_envs": 4, "num_workers": 1, "n_steps": 16, "minibatch_size": 32, "n_epochs": 2})
    apply_overrides(cfg, {"checkpoint_every": 0, "total_steps": 4 * 16 * 4, **over})
    return cfg.validate()


def _solo(tmp_path, env_id, cfg, seed, name="solo"):
    c = PPOConfig.from_dict({**cfg.to_dict(), "seed": seed})
    d = str(tmp_path / f"{name}-{seed}")
    run_training(env_id, c, run_dir=d, progress=False, tensorboard=False)
    return load_checkpoint(os.path.join(d, "checkpoint.pt"))


def _assert_same_run(a: dict, b: dict, exact: bool = True) -> None:
    """Weights (with the observation normaliser), Adam's moments and step, the reward
    normaliser, counters and episode statistics: bit for bit, or (``exact=False``: the
    members learned at once, whose batched arithmetic rounds apart) to float tolerance."""

    def same(x, y, what):
        x, y = torch.as_tensor(np.asarray(x, dtype=np.float64)), torch.as_tensor(np.asarray(y, dtype=np.float64))
        assert torch.equal(x, y) if exact else torch.allclose(x, y, rtol=1e-4, atol=1e-6), what

    assert a["state_dict"].keys() == b["state_dict"].keys()
    for k in a["state_dict"]:
        same(a["state_dict"][k], b["state_dict"][k], k)
    sa, sb = a["train_state"], b["train_state"]
    for k in ("m", "v"):
        same(sa["optimizer"][k], sb["optimizer"][k], k)
    assert sa["optimizer"]["t"] == sb["optimizer"]["t"] > 0
    for k in ("env_steps", "updates", "grad_steps", "learn_samples", "env_seeding"):
        assert sa[k] == sb[k], k
    ta, tb = sa["tracker"], sb["tracker"]
    assert ta["episodes"] == tb["episodes"] and ta["recent_lengths"] == tb["recent_lengths"]
    same(ta["recent_returns"], tb["recent_returns"], "returns")
    same([r for _, r in sa["curve"]], [r for _, r in sb["curve"]], "curve")
    if sa["reward_scaler"] is not None:
        for k, v in sa["reward_scaler"].items():
            same(v, sb["reward_scaler"][k], f"reward_scaler {k}")
    assert torch.equal(sa["rng"]["torch"], sb["rng"]["torch"])


@pytest.mark.parametrize(
    "env_id,over",
    [
        ("CartPole-v1", {}),
        ("CartPole-v1", {"learner": "torch"}),
        ("Pendulum-v1", {"normalize_obs": True, "normalize_reward": True, "target_kl": 0.01, "total_steps": 1024}),
    ],
)
def test_a_member_is_its_run_alone(tmp_path, env_id, over):
    cfg = _cfg(env_id, **over)
    pop = run_members(env_id, cfg, seeds=[3, 7], run_dir=str(tmp_path / "pop"), progress=False, tensorboard=False)
    assert pop["labels"] == ["seed-3", "seed-7"]
    at_once = over.get("learner") != "torch"  # (autograd's members learn one by one, as alone)
    assert pop["learned_at_once"] is at_once and pop["acted_at_once"] is at_once
    for seed in (3, 7):
        member = load_checkpoint(str(tmp_path / "pop" / f"seed-{seed}" / "checkpoint.pt"))
        solo = _solo(tmp_path, env_id, cfg, seed)
        assert member["train_state"]["tracker"]["episodes"] > 0
        _assert_same_run(member, solo, exact=not at_once)


def test_a_member_of_a_dict_observation_population_is_its_run_alone(tmp_path):
    # GoalRing's Dict observation (a Box and two Discretes): each member's rows of every
    # leaf, and its own normaliser of the Box leaf; its members learn one by one (autograd),
    # so bit for bit
    env_id = "envs:FvGoalRing-v0"
    cfg = _cfg(env_id, normalize_obs=True)
    pop = run_members(env_id, cfg, seeds=[3, 7], run_dir=str(tmp_path / "pop"), progress=False, tensorboard=False)
    assert pop["learned_at_once"] is False
    for seed in (3, 7):
        member = load_checkpoint(str(tmp_path / "pop" / f"seed-{seed}" / "checkpoint.pt"))
        assert "extractor.norms.2.mean" in member["state_dict"]  # pos, the Dict's last key
        assert member["train_state"]["tracker"]["episodes"] > 0
        _assert_same_run(member, _solo(tmp_path, env_id, cfg, seed))
    assert pop["labels"] == ["seed-3", "seed-7"]


def test_a_sweep_member_is_its_run_alone_with_its_setting(tmp_path):
    cfg = _cfg("CartPole-v1")
    d = tmp_path / "pop"
    pop = run_members(
        "CartPole-v1", cfg, seeds=[1, 2], sweep={"lr": [1e-3, 5e-3]}, run_dir=str(d), progress=False, tensorboard=False
    )
    assert pop["labels"] == ["lr=0.001,seed-1", "lr=0.001,seed-2", "lr=0.005,seed-1", "lr=0.005,seed-2"]
    assert set(pop["aggregate"]) == {"lr=0.001", "lr=0.005"}
    for name, g in pop["aggregate"].items():
        assert g["n"] == 2
        low, high = min(g["scores"]), max(g["scores"])
        assert low <= g["mean"][0] <= high and g["mean"][1] <= g["mean"][0] <= g["mean"][2], name
    assert 0.0 <= pop["improvement"]["lr=0.001"]["lr=0.005"][0] <= 1.0
    assert os.path.isfile(d / "report.md") and os.path.isfile(d / "report.png")
    solo = _solo(tmp_path, "CartPole-v1", PPOConfig.from_dict({**cfg.to_dict(), "lr": 5e-3}), 2)
    _assert_same_run(load_checkpoint(str(d / "lr=0.005,seed-2" / "checkpoint.pt")), solo, exact=False)


def test_garbage_in_one_members_rows_leaves_the_others_bit_for_bit(tmp_path, monkeypatch):
    cfg = _cfg("Pendulum-v1", normalize_obs=True, normalize_reward=True, total_steps=1024)
    run_members("Pendulum-v1", cfg, seeds=[1, 2], run_dir=str(tmp_path / "clean"), progress=False, tensorboard=False)
    collect = Population.collect

    def spoil_member_1(self, members):
        collect(self, members)
        rows = self.envs.rows[1]
        for a in (rows.obs, rows.final_obs, rows.rewards, rows.act):
            a[...] = np.nan if a.dtype.kind == "f" else 7
        rows.terminated[...] = True

    monkeypatch.setattr(Population, "collect", spoil_member_1)
    run_members("Pendulum-v1", cfg, seeds=[1, 2], run_dir=str(tmp_path / "spoilt"), progress=False, tensorboard=False)
    clean = load_checkpoint(str(tmp_path / "clean" / "seed-1" / "checkpoint.pt"))
    spoilt = load_checkpoint(str(tmp_path / "spoilt" / "seed-1" / "checkpoint.pt"))
    _assert_same_run(spoilt, clean)
    hurt = load_checkpoint(str(tmp_path / "spoilt" / "seed-2" / "checkpoint.pt"))
    unhurt = load_checkpoint(str(tmp_path / "clean" / "seed-2" / "checkpoint.pt"))
    assert not torch.equal(hurt["state_dict"]["obs_norm.mean"], unhurt["state_dict"]["obs_norm.mean"])


def test_a_resumed_population_continues_each_member_as_its_run_alone_resumes(tmp_path):
    cfg = _cfg("CartPole-v1")
    d = str(tmp_path / "pop")
    run_members("CartPole-v1", cfg, seeds=[4, 5], run_dir=d, progress=False, tensorboard=False)

    def longer(c):
        c.total_steps = 2 * cfg.total_steps

    pop = run_members(run_dir=d, resume=True, changes=longer, progress=False, tensorboard=False)
    assert [r["env_steps"] for r in pop["results"]] == [2 * cfg.total_steps] * 2
    assert all(r["resumed"] for r in pop["results"])
    for seed in (4, 5):
        solo_dir = str(tmp_path / f"solo-{seed}")
        _solo(tmp_path, "CartPole-v1", cfg, seed)
        longer_cfg = PPOConfig.from_dict({**cfg.to_dict(), "seed": seed, "total_steps": 2 * cfg.total_steps})
        run_training(None, longer_cfg, run_dir=solo_dir, resume=solo_dir, progress=False, tensorboard=False)
        member = load_checkpoint(os.path.join(d, f"seed-{seed}", "checkpoint.pt"))
        _assert_same_run(member, load_checkpoint(os.path.join(solo_dir, "checkpoint.pt")), exact=False)


def test_a_solved_member_stops_and_the_others_go_on(tmp_path):
    cfg = _cfg("CartPole-v1", stop_at_return=30.0, total_steps=20_000)
    pop = run_members(
        "CartPole-v1", cfg, seeds=[1, 2, 3], run_dir=str(tmp_path / "p"), progress=False, tensorboard=False
    )
    assert pop["acted_at_once"] and pop["learned_at_once"]
    for seed, r in zip((1, 2, 3), pop["results"]):
        assert r["solved"] and r["final_mean_return"] >= 30.0
        solo = _solo(tmp_path, "CartPole-v1", cfg, seed)
        assert r["env_steps"] == solo["env_steps"] < 20_000  # stopped where its run alone stops
        # acting at once past the others' ends (their envs paused), as the run alone acts:
        # the same episodes (the weights drift apart by rounding over hundreds of updates)
        member = load_checkpoint(str(tmp_path / "p" / f"seed-{seed}" / "checkpoint.pt"))
        ta, tb = member["train_state"]["tracker"], solo["train_state"]["tracker"]
        assert ta["episodes"] == tb["episodes"] and ta["recent_returns"] == tb["recent_returns"]
    assert len({r["env_steps"] for r in pop["results"]}) > 1  # (the members stopped apart)


# ------------------------------------------------------------------ bad input
def test_seeds_and_sweeps_parse_and_refuse_in_one_line():
    assert parse_seeds("3", 10) == [10, 11, 12]
    assert parse_seeds("5,1,9", 0) == [5, 1, 9]
    assert parse_seeds([4], 0) == [4]
    for bad in ("0", "-2", "a", "1,1", "1,-1", ","):
        with pytest.raises(ConfigError, match="--seeds"):
            parse_seeds(bad, 0)
    assert parse_sweep(["lr=1e-4,3e-4", "clip_coef=0.1,0.2"]) == {"lr": [1e-4, 3e-4], "clip_coef": [0.1, 0.2]}
    for bad, match in (
        (["nope=1,2"], "unknown config key 'nope'"),
        (["lr=fast,1"], "bad value for lr"),
        (["num_envs=4,8"], "num_envs shapes what the members share"),
        (["hidden=64,32"], "hidden shapes"),
        (["seed=1,2"], "--seeds"),
        (["lr=1e-3,1e-3"], "repeats a value"),
        (["lr=1e-3", "lr=2e-3"], "twice"),
        (["lr"], "KEY=V1,V2"),
    ):
        with pytest.raises(ConfigError, match=match):
            parse_sweep(bad)
    members = member_configs(PPOConfig(), [1, 2], {"gamma": [0.9, 0.99], "ent_coef": [0.0, 0.01]})
    assert len(members) == 8 and members[0].label == "gamma=0.9,ent_coef=0,seed-1"
    assert [(m.cfg.gamma, m.cfg.ent_coef, m.cfg.seed) for m in members[:3]] == [
        (0.9, 0.0, 1),
        (0.9, 0.0, 2),
        (0.9, 0.01, 1),
    ]
    with pytest.raises(ConfigError, match="--sweep setting"):
        member_configs(PPOConfig(), [1], {"gamma": [0.9, 1.5]})


def _cli(args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "fastvec", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(fastvec.__file__))},
        timeout=120,
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["--seeds", "0"], "--seeds must be a member count >= 1"),
        (["--seeds", "two"], "--seeds must be a member count like 8"),
        (["--sweep", "lr=1e-3,x"], "bad value for lr"),
        (["--sweep", "nope=1,2"], "unknown config key"),
        (["--sweep", "n_steps=16,32"], "n_steps shapes"),
        (["--seeds", "2", "--set", "pipeline=async"], "members cannot train with pipeline=async"),
        (["--seeds", "2", "--nproc", "2"], "members cannot train with --nproc 2"),
        (["--seeds", "2", "--set", "policy_core=lstm"], "members cannot train with a recurrent core"),
        (["--seeds", "2", "--mix", "count=4", "--mix", "count=4"], "members cannot train with --mix"),
        (["--seeds", "2", "--backend", "ray"], "members cannot train with --backend ray"),
        (["--seeds", "2", "--video-every", "2048"], "members cannot train with --video-every 2048"),
    ],
)
def test_the_command_refuses_what_members_do_not_do_in_one_line(tmp_path, args, message):
    p = _cli(["train", "CartPole-v1", "--no-progress", "--logdir", str(tmp_path / "p"), *args], tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastvec train: error:") and message in lines[0], p.stderr
    assert not os.path.exists(tmp_path / "p")  # refused before anything started


def test_the_command_trains_members_and_eval_takes_one(tmp_path):
    d = tmp_path / "pop"
    p = _cli(
        ["train", "CartPole-v1", "--seeds", "2", "--num-envs", "4", "--total-steps", "1024", "--no-progress"]
        + ["--no-tensorboard", "--logdir", str(d)],
        tmp_path,
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["members"] == 2 and out["labels"] == ["seed-0", "seed-1"]
    assert [r["env_steps"] for r in out["results"]] == [1024, 1024]
    with open(d / "result.json") as f:
        assert json.load(f)["labels"] == out["labels"]
    again = _cli(["train", "CartPole-v1", "--seeds", "2", "--logdir", str(d)], tmp_path)
    assert again.returncode == 2 and "holds a population already" in again.stderr
    for member in ("1", "seed-1"):
        ev = _cli(["eval", str(d), "--member", member, "--episodes", "2"], tmp_path)
        assert ev.returncode == 0, ev.stderr
        solo = _cli(["eval", str(d / "seed-1"), "--episodes", "2"], tmp_path)
        one = json.loads(ev.stdout.strip().splitlines()[-1])
        assert one.pop("member") == "seed-1"
        alone = json.loads(solo.stdout.strip().splitlines()[-1])
        assert one.pop("wall_seconds") > 0 and alone.pop("wall_seconds") > 0
        assert one == alone
    best = max(out["results"], key=lambda r: r["final_mean_return"])
    ev = _cli(["eval", str(d), "--member", "best", "--episodes", "2"], tmp_path)
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout.strip().splitlines()[-1])["member"] == os.path.basename(best["run_dir"])
    bad = _cli(["eval", str(d), "--member", "7"], tmp_path)
    assert bad.returncode == 2 and "member 7" in bad.stderr
    # each member's model card names its run alone, whose config is the member's
    card = (d / "seed-1" / "README.md").read_text()
    alone = next(x for x in card.splitlines() if x.startswith("# member seed-1 alone: fastvec train "))
    argv = shlex.split(alone.split(": ", 1)[1])[1:]
    listed = _cli([*argv, "--list-keys"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == load_checkpoint(str(d / "seed-1"))["config"]


def _wait_for(path_glob: str, count: int, proc, timeout: float = 120) -> None:
    import glob
    import time

    t0 = time.time()
    while len(glob.glob(path_glob)) < count:
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() - t0 < timeout, f"no {path_glob} after {timeout} s"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "kill -9"])
def test_a_stopped_or_killed_population_resumes_every_member(tmp_path, how):
    import glob
    import signal

    d = tmp_path / "pop"
    cmd = [sys.executable, "-m", "fastvec", "train", "CartPole-v1", "--seeds", "2", "--num-envs", "4"]
    cmd += [
        "--total-steps",
        "1e7",
        "--checkpoint-every",
        "2048",
        "--no-progress",
        "--no-tensorboard",
        "--logdir",
        str(d),
    ]
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(fastvec.__file__))}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(str(d / "seed-*" / "checkpoints" / "step-*.pt"), 4, proc)
        proc.send_signal(signal.SIGINT if how == "ctrl-c" else signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    if how == "ctrl-c":
        assert proc.returncode == 130, err
        line = json.loads(out.strip().splitlines()[-1])
        assert line["interrupted"] and all(r["interrupted"] for r in line["results"])
        kept = [r["env_steps"] for r in line["results"]]
    else:
        assert proc.returncode == -signal.SIGKILL
        kept = [
            max(int(os.path.basename(p)[5:-3]) for p in glob.glob(str(d / f"seed-{s}" / "checkpoints" / "step-*.pt")))
            for s in (0, 1)
        ]
    assert min(kept) >= 2048
    p = _cli(["train", "--resume", str(d), "--total-steps", str(max(kept) + 1024), "--no-progress"], tmp_path)
    assert p.returncode == 0, p.stderr
    line = json.loads(p.stdout.strip().splitlines()[-1])
    for r in line["results"]:
        assert r["resumed"] and r["env_steps"] == max(kept) + 1024  # (4 envs x 32 steps: whole rollouts)
        with open(os.path.join(r["run_dir"], "metrics.jsonl")) as f:
            steps = [json.loads(x)["env_steps"] for x in f]
        assert steps == sorted(steps) and len(set(steps)) == len(steps)  # continued, no step twice


# ------------------------------------------------------------------ population-based training
def test_pbt_copies_the_top_into_the_bottom_and_perturbs_within_bounds(tmp_path, monkeypatch):
    from fastvec.train.config.members import PBT_KEYS
    from fastvec.train.run.pbt import Pbt

    checked = []
    exploit = Pbt.exploit

    def checking(self, runs):
        row = exploit(self, runs)
        by_label = {self.labels[k]: run for k, run in runs.items()}
        for e in row["events"]:
            dst, src = by_label[e["member"]].ppo, by_label[e["from"]].ppo
            for k, v in dst.policy.state_dict().items():
                assert torch.equal(v, src.policy.state_dict()[k]), k  # the weights and normaliser: the source's
            assert torch.equal(dst.opt.m, src.opt.m) and dst.opt.t == src.opt.t
            for key, (low, high) in PBT_KEYS.items():
                was, now = getattr(src.cfg, key), getattr(dst.cfg, key)
                assert now == e["after"][key] and low <= now <= high
                if key == "gae_lambda":
                    want = [min(max(1 - (1 - was) * f, low), high) for f in (0.8, 1.2)]
                else:
                    want = [min(max(was * f, low), high) for f in (0.8, 1.2)]
                assert any(abs(now - w) < 1e-12 for w in want), (key, was, now)
            ranked = list(row["returns"])  # (worst first)
            means = [row["returns"][label] for label in ranked]
            assert means == sorted(means)
            q = len(ranked) // 4
            assert ranked.index(e["member"]) < q and ranked.index(e["from"]) >= len(ranked) - q
        checked.append(row)
        return row

    monkeypatch.setattr(Pbt, "exploit", checking)
    cfg = _cfg("CartPole-v1", total_steps=4 * 16 * 12)
    d = tmp_path / "pbt"
    run_members("CartPole-v1", cfg, seeds=4, pbt_every=4 * 16 * 3, run_dir=str(d), progress=False, tensorboard=False)
    assert len(checked) == 3 and all(len(r["events"]) == 1 for r in checked)  # steps 192, 384, 576: 4 // 4 copies
    with open(d / "pbt.jsonl") as f:
        rows = [json.loads(x) for x in f]
    assert [r["env_steps"] for r in rows] == [192, 384, 576]
    e = rows[-1]["events"][0]
    member = load_checkpoint(str(d / e["member"] / "checkpoint.pt"))
    assert member["config"]["lr"] == pytest.approx(e["after"]["lr"])  # its checkpoint keeps its settings


def test_a_resumed_pbt_population_continues_its_lineage(tmp_path):
    cfg = _cfg("CartPole-v1", total_steps=4 * 16 * 6)
    d = str(tmp_path / "pbt")
    run_members("CartPole-v1", cfg, seeds=4, pbt_every=4 * 16 * 2, run_dir=d, progress=False, tensorboard=False)

    def longer(c):
        c.total_steps = 4 * 16 * 12

    run_members(run_dir=d, resume=True, changes=longer, progress=False, tensorboard=False)
    with open(os.path.join(d, "pbt.jsonl")) as f:
        rows = [json.loads(x) for x in f]
    assert [r["env_steps"] for r in rows] == [128, 256, 384, 512, 640]
    # every perturbation replayed from the population's generator, across the resume
    from fastvec.train.config.members import perturbed

    rng = np.random.default_rng(cfg.seed)
    for row in rows:
        for e in row["events"]:
            rng.integers(1)  # (the source drawn from the top quarter: one of 4 members)
            assert perturbed(e["source"], rng) == e["after"]
        assert rng.bit_generator.state == row["rng_after"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--seeds", "3", "--pbt"], "--pbt needs 4 members or more"),
        (["--seeds", "4", "--pbt", "--pbt-every", "0"], "--pbt-every must be a positive integer"),
        (["--seeds", "4", "--pbt-every", "100"], "--pbt-every needs --pbt"),
    ],
)
def test_pbt_refuses_bad_input_in_one_line(tmp_path, args, message):
    p = _cli(["train", "CartPole-v1", "--no-progress", "--logdir", str(tmp_path / "p"), *args], tmp_path)
    assert p.returncode == 2 and message in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_failing_env_saves_every_member_and_the_population_resumes(tmp_path):
    import glob

    import psutil

    from fastvec.errors import WorkerError

    cfg = PPOConfig()
    apply_overrides(cfg, {"num_envs": 4, "num_workers": 1, "n_steps": 16, "minibatch_size": 32, "n_epochs": 2})
    apply_overrides(cfg, {"checkpoint_every": 0, "total_steps": 4096, "restart_on_error": False})
    d = str(tmp_path / "pop")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    shm_before = sorted(glob.glob("/dev/shm/fastvec_*"))
    with pytest.raises(WorkerError) as failed:  # each env raises at its step 101: in the 7th rollout
        run_members(
            "envs:FailingEnv",
            cfg,
            seeds=2,
            env_kwargs={"fail_after": 100},
            run_dir=d,
            progress=False,
            tensorboard=False,
        )
    assert failed.value.resume_from == d  # the population resumes as one
    left = [
        p.cmdline()
        for p in psutil.Process().children(recursive=True)
        if p.pid not in before and "resource_tracker" not in " ".join(p.cmdline())  # (Python's own, for life)
    ]
    assert left == []  # no worker left behind
    assert sorted(glob.glob("/dev/shm/fastvec_*")) == shm_before  # nor the engine's segment
    for label in ("seed-0", "seed-1"):
        assert load_checkpoint(os.path.join(d, label, "checkpoint.pt"))["env_steps"] == 6 * 64  # its last whole rollout

    def one_more_rollout(c):
        c.total_steps = 7 * 64

    pop = run_members(run_dir=d, resume=True, changes=one_more_rollout, progress=False, tensorboard=False)
    assert [r["env_steps"] for r in pop["results"]] == [7 * 64, 7 * 64] and all(r["resumed"] for r in pop["results"])


def test_paused_envs_keep_their_state_and_cost_their_worker_no_step():
    """``Engine.pause``: against single envs stepped only while not paused, same seeds
    and actions: a paused env's rows read a reward of 0 and no end, its state (mid-episode)
    waits, and once resumed it goes on where it stopped; the others never notice."""
    import gymnasium as gym

    from fastvec.train import env_factory
    from fastvec.train.storage.sources import EngineStorage

    n, seeds = 4, [5, 6, 7, 8]
    engine = fastvec.Engine([env_factory("CartPole-v1")] * n, num_workers=2, num_slots=2, autoreset_mode="same_step")
    storage = EngineStorage(engine)
    singles = [gym.make("CartPole-v1") for _ in range(n)]
    try:
        storage.reset(seeds)
        want = [e.reset(seed=s)[0] for e, s in zip(singles, seeds)]
        np.testing.assert_array_equal(storage.obs[0], np.stack(want))
        rng = np.random.default_rng(0)
        for t in range(60):
            paused = {1, 2} if 10 <= t < 30 else {3} if 30 <= t < 40 else set()
            engine.pause([i for i in range(n) if i in paused])
            engine.pause([i for i in range(n) if i not in paused], paused=False)
            act = rng.integers(0, 2, n)
            storage.act[1][...] = act
            storage.step(1)
            for i, e in enumerate(singles):
                if i in paused:
                    assert storage.rewards[1, i] == 0 and not storage.terminated[1, i] and not storage.truncated[1, i]
                    assert engine.placement_report().env_us is not None
                    continue
                obs, r, term, trunc, _ = e.step(int(act[i]))
                if term or trunc:
                    obs, _ = e.reset()
                np.testing.assert_array_equal(storage.obs[1, i], obs)
                assert storage.rewards[1, i] == r and storage.terminated[1, i] == term
        with pytest.raises(ValueError, match="pause: env 4 is not one of the 4 envs"):
            engine.pause([4])
        with pytest.raises(ValueError, match="pause takes a sequence of env indices"):
            engine.pause([[0, 1]])
    finally:
        storage.close()
