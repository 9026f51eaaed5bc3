"""The trainer learns: CartPole's preset solves it; the flat Adam it steps with
against torch's Adam."""

from __future__ import annotations

import torch

from fastvec.train import PPOConfig, apply_overrides
from fastvec.train.commands.cli import run_training as train
from fastvec.train.config.presets import preset_for


def test_cartpole_learns():
    """Seed 0, CartPole preset: the mean return of the last 20 episodes passes 150
    within 40k steps (typically ~15k steps, a few seconds)."""
    cfg = apply_overrides(PPOConfig(), preset_for("CartPole-v1"))
    apply_overrides(cfg, ["seed=0", "total_steps=40000", "stop_at_return=150", "device=cpu"])
    res = train("CartPole-v1", cfg, progress=False)
    assert res["solved"], res
    assert res["final_mean_return"] >= 150
    assert res["env_steps"] <= 40000


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
