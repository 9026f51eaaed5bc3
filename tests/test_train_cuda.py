"""The trainer on CUDA (skipped without a GPU): pinned engine buffers and device
copies of what the engine wrote, training, and CNN acting."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from helpers import engine_storage

from fastvec.train import PPO, PPOConfig, apply_overrides
from fastvec.train.commands.cli import run_training as train
from fastvec.train.config.presets import env_factory, preset_for
from fastvec.train.model.actor_critic import make_policy

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


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
    assert res["env_steps"] == 2048  # 16 rollouts of the preset's 8 envs x 16 steps


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
