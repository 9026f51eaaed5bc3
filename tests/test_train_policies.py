"""The trainer's policies (``fastvec.train.model``): actions of every space kind and
their log-probabilities against torch's distributions, the numpy acting path against
torch's, the CNN for images, layer sizes (``hidden``, ``critic_hidden``) through
training, checkpoints, eval and resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from helpers import one_line_error

from fastvec.train import PPOConfig, apply_overrides, load_checkpoint
from fastvec.train.algo.checkpoints import policy_from_checkpoint
from fastvec.train.commands.cli import main as cli_main
from fastvec.train.model.actor_critic import make_policy
from fastvec.train.model.distributions import CategoricalDist, GaussianDist


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
    assert make_policy(spaces.Dict({"a": spaces.Box(-1, 1, (2,))}), spaces.Discrete(2)).kind == "multi"
    with pytest.raises(ValueError, match=r"cannot encode obs\['b'\], a Text space"):
        make_policy(spaces.Dict({"a": spaces.Box(-1, 1, (2,)), "b": spaces.Text(3)}), spaces.Discrete(2))
    with pytest.raises(ValueError, match="Text|support"):
        make_policy(spaces.Box(-1, 1, (2,)), spaces.Text(5))


def test_hidden_none_is_a_linear_policy():
    """``--set hidden=none``: no hidden layer, the actor and critic linear in the observation
    (CartPole: 4x2 + 2 logits' parameters and 4 + 1 for the value)."""
    cfg = apply_overrides(PPOConfig(), ["hidden=none"]).validate()
    assert cfg.hidden == ()
    pol = make_policy(spaces.Box(-1, 1, (4,)), spaces.Discrete(2), hidden=cfg.hidden)
    assert sum(p.numel() for p in pol.parameters()) == 4 * 2 + 2 + 4 + 1


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
    one_line_error(capsys, code, "critic_hidden")
