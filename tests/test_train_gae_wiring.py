"""GAE as the trainer wires it to the rollout: the targets against a float64 reference
of the recursion on hand-made buffers (bootstraps from final observations where an
episode is truncated) and on the engine's own buffers, checked by a replay on plain envs."""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from helpers import engine_storage

from fastvec.train import PPO, PPOConfig
from fastvec.train.config.presets import env_factory


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
