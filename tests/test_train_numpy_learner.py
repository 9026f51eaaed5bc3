"""The numpy minibatch gradient (``fastvec.train.algo.minibatch``) against autograd.

The reference is the PPO loss written out with ``torch.distributions`` on a float64 copy
of the policy, differentiated by autograd; the numpy learner works in float32, so the
two agree up to float32 rounding. Then a whole ``PPO.update`` with ``learner="numpy"``
against ``learner="torch"`` from the same state and rollout."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from gymnasium import spaces

from fastvec.train import PPO, ConfigError, PPOConfig
from fastvec.train.algo.minibatch import NumpyLearner
from fastvec.train.algo.optim import flatten_parameters
from fastvec.train.model.actor_critic import make_policy
from fastvec.train.model.distributions import GaussianDist

OBS = spaces.Box(-np.inf, np.inf, (7,), np.float32)


def reference_loss(pol, x, a, olp, adv, ret, ov, clip, ent_coef, vf_coef, clip_vf):
    """CleanRL's PPO loss (the clipped objective, the value loss with its 0.5 factor,
    the entropy bonus), with torch.distributions."""
    params, v = pol.actor_head(pol.actor_body(x)), pol.critic_head(pol.critic_body(x)).squeeze(-1)
    if isinstance(pol.dist, GaussianDist):
        d = torch.distributions.Normal(params, pol.dist.log_std.exp())
        logp, ent = d.log_prob(a).sum(-1), d.entropy().sum(-1)
    else:
        d = torch.distributions.Categorical(logits=params)
        logp, ent = d.log_prob(a), d.entropy()
    ratio = (logp - olp).exp()
    pg = -torch.min(adv * ratio, adv * ratio.clamp(1 - clip, 1 + clip)).mean()
    if clip_vf is None:
        v_loss = (v - ret).square().mean()
    else:
        vc = ov + (v - ov).clamp(-clip_vf, clip_vf)
        v_loss = torch.max((v - ret).square(), (vc - ret).square()).mean()
    loss = pg + 0.5 * vf_coef * v_loss - ent_coef * ent.mean()
    kl = ((ratio - 1) - (logp - olp)).mean()
    cf = ((ratio - 1).abs() > clip).double().mean()
    return loss, dict(kl=kl, cf=cf, pg=pg, v=0.5 * v_loss, ent=ent.mean())


@pytest.mark.parametrize(
    "act_space, activation, ent_coef, clip_vf, hidden",
    [
        (spaces.Box(-1, 1, (3,), np.float32), "tanh", 0.0, None, (16, 12)),
        (spaces.Box(-1, 1, (3,), np.float32), "relu", 0.0, None, ((16, 12), (24, 20, 8))),  # critic sizes of its own
        (spaces.Box(-1, 1, (2,), np.float32), "relu", 0.01, 0.2, (16, 12)),
        (spaces.Discrete(4), "tanh", 0.01, None, (16, 12)),
        (spaces.Discrete(3), "relu", 0.0, 0.1, (16, 12)),
        (spaces.Discrete(3), "tanh", 0.01, None, ()),  # a linear policy
    ],
)
def test_gradient_matches_autograd(act_space, activation, ent_coef, clip_vf, hidden):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    hidden, critic_hidden = hidden if hidden and isinstance(hidden[0], tuple) else (hidden, None)
    pol = make_policy(
        OBS, act_space, hidden=hidden, critic_hidden=critic_hidden, activation=activation, log_std_init=-0.3
    )
    ref = copy.deepcopy(pol).double()
    _flat, grad = flatten_parameters(pol)
    learner = NumpyLearner(pol, grad, ent_coef=ent_coef, vf_coef=0.7, clip_vf=clip_vf)
    n, clip = 64, 0.2
    x = rng.standard_normal((n, 7)).astype(np.float32)
    with torch.no_grad():
        params = pol.actor_head(pol.actor_body(torch.from_numpy(x)))
    if isinstance(pol.dist, GaussianDist):
        a = (params.numpy() + rng.standard_normal(params.shape) * 0.7).astype(np.float32)
        logp = torch.distributions.Normal(params, pol.dist.log_std.exp()).log_prob(torch.from_numpy(a)).sum(-1)
    else:
        a = rng.integers(0, act_space.n, n)
        logp = torch.distributions.Categorical(logits=params).log_prob(torch.from_numpy(a))
    # old log-probs off by up to +-0.6: ratios inside and outside the clip range, both signs
    olp = (logp.detach().numpy() + rng.uniform(-0.6, 0.6, n)).astype(np.float32)
    adv = rng.standard_normal(n).astype(np.float32)
    ret = rng.standard_normal(n).astype(np.float32)
    ov = rng.standard_normal(n).astype(np.float32) * 0.3

    stats = {k: [] for k in ("kl", "cf", "pg", "v", "ent")}
    assert learner.minibatch(x, a, olp, adv, ret, ov, clip=clip, want_stats=True, target_kl=None, stats=stats) is False
    got = grad.numpy().copy()

    t = lambda v: torch.as_tensor(v, dtype=torch.float64)  # noqa: E731
    loss, want_stats = reference_loss(
        ref,
        t(x),
        torch.as_tensor(a) if a.dtype.kind == "i" else t(a),
        t(olp),
        t(adv),
        t(ret),
        t(ov),
        clip,
        ent_coef,
        0.7,
        clip_vf,
    )
    loss.backward()
    want = torch.cat([p.grad.reshape(-1) for p in ref.parameters()]).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-6)
    for k, v in want_stats.items():
        assert stats[k][0] == pytest.approx(float(v.detach()), rel=1e-4, abs=1e-6), k


def test_target_kl_stops_before_the_gradient():
    torch.manual_seed(1)
    pol = make_policy(OBS, spaces.Discrete(2), hidden=(8,))
    _flat, grad = flatten_parameters(pol)
    learner = NumpyLearner(pol, grad, 0.0, 0.5, None)
    grad.fill_(7.0)
    x = np.random.default_rng(1).standard_normal((32, 7)).astype(np.float32)
    a = np.zeros(32, np.int64)
    z = np.zeros(32, np.float32)
    stats = {"kl": []}
    # old log-probs far above the new ones: a large KL
    assert learner.minibatch(x, a, z + 5.0, z + 1, z, z, clip=0.2, want_stats=True, target_kl=0.01, stats=stats) is True
    assert stats["kl"][0] > 0.015
    assert (grad == 7.0).all(), "no gradient is written when the KL stops the epochs"


def test_where_the_numpy_learner_applies():
    cpu = torch.device("cpu")
    mlp = make_policy(OBS, spaces.Discrete(2))
    assert NumpyLearner.why_not(mlp, cpu, 1) is None
    assert "one thread" in NumpyLearner.why_not(mlp, cpu, 2)
    assert "CPU" in NumpyLearner.why_not(mlp, torch.device("cuda"), 1)
    assert "GELU" in NumpyLearner.why_not(make_policy(OBS, spaces.Discrete(2), activation="gelu"), cpu, 1)
    assert "Discrete" in NumpyLearner.why_not(make_policy(OBS, spaces.MultiDiscrete([2, 3])), cpu, 1)
    cnn = make_policy(spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6))
    assert "MLP" in NumpyLearner.why_not(cnn, cpu, 1)
    with pytest.raises(ValueError, match="flatten_parameters"):
        NumpyLearner(mlp, torch.zeros(3), 0.0, 0.5, None)


class _Rollout:
    """A fixed storage: random observations, rewards and flags, no envs."""

    def __init__(self, obs_space, act_space, T, N, seed=0):
        rng = np.random.default_rng(seed)
        self.single_observation_space, self.single_action_space = obs_space, act_space
        self.num_envs, self.num_workers = N, 0
        self.groups = [(0, N)]  # lock-step (fastvec.train.storage.sources.RolloutStorage)
        self.obs = (rng.standard_normal((T + 1, N, *obs_space.shape)) * 2 + 1).astype(obs_space.dtype)
        self.final_obs = np.zeros_like(self.obs)
        act_dtype = np.float32 if isinstance(act_space, spaces.Box) else np.int64
        self.act = np.zeros((T + 1, N, *act_space.shape), act_dtype)
        self.rewards = rng.standard_normal((T + 1, N))
        self.terminated = rng.random((T + 1, N)) < 0.05
        self.truncated = np.zeros((T + 1, N), bool)
        self.restarts = []

    def step(self, t):
        pass


@pytest.mark.parametrize(
    "act_space, extra",
    [
        (spaces.Box(-1, 1, (3,), np.float32), dict(normalize_obs=True, clip_vf=0.2)),
        (spaces.Discrete(3), dict(ent_coef=0.01, target_kl=0.02)),
    ],
)
def test_whole_update_matches_the_torch_learner(act_space, extra):
    """The same rollout and state, one update each way: the same parameters (up to the
    rounding the 80 Adam steps carry), the same statistics, the same early stop."""
    out = {}
    for learner in ("torch", "numpy"):
        torch.manual_seed(3)
        np.random.seed(3)
        cfg = PPOConfig(
            num_envs=4,
            n_steps=32,
            n_epochs=4,
            minibatch_size=32,
            device="cpu",
            learner=learner,
            total_steps=10_000,
            **extra,
        ).validate()
        ppo = PPO(cfg, _Rollout(OBS, act_space, 32, 4), torch.device("cpu"))
        assert (ppo.np_learner is not None) == (learner == "numpy")
        ppo.collect()
        ppo.prepare()
        ppo.update()
        out[learner] = (ppo.flat_param.detach().clone(), ppo.summarize(), ppo.grad_steps)
    (p_t, s_t, n_t), (p_n, s_n, n_n) = out["torch"], out["numpy"]
    assert n_t == n_n
    torch.testing.assert_close(p_n, p_t, rtol=1e-4, atol=1e-5)
    for k in ("losses/policy", "losses/value", "losses/entropy", "losses/approx_kl", "losses/clip_fraction"):
        assert s_n[k] == pytest.approx(s_t[k], rel=1e-3, abs=1e-6), k


def test_learner_config():
    with pytest.raises(ConfigError, match="learner must be"):
        PPOConfig(learner="jax").validate()
    cfg = PPOConfig(num_envs=2, n_steps=4, device="cpu", learner="numpy", activation="elu").validate()
    with pytest.raises(ConfigError, match="learner=numpy does not fit this run: .*tanh and relu"):
        PPO(cfg, _Rollout(OBS, spaces.Discrete(2), 4, 2), torch.device("cpu"))
    cfg = PPOConfig(num_envs=2, n_steps=4, device="cpu", activation="elu").validate()
    assert PPO(cfg, _Rollout(OBS, spaces.Discrete(2), 4, 2), torch.device("cpu")).np_learner is None


def test_learners_track_each_other_on_cartpole():
    """Real CartPole rollouts (its preset, SyncVectorEnv): five collect/prepare/update
    rounds with each learner from the same seed. The two part by float rounding only,
    which training amplifies slowly at first (measured: ~1e-7 of the largest parameter
    after one update, ~1e-6 after five, then growing as any two trainings drift)."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from fastvec.train import apply_overrides
    from fastvec.train.config.presets import env_factory, preset_for
    from fastvec.train.storage.vector_copies import storage_for

    params = {}
    for learner in ("torch", "numpy"):
        torch.manual_seed(0)
        cfg = apply_overrides(PPOConfig(), preset_for("CartPole-v1"))
        cfg.learner, cfg.device = learner, "cpu"
        venv = SyncVectorEnv([env_factory("CartPole-v1")] * cfg.num_envs, autoreset_mode=AutoresetMode.SAME_STEP)
        try:
            storage = storage_for(venv, cfg.n_steps + 1)
            ppo = PPO(cfg.validate(), storage, torch.device("cpu"))
            storage.reset(0)
            params[learner] = []
            for _ in range(5):
                ppo.collect()
                ppo.prepare()
                ppo.update()
                ppo.rollout.obs[0].copy_(
                    ppo.rollout.obs[cfg.n_steps]
                )  # as fastvec.train.pipelines.lockstep's LockStep does
                params[learner].append(ppo.flat_param.detach().clone())
        finally:
            venv.close()
    for t, (a, b) in enumerate(zip(params["torch"], params["numpy"])):
        rel = float((a - b).abs().max() / a.abs().max())
        assert rel < 1e-5, (t, rel)
    assert not torch.equal(params["numpy"][0], params["numpy"][-1]), "it learned"


def test_a_linear_policy_acts_and_learns():
    """hidden=() (one linear layer per head) used to fail at the first acting step."""
    from fastvec.train.commands.cli import run_training

    cfg = PPOConfig(num_envs=4, num_workers=1, n_steps=16, total_steps=256, hidden=(), device="cpu")
    res = run_training("CartPole-v1", cfg, progress=False, tensorboard=False, save=False)
    assert res["env_steps"] == 256 and res["learner"] == "numpy" and res["updates"] == 3
    assert res["grad_steps"] == 3 * cfg.n_epochs  # each rollout's 64 samples: one minibatch an epoch
