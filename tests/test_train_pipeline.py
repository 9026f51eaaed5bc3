"""The async pipeline (``pipeline=async``): a learner process beside the collector.

The reference is the lock-step trainer: with ``max_policy_lag=0`` the async run must
end with the same weights, optimiser state and statistics bit for bit (and a pipeline
that hands over the wrong rollout must fail that check). With a lag, the learner must
use the weights that acted (checked against a per-step recomputation), the lag must stay
within its bound, and CartPole must still be learned. Failure: kill -9 of the learner,
the collector or a worker, SIGINT / SIGTERM; each ends with a clear error or a clean
exit, a checkpoint, nothing left behind, and ``--resume`` continues.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import gymnasium as gym
import numpy as np
import psutil
import pytest
import torch
from test_train_resume import _assert_nothing_left, _child_env, _train_cmd, _wait_for, cartpole_cfg

from fastvec.engine import Engine
from fastvec.train import PPO, EngineStorage, LearnerError, PPOConfig, apply_overrides, load_checkpoint
from fastvec.train.commands.cli import main as cli_main
from fastvec.train.commands.cli import run_training
from fastvec.train.config.presets import preset_for
from fastvec.train.config.settings import ConfigError
from fastvec.train.pipelines.collector import Pipeline
from fastvec.train.pipelines.ring import RingSection
from fastvec.train.pipelines.watch import LearnerLink


def _run(tmp_path, name, cfg, **kw):
    run_dir = tmp_path / name
    res = run_training(
        "CartPole-v1" if "env" not in kw else kw.pop("env"),
        cfg,
        run_dir=str(run_dir),
        progress=False,
        tensorboard=False,
        **kw,
    )
    return res, load_checkpoint(str(run_dir / "checkpoint.pt"))


def _pendulum_cfg(**changes) -> PPOConfig:
    cfg = apply_overrides(PPOConfig(), preset_for("Pendulum-v1"))
    base = {"device": "cpu", "torch_threads": 1, "seed": 5, "num_envs": 4, "n_steps": 64, "total_steps": 4096}
    apply_overrides(cfg, {**base, "normalize_obs": True, "normalize_reward": True, **changes})
    return cfg.validate()


def _assert_same_run(a: dict, b: dict, ra: dict, rb: dict) -> None:
    for k, v in a["state_dict"].items():
        assert torch.equal(v, b["state_dict"][k]), k
    oa, ob = a["train_state"]["optimizer"], b["train_state"]["optimizer"]
    assert torch.equal(oa["m"], ob["m"]) and torch.equal(oa["v"], ob["v"]) and oa["t"] == ob["t"]
    for key in ("env_steps", "updates", "grad_steps", "tracker", "reward_scaler", "curve"):
        assert a["train_state"][key] == b["train_state"][key], key
    for key in ("final_mean_return", "episodes", "updates", "env_steps"):
        assert ra[key] == rb[key], key


# ============================================================================ lag 0 = lock-step
@pytest.mark.parametrize(
    "which",
    [
        "cartpole",
        "pendulum_normalised",
        "cartpole_groups",
        "cartpole_two_learner_threads",
        "pendulum_lstm",
        "cartpole_gru",
    ],
)
def test_lag_0_is_the_lockstep_run_bit_for_bit(tmp_path, which):
    if which == "pendulum_normalised":
        make, env = _pendulum_cfg, "Pendulum-v1"
    elif which == "pendulum_lstm":  # recurrent: the states acting records, the critic's carried by the learner

        def make(**c):
            return _pendulum_cfg(policy_core="lstm", core_size=16, bptt=16, **c)

        env = "Pendulum-v1"
    elif which == "cartpole_gru":

        def make(**c):
            return cartpole_cfg(total_steps=6000, stop_at_return=None, policy_core="gru", core_size=16, **c)

        env = "CartPole-v1"
    else:
        extra = {"env_groups": 2, "num_workers": 2} if which == "cartpole_groups" else {}
        if which == "cartpole_two_learner_threads":  # the forked learner becomes a fresh interpreter
            extra = {"learn_threads": 2}

        def make(**c):
            return cartpole_cfg(total_steps=6000, stop_at_return=None, **extra, **c)

        env = "CartPole-v1"
    ra, a = _run(tmp_path, "lock", make(), env=env)
    rb, b = _run(tmp_path, "async", make(pipeline="async", max_policy_lag=0), env=env)
    assert ra["pipeline"] == "lockstep" and rb["pipeline"] == "async"
    _assert_same_run(a, b, ra, rb)
    st = rb["pipeline_stats"]
    assert st["policy_lag_max"] == 0 and st["policy_lag_histogram"] == [rb["updates"] * make().n_steps]


def test_lag_0_check_fails_when_the_wrong_rollout_is_handed_over(tmp_path, monkeypatch):
    """The comparison above can fail: hand the learner the other section of the ring."""
    ra, a = _run(tmp_path, "lock", cartpole_cfg(total_steps=3000, stop_at_return=None))
    real = LearnerLink.send
    K = cartpole_cfg(pipeline="async").rollout_buffers

    def wrong_section(self, msg):
        if msg[0] == "learn" and msg[2] >= 1:
            msg = (msg[0], (msg[1] + 1) % K, *msg[2:])
        return real(self, msg)

    monkeypatch.setattr(LearnerLink, "send", wrong_section)
    rb, b = _run(
        tmp_path, "async", cartpole_cfg(total_steps=3000, stop_at_return=None, pipeline="async", max_policy_lag=0)
    )
    with pytest.raises(AssertionError):
        _assert_same_run(a, b, ra, rb)


@pytest.mark.parametrize("core", ["none", "lstm"])
def test_lag_0_with_the_learners_separate_buffers(tmp_path, monkeypatch, core):
    """A GPU learner's path (its own device buffers, filled from the shared rollout),
    run on the CPU: the same run as lock-step's."""
    ra, a = _run(tmp_path, "lock", _pendulum_cfg(policy_core=core, core_size=16), env="Pendulum-v1")
    monkeypatch.setattr(Pipeline, "learner_separate_buffers", True)
    cfg = _pendulum_cfg(pipeline="async", max_policy_lag=0, policy_core=core, core_size=16)
    rb, b = _run(tmp_path, "async", cfg, env="Pendulum-v1")
    _assert_same_run(a, b, ra, rb)


# ============================================================================ with a lag
@pytest.mark.parametrize("lag,buffers,core", [(1, 2, "none"), (2, 3, "none"), (1, 2, "lstm")])
def test_lag_stays_within_its_bound_and_cartpole_is_learned(tmp_path, lag, buffers, core):
    cfg = cartpole_cfg(
        total_steps=100_000,
        stop_at_return=195.0,
        pipeline="async",
        max_policy_lag=lag,
        rollout_buffers=buffers,
        policy_core=core,
    )
    res, ck = _run(tmp_path, "run", cfg)
    assert res["solved"], res
    st = res["pipeline_stats"]
    hist = st["policy_lag_histogram"]
    assert len(hist) <= lag + 1 and st["policy_lag_max"] <= lag
    assert sum(hist) == res["updates"] * cfg.n_steps  # every step of every rollout learned from
    assert 0.0 <= st["learner_busy_fraction"] <= 1.0 and 0.0 <= st["collector_wait_share"] <= 1.0
    assert ck["train_state"]["updates"] == res["updates"]


def _acted_rollout(cfg, versions_of, weights):
    """A Pendulum rollout (episodes truncated at 20 steps) where step t acted with the
    weights ``weights[versions_of[t]]``: the collector's loop, the weights set between steps."""
    fns = [lambda: gym.make("Pendulum-v1", max_episode_steps=20)] * cfg.num_envs
    eng = Engine(fns, num_workers=1, num_slots=cfg.n_steps + 1, autoreset_mode="same_step")
    sto = EngineStorage(eng)
    ppo = PPO(cfg, sto, torch.device("cpu"))
    for w in weights.values():
        w.copy_(ppo.flat_param.detach() + torch.randn_like(w) * 0.3)

    def take(t):
        with torch.no_grad():
            ppo.flat_param.copy_(weights[int(versions_of[t])])

    sto.reset(cfg.seed)
    ppo.between_steps = take
    ppo.collect()
    ppo.between_steps = None
    return ppo, sto


def test_prepare_uses_the_weights_that_acted(no_leaks):
    """Values, old log-probs and truncation bootstraps under each step's acting weights,
    against a step-by-step recomputation with those weights."""
    cfg = _pendulum_cfg(
        n_steps=48,
        num_envs=3,
        normalize_obs=False,
        normalize_reward=False,
        proximal_policy="acting",
        values_of="acting",
    )
    versions = np.array([0] * 16 + [1] * 20 + [2] * 12)
    ppo0 = PPO(cfg, _dummy_storage(cfg), torch.device("cpu"))
    weights = {v: torch.empty_like(ppo0.flat_param.detach()) for v in range(3)}
    ppo, sto = _acted_rollout(cfg, versions, weights)
    try:
        current = weights[2].clone() + 0.1
        with torch.no_grad():
            ppo.flat_param.copy_(current)
        ppo.prepare((versions, weights))
        assert torch.equal(ppo.flat_param.detach(), current)  # put back
        ro, pol, T = ppo.rollout, ppo.policy, cfg.n_steps
        term, trunc = sto.terminated[1:], sto.truncated[1:]
        assert (trunc & ~term).any()  # the bootstrap is exercised
        with torch.no_grad():
            for t in range(T + 1):
                v = versions[min(t, T - 1)]
                ppo.flat_param.copy_(weights[v])
                params, val = pol.params_and_value(ro.obs[t])
                np.testing.assert_allclose(ro.values_np[t], val.numpy(), rtol=1e-5, atol=1e-6)
                if t < T:
                    lp = pol.dist.log_prob(params, ro.raw[t])
                    np.testing.assert_allclose(ro.logp[t].numpy(), lp.numpy(), rtol=1e-5, atol=1e-5)
                    for n in np.flatnonzero(trunc[t] & ~term[t]):
                        fv = pol.value(torch.from_numpy(sto.final_obs[t + 1][n : n + 1])).item()
                        assert ro.next_values_np[t, n] == pytest.approx(fv, rel=1e-5, abs=1e-6)
                    for n in np.flatnonzero(~trunc[t] & ~term[t]):
                        assert ro.next_values_np[t, n] == ro.values_np[t + 1, n]
            mu = ro.logp.clone()
            ppo.flat_param.copy_(current)
            # decoupled PPO: the old log-probs become the current weights', each sample weighted
            # by min(pi_current / mu, rho_bar)
            ppo.cfg.proximal_policy = "learner"
            ppo.prepare((versions, weights))
            params, _ = pol.params_and_value(ro.batch_obs())
            now = pol.dist.log_prob(params, ro.batch_actions()).view(T, -1)
            np.testing.assert_allclose(ro.logp.numpy(), now.numpy(), rtol=1e-5, atol=1e-5)
            w = (now - mu).exp().clamp(max=cfg.vtrace_rho_bar).reshape(-1)
            np.testing.assert_allclose(ppo.adv_weights.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
            assert (ppo.adv_weights < 1).any()
            # values_of=learner: values and bootstraps of the current weights, log-probs still the acting ones'
            ppo.cfg.proximal_policy, ppo.cfg.values_of = "acting", "learner"
            ppo.prepare((versions, weights))
            np.testing.assert_allclose(ro.logp.numpy(), mu.numpy(), rtol=1e-6, atol=1e-6)
            params, val = pol.params_and_value(ro.obs.reshape(-1, 3))
            np.testing.assert_allclose(ro.values_np, val.view(T + 1, -1).numpy(), rtol=1e-5, atol=1e-6)
            for t, n in zip(*np.nonzero(trunc & ~term), strict=True):
                fv = pol.value(torch.from_numpy(sto.final_obs[t + 1][n : n + 1])).item()
                assert ro.next_values_np[t, n] == pytest.approx(fv, rel=1e-5, abs=1e-6)
    finally:
        sto.close()


def test_prepare_with_the_learners_own_weights_among_the_acting(no_leaks, monkeypatch):
    """values_of=learner where the learner's current version acted the later steps (as in a
    run with a lag): one behaviour pass, for the older weights only; every step's old
    log-prob is still that of the weights that acted, every value the current weights'."""
    cfg = _pendulum_cfg(n_steps=40, num_envs=3, normalize_obs=False, normalize_reward=False, proximal_policy="acting")
    versions = np.array([4] * 14 + [5] * 26)
    ppo0 = PPO(cfg, _dummy_storage(cfg), torch.device("cpu"))
    weights = {v: torch.empty_like(ppo0.flat_param.detach()) for v in (4, 5)}
    ppo, sto = _acted_rollout(cfg, versions, weights)
    try:
        ppo.updates = 5
        with torch.no_grad():
            ppo.flat_param.copy_(weights[5])
        passes = []
        real_pass = ppo.targets.behaviour_pass
        monkeypatch.setattr(
            ppo.targets, "behaviour_pass", lambda ro, rows, boot: passes.append(len(rows)) or real_pass(ro, rows, boot)
        )
        ppo.prepare((versions, weights))
        T = cfg.n_steps
        assert passes == [14, T + 1]  # version 4's steps, then the learner's pass over all
        ro, pol = ppo.rollout, ppo.policy
        with torch.no_grad():
            params, val = pol.params_and_value(ro.obs.reshape(-1, 3))
            np.testing.assert_allclose(ro.values_np, val.view(T + 1, -1).numpy(), rtol=1e-5, atol=1e-6)
            for t in range(T):
                ppo.flat_param.copy_(weights[int(versions[t])])
                lp = pol.dist.log_prob(pol.params_and_value(ro.obs[t])[0], ro.raw[t])
                np.testing.assert_allclose(ro.logp[t].numpy(), lp.numpy(), rtol=1e-5, atol=1e-5)
            assert torch.equal(ppo.flat_param, weights[int(versions[-1])])
        # the current weights' own steps: log-ratio 0, so the samples' weights are 1 there
        ppo.cfg.proximal_policy = "learner"
        with torch.no_grad():
            ppo.flat_param.copy_(weights[5])
        ppo.prepare((versions, weights))
        w = ppo.adv_weights.view(T, -1)
        assert torch.equal(w[14:], torch.ones_like(w[14:])) and (w[:14] < 1).any()
    finally:
        sto.close()


def _dummy_storage(cfg):
    from types import SimpleNamespace

    env = gym.make("Pendulum-v1")
    T, N = cfg.n_steps, cfg.num_envs
    z = np.zeros
    return SimpleNamespace(
        single_observation_space=env.observation_space,
        single_action_space=env.action_space,
        num_envs=N,
        num_workers=1,
        groups=[(0, N)],
        obs=z((T + 1, N, 3), np.float32),
        final_obs=z((T + 1, N, 3), np.float32),
        act=z((T + 1, N, 1), np.float32),
        rewards=z((T + 1, N)),
        terminated=z((T + 1, N), bool),
        truncated=z((T + 1, N), bool),
    )


def test_vtrace_targets_on_policy_are_gaes(no_leaks):
    """Where the current weights acted (log-ratios 0), V-trace's clipped targets are GAE's."""
    cfg = _pendulum_cfg(n_steps=40, num_envs=2, normalize_obs=False, normalize_reward=False)
    versions = np.zeros(40, np.int64)
    ppo0 = PPO(cfg, _dummy_storage(cfg), torch.device("cpu"))
    weights = {0: torch.empty_like(ppo0.flat_param.detach())}
    ppo, sto = _acted_rollout(cfg, versions, weights)
    try:
        with torch.no_grad():
            ppo.flat_param.copy_(weights[0])
        ppo.prepare()
        adv, ret = ppo.rollout.adv_np.copy(), ppo.rollout.ret_np.copy()
        ppo.cfg = apply_overrides(
            PPOConfig(**{**cfg.to_dict(), "hidden": cfg.hidden}), {"pipeline": "async", "targets": "vtrace"}
        )
        ppo.prepare((versions, weights))
        np.testing.assert_allclose(ppo.rollout.adv_np, adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ppo.rollout.ret_np, ret, rtol=1e-5, atol=1e-5)
    finally:
        sto.close()


def test_auto_targets_are_gae_on_policy_and_vtrace_with_a_lag(no_leaks):
    """targets=auto (HalfCheetah's preset): GAE's where the learner's weights acted the
    whole rollout, V-trace's where older weights acted some of it."""
    cfg = _pendulum_cfg(n_steps=40, num_envs=2, normalize_obs=False, normalize_reward=False)
    versions = np.array([0] * 15 + [1] * 25)
    ppo0 = PPO(cfg, _dummy_storage(cfg), torch.device("cpu"))
    weights = {v: torch.empty_like(ppo0.flat_param.detach()) for v in (0, 1)}
    ppo, sto = _acted_rollout(cfg, versions, weights)
    ro = ppo.rollout

    def targets(kind, acted_by):
        ppo.cfg.targets = kind
        with torch.no_grad():
            ppo.flat_param.copy_(weights[1])
        ppo.prepare(acted_by)
        return ro.adv_np.copy(), ro.ret_np.copy()

    try:
        ppo.updates = 1
        auto, vt, ga = (targets(k, (versions, weights)) for k in ("auto", "vtrace", "gae"))
        for a, b in zip(auto, vt, strict=True):
            np.testing.assert_array_equal(a, b)
        assert not np.allclose(auto[0], ga[0])  # the lag is corrected
        on_policy = targets("auto", None), targets("gae", None)
        for a, b in zip(*on_policy, strict=True):
            np.testing.assert_array_equal(a, b)
    finally:
        sto.close()


def test_vtrace_targets_learn_cartpole(tmp_path):
    cfg = cartpole_cfg(total_steps=100_000, stop_at_return=195.0, pipeline="async", targets="vtrace")
    res, _ = _run(tmp_path, "run", cfg)
    assert res["solved"], res


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_async_learner_on_cuda_learns(tmp_path):
    """The learner on the GPU (a fresh interpreter: a fork may not use CUDA), the collector
    acting on the CPU: CartPole is learned and the GPU's busy fraction is reported."""
    cfg = cartpole_cfg(total_steps=100_000, stop_at_return=195.0, pipeline="async", device="cuda")
    res, _ = _run(tmp_path, "run", cfg)
    assert res["solved"] and res["device"] == "cuda"
    assert 0.0 < res["pipeline_stats"]["learner_busy_fraction"] <= 1.0


def test_resumed_async_run_continues(tmp_path):
    cfg = cartpole_cfg(total_steps=3000, stop_at_return=None, pipeline="async")
    res, ck = _run(tmp_path, "run", cfg)
    cfg2 = cartpole_cfg(total_steps=6000, stop_at_return=None, pipeline="async")
    res2 = run_training(config=cfg2, resume=str(tmp_path / "run"), progress=False, tensorboard=False)
    assert res2["resumed"] and res2["env_steps"] >= 6000 and res2["updates"] > res["updates"]


def test_ring_section_maps_its_slots(no_leaks):
    eng = Engine([lambda: gym.make("CartPole-v1")] * 2, num_workers=1, num_slots=3 * 5, autoreset_mode="same_step")
    sto = EngineStorage(eng)
    try:
        sec = RingSection(sto, 2, 4)
        assert sec.obs.shape[0] == 5 and np.shares_memory(sec.obs, sto.obs)
        sec.reset(7)
        np.testing.assert_array_equal(sto.obs[10], sec.obs[0])
        sec.act[1] = 1
        sec.step(1)
        np.testing.assert_array_equal(sto.obs[11], sec.obs[1])
        assert not np.array_equal(sto.obs[11], sto.obs[10])
    finally:
        sto.close()


# ============================================================================ bad input
@pytest.mark.parametrize(
    "changes,match",
    [
        ({"max_policy_lag": -1}, "max_policy_lag must be a non-negative integer"),
        ({"rollout_buffers": 1}, "rollout_buffers must be an integer of at least 2"),
        ({"pipeline": "overlap"}, "pipeline must be one of lockstep, async"),
        ({"targets": "vtrace"}, "targets=vtrace needs pipeline=async"),
        ({"pipeline": "async", "vtrace_rho_bar": 0.0}, "vtrace_rho_bar must be a positive number"),
        ({"pipeline": "async", "proximal_policy": "newest"}, "proximal_policy must be one of acting, learner"),
    ],
)
def test_bad_pipeline_settings(changes, match):
    with pytest.raises(ConfigError, match=match):
        PPOConfig(**changes).validate()


def test_async_refuses_a_vector_env_of_your_own_and_ray_before_starting_anything():
    venv = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    try:
        with pytest.raises(ValueError, match="pipeline=async needs fastvec's engine"):
            run_training(config=cartpole_cfg(pipeline="async"), venv=venv, progress=False, tensorboard=False)
    finally:
        venv.close()
    with pytest.raises(ValueError, match="pipeline=async needs backend='engine'"):
        run_training("CartPole-v1", cartpole_cfg(pipeline="async"), backend="ray", progress=False, tensorboard=False)


@pytest.mark.parametrize(
    "flags,match",
    [
        (["--set", "rollout_buffers=1"], "rollout_buffers must be an integer of at least 2"),
        (["--set", "max_policy_lag=-2"], "max_policy_lag must be a non-negative integer"),
        (["--backend", "ray"], "pipeline=async needs backend='engine'"),
    ],
)
def test_cli_bad_pipeline_input_is_one_line_exit_2(capsys, flags, match):
    code = cli_main("train", ["CartPole-v1", "--no-progress", "--set", "pipeline=async", *flags])
    err = capsys.readouterr().err
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1, err


# ============================================================================ failure
def _cmd(run, *extra):
    """An async CartPole run that only stops when told to, with periodic checkpoints."""
    return _train_cmd(
        run,
        "--total-steps",
        "1e6",
        "--checkpoint-every",
        "2048",
        "--set",
        "stop_at_return=1e9",
        "--set",
        "pipeline=async",
        *extra,
    )


def _start(cmd, run):
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_child_env(), cwd=str(run.parent)
    )
    try:
        _wait_for(
            lambda: os.path.isdir(run / "checkpoints") and os.listdir(run / "checkpoints") or p.poll() is not None,
            120,
            "a checkpoint",
        )
        assert p.poll() is None, p.communicate()
        kids = psutil.Process(p.pid).children(recursive=True)
        maps = {k.pid: _segments_of(k.pid) for k in kids}
        # the learner (a fork, like the workers) is the child that maps both segments
        learner = [k for k in kids if len(maps[k.pid]) == 2]
        workers = [k for k in kids if k not in learner]
        segs = _segments_of(p.pid)
        assert len(learner) == 1 and workers and len(segs) == 2, (learner, workers, segs)
        return p, learner[0], workers, segs
    except BaseException:
        p.kill()
        p.communicate()
        raise


def _segments_of(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as f:
        return {line.split("/dev/shm/")[1].split()[0] for line in f if "/dev/shm/fastvec_" in line}


def _resume(tmp_path, run, steps):
    out = subprocess.run(
        [sys.executable, "-m", "fastvec", "train", "--resume", str(run), "--no-progress", "--total-steps", str(steps)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_child_env(),
        cwd=str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["resumed"] and res["env_steps"] >= steps and res["pipeline"] == "async"


@pytest.mark.slow
def test_kill_9_of_the_learner(tmp_path):
    run = tmp_path / "run"
    p, learner, workers, segs = _start(_cmd(run), run)
    learner.kill()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1, err
    line = err.strip().splitlines()[-1]
    assert "LearnerError: the learner process died (killed by SIGKILL)" in line and "--resume" in line, err
    assert "Traceback" not in err
    ck = load_checkpoint(str(run / "checkpoint.pt"))
    assert ck["train_state"]["env_steps"] > 0
    _assert_nothing_left([w.pid for w in workers], segs)
    _resume(tmp_path, run, ck["train_state"]["env_steps"] + 2000)


@pytest.mark.slow
def test_kill_9_of_the_collector(tmp_path):
    run = tmp_path / "run"
    p, learner, workers, segs = _start(_cmd(run), run)
    assert not (run / "checkpoint.pt").exists()  # only periodic ones so far
    p.kill()
    p.communicate()
    _wait_for(lambda: not learner.is_running() or learner.status() == psutil.STATUS_ZOMBIE, 20, "the learner to exit")
    _assert_nothing_left([w.pid for w in workers] + [learner.pid], segs)
    ck = load_checkpoint(str(run / "checkpoint.pt"))  # the learner's last safe point
    assert ck["train_state"]["env_steps"] > 0
    _resume(tmp_path, run, ck["train_state"]["env_steps"] + 2000)


@pytest.mark.slow
def test_kill_9_of_a_worker_without_restarts(tmp_path):
    run = tmp_path / "run"
    p, learner, workers, segs = _start(_cmd(run, "--set", "restart_on_error=false"), run)
    workers[0].kill()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1, err
    assert "WorkerError" in err and "--resume" in err and "Traceback" not in err, err
    assert load_checkpoint(str(run / "checkpoint.pt"))["train_state"]["env_steps"] > 0
    _assert_nothing_left([w.pid for w in workers] + [learner.pid], segs)


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_both_processes_at_a_safe_point(tmp_path, sig, code):
    run = tmp_path / "run"
    p, learner, workers, segs = _start(_cmd(run), run)
    if sig == signal.SIGINT:  # Ctrl-C reaches the whole process group; here both get it
        learner.send_signal(sig)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    res = json.loads(out.strip().splitlines()[-1])
    assert res["interrupted"] and "Traceback" not in err
    ck = load_checkpoint(str(run / "checkpoint.pt"))
    assert ck["train_state"]["env_steps"] == res["env_steps"] and ck["train_state"]["updates"] == res["updates"]
    _assert_nothing_left([w.pid for w in workers] + [learner.pid], segs)


def test_learner_error_surfaces(tmp_path, monkeypatch):
    """A learner that raises (here: told to learn from a section that does not exist):
    the collector raises LearnerError with its one-line message, nothing left behind."""
    real = LearnerLink.send

    def bad(self, msg):
        if msg[0] == "learn":
            msg = ("learn", 99, *msg[2:])
        return real(self, msg)

    monkeypatch.setattr(LearnerLink, "send", bad)
    with pytest.raises(LearnerError, match="the learner failed: IndexError"):
        _run(tmp_path, "run", cartpole_cfg(pipeline="async", total_steps=3000, stop_at_return=None))
