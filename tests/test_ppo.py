"""Tests for the PPO trainer: policies, GAE wiring, zero copy, learning, CLI, eval, CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastvec.engine import Engine
from fastvec.options import available_cores
from fastvec.train import PPO, ConfigError, EngineStorage, PPOConfig, apply_overrides, load_checkpoint
from fastvec.train.algo.checkpoints import policy_from_checkpoint
from fastvec.train.commands.cli import main as cli_main
from fastvec.train.commands.cli import run_training as train
from fastvec.train.config.presets import PRESETS, env_factory, preset_for
from fastvec.train.model.actor_critic import make_policy
from fastvec.train.model.distributions import CategoricalDist, GaussianDist

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def engine_storage(env_fns, num_slots, num_workers):
    """The trainer's zero-copy storage over a forked engine, as ``fastvec train`` builds it."""
    return EngineStorage(
        Engine(env_fns, num_workers=num_workers, num_slots=num_slots, autoreset_mode="same_step", context="fork")
    )


# =============================================================================== policies
def _act(policy, obs_np, act_shape, act_dtype=torch.int64, deterministic=False):
    obs = torch.as_tensor(obs_np)
    n = obs.shape[0]
    out = torch.zeros((n, *act_shape), dtype=act_dtype)
    noise = policy.dist.sample_noise(torch.empty(policy.dist.noise_shape(n)))
    raw = torch.empty(n, policy.dist.dim) if isinstance(policy.dist, GaussianDist) else None
    with torch.inference_mode():
        policy.act_(obs, noise, out, raw, deterministic=deterministic)
    return out, raw


def test_policy_vector_obs_discrete_actions():
    pol = make_policy(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2))
    assert pol.kind == "mlp" and not pol.values_at_act
    assert isinstance(pol.dist, CategoricalDist) and pol.dist.k == 1
    out, _ = _act(pol, np.random.randn(16, 4).astype(np.float32), ())
    assert out.shape == (16,) and set(out.tolist()) <= {0, 1}
    logp, ent, v = pol.evaluate(torch.randn(16, 4), out)
    assert logp.shape == ent.shape == v.shape == (16,)
    assert torch.all(logp <= 0) and torch.all(ent > 0)


def test_policy_multidiscrete_masks_missing_choices():
    space = spaces.MultiDiscrete([3, 5, 2])
    pol = make_policy(spaces.Box(-1, 1, (3,), np.float32), space)
    d = pol.dist
    assert isinstance(d, CategoricalDist) and (d.k, d.max_n) == (3, 5)
    out, _ = _act(pol, np.random.randn(500, 3).astype(np.float32), (3,))
    a = out.numpy()
    assert (a >= 0).all() and (a < np.array([3, 5, 2])).all()
    assert len(np.unique(a[:, 1])) == 5
    logp, ent, _ = pol.evaluate(torch.randn(500, 3), out)
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all()
    # entropy of the uniform policy at init (head gain 0.01) ~ log 3 + log 5 + log 2
    assert abs(float(ent.detach().mean()) - np.log(30)) < 0.05


def test_policy_discrete_start_and_multibinary():
    pol = make_policy(spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(3, start=-1))
    out, _ = _act(pol, np.random.randn(300, 2).astype(np.float32), ())
    assert set(out.tolist()) == {-1, 0, 1}
    logp = pol.log_prob(torch.randn(300, 2), out)
    assert torch.isfinite(logp).all()
    pol = make_policy(spaces.Box(-1, 1, (2,), np.float32), spaces.MultiBinary(4))
    out, _ = _act(pol, np.random.randn(100, 2).astype(np.float32), (4,), torch.int8)
    assert set(np.unique(out.numpy()).tolist()) == {0, 1}


def test_policy_box_actions_gaussian_clipped():
    space = spaces.Box(-0.5, 0.5, (3,), np.float32)
    pol = make_policy(spaces.Box(-np.inf, np.inf, (5,), np.float64), space, log_std_init=1.0)
    assert isinstance(pol.dist, GaussianDist)
    out, raw = _act(pol, np.random.randn(64, 5), (3,), torch.float32)
    assert out.abs().max() <= 0.5 + 1e-6
    assert raw.abs().max() > 0.5  # std e^1: the raw sample leaves the box, the env gets it clipped
    assert torch.equal(out, raw.clamp(-0.5, 0.5))
    logp, ent, _ = pol.evaluate(torch.randn(64, 5, dtype=torch.float64), raw)
    ref = torch.distributions.Normal(pol.actor_params(torch.randn(64, 5, dtype=torch.float64)), 1.0)
    assert logp.shape == (64,) and ent.shape == (64,)
    assert torch.allclose(ent, torch.full((64,), float(ref.entropy()[0].sum() + 3.0)), atol=1e-5)


@pytest.mark.parametrize(
    "act_space, norm, activation",
    [
        (spaces.Box(-0.5, 0.5, (3,), np.float32), True, "tanh"),
        (spaces.Box(-np.inf, np.inf, (2,), np.float32), False, "relu"),
        (spaces.Discrete(4), True, "tanh"),
        (spaces.Discrete(3), False, "relu"),
    ],
)
def test_numpy_acting_matches_torch(act_space, norm, activation):
    """Small MLPs act in numpy on the CPU (``ActingPath.numpy``): the same actions as
    the torch forward (up to float rounding), before and after the parameters and the
    observation normaliser change in place, and after ``flatten_parameters``."""
    from fastvec.train.algo.optim import flatten_parameters

    torch.manual_seed(0)
    obs_space = spaces.Box(-np.inf, np.inf, (7,), np.float64)
    pol = make_policy(obs_space, act_space, activation=activation, normalize_obs=norm, log_std_init=0.5)
    gaussian = isinstance(pol.dist, GaussianDist)
    shape, dtype = (act_space.shape, torch.float32) if gaussian else ((), torch.int64)

    def both(obs):
        noise = pol.dist.sample_noise(torch.empty(pol.dist.noise_shape(len(obs))))
        got, want = torch.empty((len(obs), *shape), dtype=dtype), torch.empty((len(obs), *shape), dtype=dtype)
        raw_got = torch.empty(len(obs), pol.dist.dim) if gaussian else None
        raw_want = torch.empty(len(obs), pol.dist.dim) if gaussian else None
        with torch.inference_mode():
            pol.act_(obs, noise, got, raw_got)
            pol.dist.act_(pol.actor_params(obs), noise, want, raw_want)
        return got, want, raw_got, raw_want

    for step in range(3):
        obs = torch.randn(6, 7, dtype=torch.float64) * 3
        assert pol.acting_path().numpy is not None, "the numpy path applies to this policy"
        got, want, raw_got, raw_want = both(obs)
        if gaussian:
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(raw_got.numpy(), raw_want.numpy(), rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(got, want)
        with torch.no_grad():  # what an update and a normaliser update do: in place
            for p in pol.parameters():
                p.add_(torch.randn_like(p) * 0.3)
        if norm:
            pol.update_obs_norm(torch.randn(50, 7, dtype=torch.float64) * 2 + 1)
        if step == 0:
            flatten_parameters(pol)  # the parameters move into one flat tensor: views made again


def test_gaussian_log_prob_matches_torch_distributions():
    pol = make_policy(spaces.Box(-1, 1, (4,), np.float32), spaces.Box(-1, 1, (2,), np.float32), log_std_init=-0.3)
    obs = torch.randn(10, 4)
    raw = torch.randn(10, 2)
    mean = pol.actor_params(obs)
    ref = torch.distributions.Normal(mean, pol.dist.log_std.exp()).log_prob(raw).sum(-1)
    assert torch.allclose(pol.log_prob(obs, raw), ref, atol=1e-5)


def test_policy_images_get_the_nature_cnn():
    pol = make_policy(spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6))
    assert pol.kind == "cnn" and pol.values_at_act
    obs = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    logp_out, v_out = torch.empty(3), torch.empty(3)
    act = torch.empty(3, dtype=torch.int64)
    noise = pol.dist.sample_noise(torch.empty(pol.dist.noise_shape(3)))
    with torch.inference_mode():
        pol.act_(obs, noise, act, None, logp_out, v_out)
    logp, _, v = pol.evaluate(obs, act)
    assert torch.allclose(logp, logp_out, atol=1e-5) and torch.allclose(v, v_out, atol=1e-5)
    hwc = make_policy(spaces.Box(0, 255, (84, 84, 3), np.uint8), spaces.Discrete(4))
    assert hwc.kind == "cnn" and hwc.hwc
    assert hwc.value(torch.zeros(2, 84, 84, 3, dtype=torch.uint8)).shape == (2,)
    # small uint8 boxes are not images
    assert make_policy(spaces.Box(0, 255, (4, 8, 8), np.uint8), spaces.Discrete(2)).kind == "mlp"


def test_policy_discrete_obs_one_hot_and_unsupported_spaces():
    pol = make_policy(spaces.Discrete(5), spaces.Discrete(2))
    assert pol.value(torch.tensor([0, 4, 2])).shape == (3,)
    with pytest.raises(ValueError, match="Dict"):
        make_policy(spaces.Dict({"a": spaces.Box(-1, 1, (2,))}), spaces.Discrete(2))
    with pytest.raises(ValueError, match="Text|support"):
        make_policy(spaces.Box(-1, 1, (2,)), spaces.Text(5))


# =============================================================================== config
def test_overrides_parse_types_and_reject_bad_input():
    cfg = apply_overrides(
        PPOConfig(),
        [
            "lr=1e-3",
            "n_steps=64",
            "hidden=32,16",
            "anneal_lr=false",
            "target_kl=none",
            "clip_vf=0.2",
            "num_workers=none",
            "total_steps=1e5",
        ],
    )
    assert cfg.lr == 1e-3 and cfg.n_steps == 64 and cfg.hidden == (32, 16) and cfg.anneal_lr is False
    assert cfg.target_kl is None and cfg.clip_vf == 0.2 and cfg.num_workers is None and cfg.total_steps == 100000
    with pytest.raises(ConfigError, match="unknown --set key 'learning_rate'"):
        apply_overrides(PPOConfig(), ["learning_rate=1"])
    with pytest.raises(ConfigError, match="bad value for n_steps"):
        apply_overrides(PPOConfig(), ["n_steps=abc"])
    with pytest.raises(ConfigError, match="bad value for n_steps"):
        apply_overrides(PPOConfig(), ["n_steps=1.5"])
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides(PPOConfig(), ["lr"])
    with pytest.raises(ConfigError, match="gamma"):
        apply_overrides(PPOConfig(), ["gamma=2"]).validate()
    with pytest.raises(ConfigError, match="n_steps"):
        apply_overrides(PPOConfig(), ["n_steps=0"]).validate()
    assert apply_overrides(PPOConfig(), ["step_timeout=none"]).validate().step_timeout is None
    assert apply_overrides(PPOConfig(), ["step_timeout=30"]).validate().step_timeout == 30.0
    for bad in ("0", "-1", "inf"):
        with pytest.raises(ConfigError, match="step_timeout must be a positive number or none"):
            apply_overrides(PPOConfig(), [f"step_timeout={bad}"]).validate()
    with pytest.raises(ConfigError, match="bad value for step_timeout"):
        apply_overrides(PPOConfig(), ["step_timeout=nan"])


# =============================================================================== GAE wiring
class _FakeBackend:
    """Hand-made rollout buffers with the engine's layout (no env behind them)."""

    kind = "fake"
    worker_pids: list = []
    num_workers = 0

    def __init__(self, T, N, obs_dim=3):
        self.num_envs = N
        self.groups = [(0, N)]  # lock-step (fastvec.train.storage.sources.RolloutStorage)
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.single_action_space = spaces.Discrete(2)
        S = T + 1
        rng = np.random.default_rng(0)
        self.obs = rng.normal(size=(S, N, obs_dim)).astype(np.float32)
        self.final_obs = (100.0 + rng.normal(size=(S, N, obs_dim))).astype(np.float32)
        self.act = np.zeros((S, N), np.int64)
        self.rewards = rng.normal(size=(S, N))
        self.terminated = np.zeros((S, N), bool)
        self.truncated = np.zeros((S, N), bool)

    def arrays(self):
        return []

    def reset(self, seed):
        pass

    def step(self, slot):
        pass

    def close(self):
        pass


def _reference_gae(rewards, values, next_values, term, trunc, gamma, lam):
    """The recursion written out plainly in float64."""
    T, N = rewards.shape
    adv = np.zeros((T, N))
    nxt = np.zeros(N)
    for t in reversed(range(T)):
        for n in range(N):
            delta = rewards[t, n] + gamma * (0.0 if term[t, n] else next_values[t, n]) - values[t, n]
            cont = 0.0 if (term[t, n] or trunc[t, n]) else 1.0
            adv[t, n] = delta + gamma * lam * cont * nxt[n]
        nxt = adv[t].copy()
    return adv, adv + values


def test_gae_wiring_bootstraps_truncation_from_final_obs():
    T, N = 6, 3
    b = _FakeBackend(T, N)
    # step t's flags live in slot t+1
    b.terminated[2, 0] = True  # env 0 terminates at step 1
    b.truncated[4, 1] = True  # env 1 is truncated at step 3 -> bootstrap V(final)
    b.truncated[6, 2] = True  # env 2 truncated at the last step
    b.terminated[3, 2] = b.truncated[3, 2] = True  # both flags: no bootstrap
    cfg = PPOConfig(num_envs=N, n_steps=T, gamma=0.9, gae_lambda=0.8, device="cpu")
    ppo = PPO(cfg, b, torch.device("cpu"))
    # A value function we can write down: V(obs) = obs[0]
    lin = torch.nn.Linear(3, 1)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 0.0, 0.0]]))
        lin.bias.zero_()
    ppo.policy.critic_body, ppo.policy.critic_head = torch.nn.Identity(), lin
    ppo.prepare()

    obs0 = b.obs[..., 0].astype(np.float64)
    final0 = b.final_obs[..., 0].astype(np.float64)
    values = obs0[:T]
    term, trunc = b.terminated[1:], b.truncated[1:]
    next_values = obs0[1:].copy()
    boot = trunc & ~term
    next_values[boot] = final0[1:][boot]
    adv_ref, ret_ref = _reference_gae(b.rewards[1:], values, next_values, term, trunc, 0.9, 0.8)
    ro = ppo.rollout
    np.testing.assert_allclose(ro.adv_np, adv_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ro.ret_np, ret_ref, rtol=1e-5, atol=1e-5)
    # the bootstrap used the final observation (~100), not the reset observation
    assert abs(ro.next_values_np[3, 1] - final0[4, 1]) < 1e-4
    assert abs(ro.next_values_np[5, 2] - final0[6, 2]) < 1e-4


def _replay_on_single_envs(fn, backend, T, seed):
    """Step one plain env per column through the actions the rollout took (env i reset
    with ``seed + i``, again without a seed after each end, as same-step autoreset does)
    and check every flag, reward and observation the engine wrote."""
    for i in range(backend.num_envs):
        env = fn()
        try:
            obs, _ = env.reset(seed=seed + i)
            np.testing.assert_array_equal(backend.obs[0, i], obs)
            for t in range(T):
                obs, rew, term, trunc, _ = env.step(int(backend.act[t + 1, i]))
                where = f"env {i} step {t}"
                assert (backend.terminated[t + 1, i], backend.truncated[t + 1, i]) == (term, trunc), where
                assert backend.rewards[t + 1, i] == rew, where
                if term or trunc:
                    np.testing.assert_array_equal(backend.final_obs[t + 1, i], obs, err_msg=where)
                    obs, _ = env.reset()
                np.testing.assert_array_equal(backend.obs[t + 1, i], obs, err_msg=where)
        finally:
            env.close()


def test_gae_wiring_on_the_engine_with_time_limits():
    """Real engine, CartPole truncated after 12 steps: the flags match a replay on plain
    envs, and the targets match a float64 reference built from the engine's own buffers,
    on rollouts that between them end episodes all three ways."""
    T, N = 32, 4
    cfg = PPOConfig(num_envs=N, n_steps=T, num_workers=1, gamma=0.97, gae_lambda=0.9, device="cpu")
    fn = env_factory("CartPole-v1", {"max_episode_steps": 12})
    seen = np.zeros(3, bool)  # terminated only, truncated only, both at once
    for seed in range(6):  # seed 0 alone has all three today; more in case acting changes
        torch.manual_seed(seed)
        backend = engine_storage([fn] * N, T + 1, 1)
        try:
            ppo = PPO(cfg, backend, torch.device("cpu"))
            backend.reset(seed)
            ppo.collect()
            ppo.prepare()
            _replay_on_single_envs(fn, backend, T, seed=seed)
            term, trunc = backend.terminated[1:], backend.truncated[1:]
            seen |= [(term & ~trunc).any(), (trunc & ~term).any(), (term & trunc).any()]
            crit = torch.nn.Sequential(*ppo.policy.stack("critic")).double()
            with torch.no_grad():
                V = lambda x, crit=crit: crit(torch.from_numpy(np.asarray(x, np.float64))).squeeze(-1).numpy()
                values = V(backend.obs[:T].reshape(-1, 4)).reshape(T, N)
                nv = V(backend.obs[1:].reshape(-1, 4)).reshape(T, N)
                fv = V(backend.final_obs[1:].reshape(-1, 4)).reshape(T, N)
            nv = np.where(trunc & ~term, fv, nv)
            adv_ref, ret_ref = _reference_gae(backend.rewards[1:], values, nv, term, trunc, 0.97, 0.9)
            np.testing.assert_allclose(ppo.rollout.adv_np, adv_ref, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(ppo.rollout.ret_np, ret_ref, rtol=1e-4, atol=1e-4)
        finally:
            backend.close()
        if seen.all():
            break
    assert seen.all(), f"no rollout ended an episode each way (terminated, truncated, both): {seen}"


# =============================================================================== zero copy
def test_rollout_tensors_share_memory_with_the_engine():
    T, N = 8, 4
    cfg = PPOConfig(num_envs=N, n_steps=T, num_workers=2, device="cpu")
    backend = engine_storage([env_factory("CartPole-v1")] * N, T + 1, 2)
    try:
        eng = backend.engine
        ppo = PPO(cfg, backend, torch.device("cpu"))
        ro = ppo.rollout
        assert eng.num_slots == T + 1 and eng.autoreset_mode == "same_step"
        assert ro.obs.data_ptr() == eng.obs_bufs[0].ctypes.data
        assert ro.final_obs.data_ptr() == eng.final_bufs[0].ctypes.data
        assert ro.act.data_ptr() == eng.act_bufs[0].ctypes.data
        assert ro.rewards.data_ptr() == eng.rewards.ctypes.data
        assert ro.terminated.data_ptr() == eng.terminated.ctypes.data
        assert ro.truncated.data_ptr() == eng.truncated.ctypes.data
        # what the learner trains on are views too
        assert ro.batch_obs().data_ptr() == eng.obs_bufs[0].ctypes.data
        assert ro.batch_actions().data_ptr() == eng.act_bufs[0][1].ctypes.data
        backend.reset(0)
        ppo.collect()
        # the actions the envs got are the ones the learner sees
        assert np.array_equal(ro.batch_actions().numpy(), eng.act_bufs[0][1:].reshape(-1))
        assert np.array_equal(ro.batch_obs().numpy(), eng.obs_bufs[0][:T].reshape(T * N, 4))
    finally:
        backend.close()


def test_same_trajectories_on_gymnasium_vector_env():
    """Same seed, same trainer: fastvec's engine and SyncVectorEnv see identical data."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    cfg = apply_overrides(PPOConfig(), preset_for("CartPole-v1"))
    apply_overrides(cfg, ["total_steps=3000", "seed=3", "device=cpu"])
    a = train("CartPole-v1", cfg, progress=False)
    venv = SyncVectorEnv([env_factory("CartPole-v1")] * cfg.num_envs, autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        b = train(None, cfg, venv=venv, progress=False)
    finally:
        venv.close()
    assert b["backend"] == "gymnasium" and a["backend"] == "fastvec"
    assert a["lost_wakeups"] == 0 and b["lost_wakeups"] is None  # every sleep ended by its doorbell
    assert a["env_steps"] == b["env_steps"] and a["episodes"] == b["episodes"]
    assert a["final_mean_return"] == pytest.approx(b["final_mean_return"])


def test_trainer_waits_for_its_workers_by_the_cores_left():
    """The trainer sleeps through its workers' step when they fill every core in lock-step
    (``main_spin_for``); the data are the same whichever way it waits."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from fastvec.train.commands.cli import main_spin_for

    cfg = PPOConfig()
    assert main_spin_for(cfg, workers=2, cores=2) == 0.0
    assert main_spin_for(cfg, workers=4, cores=2) == 0.0
    assert main_spin_for(cfg, workers=1, cores=2) is None  # a spare core: learned waits
    assert main_spin_for(apply_overrides(PPOConfig(), ["env_groups=2"]), workers=2, cores=2) is None
    assert main_spin_for(apply_overrides(PPOConfig(), ["main_spin_us=50"]), workers=2, cores=2) == 50.0
    for bad in (["main_spin_us=-1"], ["main_spin_us=1e7"]):
        with pytest.raises(ConfigError, match="main_spin_us must be in"):
            apply_overrides(PPOConfig(), bad).validate()
    with pytest.raises(ConfigError, match="main_spin_us must be in"):
        apply_overrides(PPOConfig(), {"main_spin_us": "fast"}).validate()

    cfg = apply_overrides(PPOConfig(), preset_for("CartPole-v1"))
    apply_overrides(cfg, ["total_steps=3000", "seed=5", "device=cpu", "num_workers=2"])
    venv = SyncVectorEnv([env_factory("CartPole-v1")] * cfg.num_envs, autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        ref = train(None, cfg, venv=venv, progress=False)
    finally:
        venv.close()
    for main_spin in (None, 0.0, 20.0):
        cfg.main_spin_us = main_spin
        res = train("CartPole-v1", cfg, progress=False)
        want = main_spin_for(cfg, 2, available_cores())
        assert res["main_spin_us"] == want and res["num_workers"] == 2 and res["lost_wakeups"] == 0
        assert (res["env_steps"], res["episodes"]) == (ref["env_steps"], ref["episodes"])
        assert res["final_mean_return"] == pytest.approx(ref["final_mean_return"])


def test_gymnasium_vector_env_needs_same_step_autoreset():
    from gymnasium.vector import SyncVectorEnv

    venv = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    try:
        with pytest.raises(ValueError, match="SAME_STEP"):
            train(None, PPOConfig(num_envs=2, n_steps=4, total_steps=8, device="cpu"), venv=venv, progress=False)
    finally:
        venv.close()


# =============================================================================== learning
def test_cartpole_learns():
    """Seed 0, CartPole preset: the mean return of the last 20 episodes passes 150
    within 40k steps (typically ~15k steps, a few seconds)."""
    cfg = apply_overrides(PPOConfig(), preset_for("CartPole-v1"))
    apply_overrides(cfg, ["seed=0", "total_steps=40000", "stop_at_return=150", "device=cpu"])
    res = train("CartPole-v1", cfg, progress=False)
    assert res["solved"], res
    assert res["final_mean_return"] >= 150
    assert res["env_steps"] <= 40000


def test_run_directory_contents_and_eval(tmp_path):
    run = tmp_path / "run"
    code = cli_main(
        "train",
        [
            "CartPole-v1",
            "--total-steps",
            "4096",
            "--logdir",
            str(run),
            "--no-progress",
            "--seed",
            "1",
            "--set",
            "log_every_s=0.01",
        ],
    )
    assert code == 0
    files = os.listdir(run)
    assert any(f.startswith("events.out.tfevents") for f in files)
    assert {"metrics.jsonl", "learning_curve.png", "checkpoint.pt", "result.json"} <= set(files)
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    keys = set().union(*rows)
    for k in (
        "charts/env_sps",
        "charts/learner_sps",
        "losses/approx_kl",
        "losses/clip_fraction",
        "losses/explained_variance",
        "health/workers_alive",
        "health/step_latency_us",
        "health/main_rss_mb",
        "charts/mean_episode_length",
        "health/lost_wakeups",
    ):
        assert k in keys, k
    assert all(row.get("health/lost_wakeups", 0) == 0 for row in rows)
    ckpt = load_checkpoint(str(run / "checkpoint.pt"))
    assert ckpt["env_id"] == "CartPole-v1" and ckpt["action_space"] == spaces.Discrete(2)
    assert "state_dict" in ckpt and ckpt["config"]["seed"] == 1
    assert cli_main("eval", [str(run / "checkpoint.pt"), "--episodes", "3", "--seed", "0"]) == 0


def test_eval_reports_mean_return(tmp_path, capsys):
    run = tmp_path / "r"
    assert (
        cli_main(
            "train", ["CartPole-v1", "--total-steps", "2048", "--logdir", str(run), "--no-progress", "--no-tensorboard"]
        )
        == 0
    )
    capsys.readouterr()
    assert cli_main("eval", [str(run), "--episodes", "4"]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    res = json.loads(out)
    assert res["episodes"] == 4 and res["env_id"] == "CartPole-v1"
    # the same four episodes, played one env at a time (env i seeded 0 + i, the mode of
    # the policy's logits each step): eval reports exactly their returns and lengths
    pol = policy_from_checkpoint(load_checkpoint(str(run / "checkpoint.pt")))
    returns, lengths = [], []
    for i in range(4):
        env = env_factory("CartPole-v1")()
        obs, _ = env.reset(seed=i)
        ret, n, done = 0.0, 0, False
        while not done:
            with torch.no_grad():
                logits = pol.actor_params(torch.as_tensor(obs[None], dtype=torch.float32))
            obs, r, term, trunc, _ = env.step(int(logits.argmax(-1)))
            ret, n, done = ret + r, n + 1, term or trunc
        env.close()
        returns.append(ret)
        lengths.append(n)
    assert res["mean_return"] == pytest.approx(np.mean(returns))
    assert (res["min_return"], res["max_return"]) == (min(returns), max(returns))
    assert res["mean_length"] == pytest.approx(np.mean(lengths))
    # beside it, the training return the run ended with (result.json's, stochastic actions)
    trained = json.load(open(run / "result.json"))
    assert res["training_mean_return"] == pytest.approx(trained["final_mean_return"], abs=1e-4)
    assert res["training_env_steps"] == trained["env_steps"] == 2048


def test_critic_sizes_of_its_own_train_save_eval_and_resume(tmp_path, capsys):
    """critic_hidden: the critic's layers differ from the actor's, in the trainer, its
    checkpoint and eval; a resumed run keeps them; the default keeps one size for both."""
    pol = make_policy(spaces.Box(-1, 1, (5,), np.float32), spaces.Discrete(3), hidden=(16,), critic_hidden=(32, 8))
    linears = lambda seq: [tuple(m.weight.shape) for m in seq if isinstance(m, torch.nn.Linear)]  # noqa: E731
    assert linears(pol.stack("actor")) == [(16, 5), (3, 16)]
    assert linears(pol.stack("critic")) == [(32, 5), (8, 32), (1, 8)]
    same = make_policy(spaces.Box(-1, 1, (5,), np.float32), spaces.Discrete(3), hidden=(16,))
    assert linears(same.stack("critic")) == [(16, 5), (1, 16)]

    run = tmp_path / "run"
    args = ["CartPole-v1", "--total-steps", "2048", "--logdir", str(run), "--no-progress", "--no-tensorboard"]
    assert cli_main("train", [*args, "--set", "hidden=16", "--set", "critic_hidden=32,8"]) == 0
    ckpt = load_checkpoint(str(run / "checkpoint.pt"))
    assert ckpt["config"]["critic_hidden"] == [32, 8] and ckpt["config"]["hidden"] == [16]
    assert linears(policy_from_checkpoint(ckpt).stack("critic")) == [(32, 4), (8, 32), (1, 8)]
    assert cli_main("eval", [str(run), "--episodes", "2"]) == 0
    capsys.readouterr()
    more = ["CartPole-v1", "--total-steps", "4096", "--resume", str(run), "--no-progress"]
    assert cli_main("train", [*more, "--no-tensorboard"]) == 0
    resumed = load_checkpoint(str(run / "checkpoint.pt"))
    assert linears(policy_from_checkpoint(resumed).stack("critic"))[0] == (32, 4) and resumed["env_steps"] == 4096
    code = cli_main("train", [*more, "--set", "critic_hidden=64"])
    _one_line_error(capsys, code, "critic_hidden")


# =============================================================================== CLI errors
def _one_line_error(capsys, code, expect):
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert expect in err, err


def test_cli_unknown_env(capsys):
    _one_line_error(capsys, cli_main("train", ["NoSuchEnv-v0"]), "unknown env id")


def test_cli_bad_set_key_and_value(capsys):
    _one_line_error(capsys, cli_main("train", ["CartPole-v1", "--set", "bogus=1"]), "unknown --set key 'bogus'")
    _one_line_error(capsys, cli_main("train", ["CartPole-v1", "--set", "lr=fast"]), "bad value for lr")
    _one_line_error(capsys, cli_main("train", ["CartPole-v1", "--set", "gamma=1.5"]), "gamma")
    _one_line_error(capsys, cli_main("train", ["CartPole-v1", "--set", "noequals"]), "key=value")
    _one_line_error(capsys, cli_main("train", ["CartPole-v1", "--num-envs", "0"]), "num_envs")
    for bad in ("critic_hidden=64,0", "critic_hidden=64,a", "hidden=-1", "hidden=64,,64", "hidden=64,", "hidden="):
        _one_line_error(capsys, cli_main("train", ["CartPole-v1", "--set", bad]), bad.split("=")[0])


def test_hidden_none_is_a_linear_policy():
    """``--set hidden=none``: no hidden layer, the actor and critic linear in the observation
    (CartPole: 4x2 + 2 logits' parameters and 4 + 1 for the value)."""
    cfg = apply_overrides(PPOConfig(), ["hidden=none"]).validate()
    assert cfg.hidden == ()
    pol = make_policy(spaces.Box(-1, 1, (4,)), spaces.Discrete(2), hidden=cfg.hidden)
    assert sum(p.numel() for p in pol.parameters()) == 4 * 2 + 2 + 4 + 1


def test_cli_checkpoint_errors(tmp_path, capsys):
    _one_line_error(capsys, cli_main("eval", [str(tmp_path / "missing.pt")]), "checkpoint not found")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    _one_line_error(capsys, cli_main("eval", [str(junk)]), "not")
    torch.save({"hello": 1}, tmp_path / "other.pt")
    _one_line_error(capsys, cli_main("eval", [str(tmp_path / "other.pt")]), "not a fastvec PPO checkpoint")
    run = tmp_path / "run"
    assert (
        cli_main(
            "train", ["CartPole-v1", "--total-steps", "512", "--logdir", str(run), "--no-progress", "--no-tensorboard"]
        )
        == 0
    )
    capsys.readouterr()
    ck = str(run / "checkpoint.pt")
    _one_line_error(capsys, cli_main("eval", [ck, "--env", "Acrobot-v1"]), "trained on CartPole-v1, not Acrobot-v1")
    _one_line_error(
        capsys, cli_main("train", ["Acrobot-v1", "--init-from", ck, "--no-progress"]), "trained on CartPole-v1"
    )


def test_cli_end_to_end_subprocess(tmp_path):
    """The real `fastvec` command: JSON last line on success, one-line errors otherwise."""
    exe = [sys.executable, "-m", "fastvec"]
    # cwd: outside the source tree, so `-m fastvec` finds the installed package
    out = subprocess.run(
        exe + ["train", "CartPole-v1", "--total-steps", "1024", "--logdir", str(tmp_path / "r"), "--no-tensorboard"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    for k in ("solved", "env_steps", "wall_seconds", "final_mean_return", "sps"):
        assert k in res
    assert res["env_steps"] >= 1024
    bad = subprocess.run(exe + ["train", "Nope-v9"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


# =============================================================================== presets
def test_presets_exist_and_validate():
    assert {"CartPole-v1", "Acrobot-v1", "InvertedPendulum-v5", "HalfCheetah-v5", "ALE/Pong-v5"} <= set(PRESETS)
    for env_id in PRESETS:
        cfg = apply_overrides(PPOConfig(), preset_for(env_id)).validate()
        assert cfg.num_envs >= 1
    assert preset_for("ALE/Breakout-v5")["n_steps"] == 128  # Atari defaults for other ALE ids


MUJOCO_PRESETS = [e for e in ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5") if e in PRESETS]


@pytest.mark.parametrize("env_id", MUJOCO_PRESETS)
@pytest.mark.parametrize("pipeline", ["lockstep", "async"])
def test_mujoco_preset_trains_resumes_and_evaluates(tmp_path, capsys, env_id, pipeline):
    """Each MuJoCo preset as a user runs it, short: trained with a --set override on either
    pipeline, resumed, evaluated; its checkpoint holds the preset's policy and schedule."""
    pytest.importorskip("mujoco")
    preset = preset_for(env_id)
    run = tmp_path / "run"
    short = ["--set", "n_steps=16", "--set", f"pipeline={pipeline}", "--no-progress", "--no-tensorboard"]
    steps = 2 * 16 * preset["num_envs"]
    assert cli_main("train", [env_id, "--total-steps", str(steps), "--logdir", str(run), *short]) == 0
    ckpt = load_checkpoint(str(run / "checkpoint.pt"))
    assert ckpt["config"]["hidden"] == list(preset.get("hidden", PPOConfig().hidden))
    for key, value in preset.items():  # every choice of the preset, but what this run overrides
        if key not in ("n_steps", "total_steps", "hidden"):  # hidden: a list in the checkpoint
            assert ckpt["config"][key] == value, key
    assert ckpt["config"]["n_steps"] == 16 and ckpt["env_steps"] == steps
    more = [env_id, "--total-steps", str(2 * steps), "--resume", str(run), "--no-progress", "--no-tensorboard"]
    assert cli_main("train", more) == 0
    assert load_checkpoint(str(run / "checkpoint.pt"))["env_steps"] == 2 * steps
    capsys.readouterr()
    assert cli_main("eval", [str(run), "--episodes", "1"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["episodes"] == 1


def test_pong_env_factory_stacks_frames():
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")  # AtariPreprocessing resizes with OpenCV
    try:
        env = env_factory("ALE/Pong-v5")()
    except (gym.error.NameNotFound, gym.error.NamespaceNotFound) as exc:  # an ale_py without Pong
        pytest.skip(f"ALE Pong is not registered here: {exc}")
    try:
        assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
        assert env.unwrapped._frameskip == 1
        pol = make_policy(env.observation_space, env.action_space)
        assert pol.kind == "cnn"
    finally:
        env.close()


def test_continuous_control_short_run():
    pytest.importorskip("mujoco")
    cfg = apply_overrides(PPOConfig(), preset_for("InvertedPendulum-v5"))
    apply_overrides(cfg, ["total_steps=2048", "num_envs=4", "n_steps=64", "device=cpu"])
    res = train("InvertedPendulum-v5", cfg, progress=False)
    assert res["env_steps"] >= 2048 and res["policy"].startswith("mlp+gaussian")


# =============================================================================== CUDA
@cuda
def test_cuda_pins_engine_buffers_and_trains():
    from fastvec.train import HostPin

    T, N = 8, 4
    backend = engine_storage([env_factory("CartPole-v1")] * N, T + 1, 1)
    pin = HostPin(backend.arrays())
    try:
        assert pin.pinned
        for arr in backend.arrays():
            assert torch.from_numpy(arr).is_pinned()
        cfg = PPOConfig(num_envs=N, n_steps=T, device="cuda")
        ppo = PPO(cfg, backend, torch.device("cuda"))
        backend.reset(0)
        for _ in range(3):
            ppo.collect()
            ppo.prepare()
            ppo.update()
        ro = ppo.rollout
        assert ro.obs_dev.is_cuda and ro.adv.is_cuda
        # device copies hold exactly what the engine wrote
        assert torch.equal(ro.obs_dev[1:].cpu(), ro.obs[1:])
        assert torch.equal(ro.act_dev[1:].cpu(), ro.act[1:])
        np.testing.assert_allclose(ro.adv.cpu().numpy(), ro.adv_np)
    finally:
        pin.release()
        backend.close()
    assert not pin.pinned


@cuda
def test_cuda_training_cartpole_and_gaussian():
    cfg = apply_overrides(PPOConfig(), preset_for("CartPole-v1"))
    apply_overrides(cfg, ["total_steps=30000", "stop_at_return=150", "device=cuda"])
    res = train("CartPole-v1", cfg, progress=False)
    assert res["device"].startswith("cuda") and res["solved"]
    pytest.importorskip("mujoco")
    cfg = apply_overrides(PPOConfig(), preset_for("InvertedPendulum-v5"))
    apply_overrides(cfg, ["total_steps=2048", "device=cuda"])
    res = train("InvertedPendulum-v5", cfg, progress=False)
    assert res["env_steps"] >= 2048


@cuda
def test_cuda_cnn_acting_matches_cpu_shapes():
    pol = make_policy(spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6)).cuda()
    obs = torch.randint(0, 255, (8, 4, 84, 84), dtype=torch.uint8, device="cuda")
    act = torch.empty(8, dtype=torch.int64, device="cuda")
    logp, v = torch.empty(8, device="cuda"), torch.empty(8, device="cuda")
    noise = pol.dist.sample_noise(torch.empty(pol.dist.noise_shape(8), device="cuda"))
    with torch.inference_mode():
        pol.act_(obs, noise, act, None, logp, v)
    lp2, _, v2 = pol.evaluate(obs, act)
    assert torch.allclose(lp2, logp, atol=1e-4) and torch.allclose(v2, v, atol=1e-4)


def test_same_trajectories_on_sb3_vec_env():
    """SB3's VecEnv API (terminal_observation / TimeLimit.truncated in the infos)."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv

    cfg = apply_overrides(PPOConfig(), preset_for("CartPole-v1"))
    apply_overrides(cfg, ["total_steps=3000", "seed=5", "device=cpu", "num_envs=4"])
    fn = env_factory("CartPole-v1", {"max_episode_steps": 60})  # truncations happen
    a = train("CartPole-v1", cfg, env_kwargs={"max_episode_steps": 60}, progress=False)
    venv = DummyVecEnv([fn] * cfg.num_envs)
    try:
        b = train(None, cfg, venv=venv, progress=False)
    finally:
        venv.close()
    assert b["backend"] == "subproc"
    assert a["episodes"] == b["episodes"]
    assert a["final_mean_return"] == pytest.approx(b["final_mean_return"])


def test_vec_env_without_final_observations_is_refused():
    import pathlib
    import sys

    bench = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
    if not (bench / "peers" / "baselines_subproc.py").is_file():
        pytest.skip("benchmarks/ is not here (cibuildwheel copies only tests/)")
    if str(bench) not in sys.path:
        sys.path.insert(0, str(bench))
    from peers.baselines_subproc import SubprocVecEnv

    venv = SubprocVecEnv([env_factory("CartPole-v1", {"max_episode_steps": 5})] * 2, context="fork")
    try:
        with pytest.raises(ValueError, match="final observation"):
            train(None, PPOConfig(num_envs=2, n_steps=8, total_steps=64, device="cpu"), venv=venv, progress=False)
    finally:
        venv.close()


def test_flat_adam_matches_torch_adam():
    from fastvec.train.algo.optim import FlatAdam, flatten_parameters

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    ref = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    ref.load_state_dict(net.state_dict())
    flat, grad = flatten_parameters(net)
    opt = FlatAdam(flat, lr=1e-2, eps=1e-5)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2, eps=1e-5)
    for _ in range(5):
        x = torch.randn(7, 3)
        grad.zero_()
        net(x).square().sum().backward()
        opt.step()
        ref_opt.zero_grad()
        ref(x).square().sum().backward()
        ref_opt.step()
    for p, q in zip(net.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    # the module's parameters are views into the flat tensor
    assert net[0].weight.data_ptr() == flat.data_ptr()
