"""Composite actions: ``Dict``/``Tuple`` action spaces trained as a product distribution.

References: the env's own actions (a round trip through the flat vector), a float64
log-probability and entropy from ``torch.distributions`` per leaf, the softmax's
probabilities against a hundred thousand samples, a replay of the same flat actions on
single envs stepping the composite actions by hand, a random policy's return, and a
member of a population against its run alone.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

import fastvec
from fastvec.composite_actions import (
    FlatActionBox,
    FlatActions,
    action_leaves,
    composite_action,
    flat_action,
)
from fastvec.train import PPOConfig, env_factory, load_checkpoint, run_training
from fastvec.train.model.distributions import ProductDist, make_dist

TESTS = Path(__file__).resolve().parent
ROOT = Path(fastvec.__file__).resolve().parent.parent  # (the fastvec under test: installed, under CI)
ENV_ID = "envs:FvComposite-v0"


def _space():
    import envs

    return envs.CompositeActionEnv().action_space


def _same(a, b) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert np.asarray(a).dtype == np.asarray(b).dtype, (a, b)


def test_flat_vector_round_trips_every_leaf_kind():
    nested = spaces.Tuple(
        (
            _space(),
            spaces.Dict({"grid": spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[1, 0], [0, -2]])}),
            spaces.Box(-2.0, 3.0, (2, 2), np.float64),
        )
    )
    flat = FlatActionBox(nested)
    leaves = action_leaves(nested)
    # (a Dict holds its keys sorted: aim, gear, move)
    assert [leaf.name for leaf in leaves] == ["0/aim/0", "0/aim/1", "0/gear", "0/move", "1/grid", "2"]
    assert [leaf.width for leaf in leaves] == [2, 2, 2, 1, 4, 4] and flat.shape == (15,)
    np.testing.assert_array_equal(flat.low[:7], [-1, -1, 0, 0, 0, 0, -1])
    np.testing.assert_array_equal(flat.high[:7], [1, 1, 1, 1, 1, 2, 1])
    nested.seed(3)
    for _ in range(200):
        action = nested.sample()
        vec = flat_action(nested, action)
        assert flat.contains(vec)
        back = composite_action(nested, vec)
        # (a float64 Box leaf passes through float32)
        back = (back[0], back[1], back[2].astype(np.float32).astype(np.float64))
        _same(back, (action[0], action[1], action[2].astype(np.float32).astype(np.float64)))
        assert nested.contains(composite_action(nested, vec))
    again = pickle.loads(pickle.dumps(flat))  # (how a worker hands its spaces over)
    assert again == flat and again.composite == nested and again != spaces.Box(flat.low, flat.high)


@pytest.mark.parametrize(
    "space,message",
    [
        (spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Dict({"c": spaces.Text(5)})}), "leaf b/c is Text"),
        (spaces.Tuple((spaces.Box(0, 5, (2,), np.int64),)), "leaf 0 is Box(0, 5, (2,), int64)"),
        (spaces.Dict({"big": spaces.Discrete(2**25)}), "leaf big has values beyond 2**24"),
    ],
)
def test_a_leaf_the_trainer_cannot_act_on_is_refused_naming_it(space, message):
    with pytest.raises(ValueError, match="composite actions take|beyond 2") as err:
        FlatActionBox(space)
    assert message in str(err.value) and "\n" not in str(err.value)


def _reference(dist: ProductDist, params: torch.Tensor, raw: torch.Tensor):
    """Float64 log-probabilities and entropies of ``CompositeActionEnv``'s space, leaf
    by leaf with ``torch.distributions``, from the parameters' layout (the Dict's keys
    sorted): aim's 2 means, the bits' 2 x 2 logits, the gears' 2 x 3 logits (gear 0 has
    two choices: its third logit is not a choice), move's 3 logits; the actions' columns:
    aim 0-1, bits 2-3, gears 4-5, move 6 (its values from -1)."""
    from torch.distributions import Categorical, Normal

    p, a = params.double(), raw.double()
    std = dist.parts[0].log_std.detach().double().exp()
    aim = Normal(p[:, 0:2], std)
    bits = Categorical(logits=p[:, 2:6].reshape(-1, 2, 2))
    gear0, gear1 = Categorical(logits=p[:, 6:8]), Categorical(logits=p[:, 9:12])
    move = Categorical(logits=p[:, 12:15])
    logp = aim.log_prob(a[:, 0:2]).sum(1) + bits.log_prob(a[:, 2:4].long()).sum(1)
    logp = logp + gear0.log_prob(a[:, 4].long()) + gear1.log_prob(a[:, 5].long()) + move.log_prob(a[:, 6].long() + 1)
    ent = aim.entropy().sum(1) + bits.entropy().sum(1) + gear0.entropy() + gear1.entropy() + move.entropy()
    return logp, ent


def test_log_probability_and_entropy_equal_a_float64_reference():
    torch.manual_seed(0)
    dist = make_dist(FlatActionBox(_space()))
    assert isinstance(dist, ProductDist) and dist.n_params == 15 and dist.dim == 7
    with torch.no_grad():
        dist.parts[0].log_std.copy_(torch.tensor([-0.5, 0.7]))
    B = 256
    params = torch.randn(B, dist.n_params) * 2
    noise = dist.sample_noise(torch.empty(dist.noise_shape(B)))
    act, raw = torch.empty(B, 7), torch.empty(B, 7)
    with torch.no_grad():  # (as the trainer acts: under inference_mode)
        back = dist.act_(params, noise, act, raw)
    assert torch.equal(back, raw)
    # the env's actions: choices with their starts, the aim clipped; raw: the aim unclipped
    assert set(act[:, 6].tolist()) == {-1.0, 0.0, 1.0} and set(act[:, 4].tolist()) == {0.0, 1.0}
    assert set(act[:, 5].tolist()) == {0.0, 1.0, 2.0} and set(act[:, 2:4].flatten().tolist()) == {0.0, 1.0}
    assert act[:, 0:2].abs().max() <= 1.0 < raw[:, 0:2].abs().max()
    assert torch.equal(act[:, 0:2], raw[:, 0:2].clamp(-1, 1)) and torch.equal(act[:, 2:], raw[:, 2:])
    logp, ent = dist.log_prob_entropy(params, raw)
    ref_logp, ref_ent = _reference(dist, params, raw)
    torch.testing.assert_close(logp.double(), ref_logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dist.log_prob(params, raw), logp)
    # deterministic: each factor's mode (the aim's mean, clipped)
    with torch.no_grad():
        dist.act_(params, noise, act, raw, deterministic=True)
    assert torch.equal(act[:, 6], params[:, 12:15].argmax(1).float() - 1)
    assert torch.equal(act[:, 5], params[:, 9:12].argmax(1).float())
    assert torch.equal(act[:, 0:2], params[:, 0:2].clamp(-1, 1))


def test_sampled_actions_follow_each_factors_probabilities():
    torch.manual_seed(1)
    dist = make_dist(FlatActionBox(_space()))
    B = 100_000
    params = torch.randn(1, dist.n_params).expand(B, -1).contiguous()
    noise = dist.sample_noise(torch.empty(dist.noise_shape(B)))
    act, raw = torch.empty(B, 7), torch.empty(B, 7)
    with torch.no_grad():
        dist.act_(params, noise, act, raw)
    p = params[0]
    for col, logits in ((6, p[12:15]), (2, p[2:4]), (3, p[4:6]), (4, p[6:8]), (5, p[9:12])):
        choices = act[:, col] + (1 if col == 6 else 0)
        freq = torch.bincount(choices.long(), minlength=len(logits)).double() / B
        torch.testing.assert_close(freq, torch.softmax(logits.double(), 0), atol=0.006, rtol=0)
    torch.testing.assert_close(raw[:, 0:2].mean(0), p[0:2], atol=0.02, rtol=0)
    torch.testing.assert_close(raw[:, 0:2].std(0), torch.ones(2), atol=0.02, rtol=0)


def test_the_envs_get_the_composite_actions_the_trainer_wrote():
    """The engine's envs (``env_factory``'s, the flat vector undone in each worker)
    against single envs stepping the composite actions by hand, same seeds."""
    import envs

    from fastvec import AsyncVectorEnv

    n, seed = 4, 11
    venv = AsyncVectorEnv([env_factory(ENV_ID)] * n, num_workers=2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        assert isinstance(venv.single_action_space, FlatActionBox)
        singles = [envs.CompositeActionEnv() for _ in range(n)]
        obs, _ = venv.reset(seed=seed)
        ref = [e.reset(seed=seed + i)[0] for i, e in enumerate(singles)]
        np.testing.assert_array_equal(obs, np.stack(ref))
        venv.single_action_space.seed(5)
        for _ in range(30):
            flat = np.stack([venv.single_action_space.sample() for _ in range(n)])
            flat[:, 2:] = np.rint(flat[:, 2:])
            obs, rew, term, trunc, _ = venv.step(flat)
            for i, e in enumerate(singles):
                o, r, te, tr, _ = e.step(composite_action(e.action_space, flat[i]))
                if te or tr:
                    o, _ = e.reset()
                np.testing.assert_array_equal(obs[i], o)
                assert rew[i] == r and trunc[i] == tr
    finally:
        venv.close()


def _random_return(episodes: int = 400) -> float:
    import envs

    env = envs.CompositeActionEnv()
    env.action_space.seed(0)
    total = 0.0
    for k in range(episodes):
        env.reset(seed=k)
        done = False
        while not done:
            _, r, te, tr, _ = env.step(env.action_space.sample())
            total += r
            done = te or tr
    return total / episodes


def _fastvec(args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, "-m", "fastvec", *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )
    return out


def _leaf_scores(run: str, n: int = 500) -> dict:
    """Per leaf, the trained policy's deterministic score on ``n`` targets against what
    a policy blind to that leaf's target scores: the move's and the gears' hit rates
    (blind: 1/3 and 1/6 at best), the bits' (1/2), and ``0.4 - |aim - point|`` (a blind
    aim at the middle misses ``U(-0.8, 0.8)`` points by 0.4 on average: 0); each with
    the bar it must pass, well above the blind score."""
    import envs

    from fastvec.train import policy_from_checkpoint

    pol = policy_from_checkpoint(load_checkpoint(run))
    env = envs.CompositeActionEnv(length=n)
    obs, _ = env.reset(seed=123)
    seen, targets = [], []
    for _ in range(n):
        seen.append(obs)
        targets.append((env.move, env.point.copy(), env.bits.copy(), env.gears.copy()))
        obs, *_ = env.step(env.action_space.sample())
    acts = [composite_action(env.action_space, a) for a in pol.predict(np.stack(seen))]
    hits = np.array(
        [
            (
                a["move"] == m,
                np.array_equal(a["gear"], g),
                np.mean(a["aim"][1] == b),
                0.4 - np.abs(a["aim"][0] - p).mean(),
            )
            for a, (m, p, b, g) in zip(acts, targets)
        ]
    ).mean(0)
    return {"move": (hits[0], 0.9), "gear": (hits[1], 0.7), "bits": (hits[2], 0.75), "aim": (hits[3], 0.05)}


def test_trained_by_name_from_a_fresh_shell_and_evaluated(tmp_path):
    """``fastvec train envs:FvComposite-v0`` from a fresh interpreter: every leaf pays
    only where the policy reads the target, so a random policy returns about 12 of 32;
    the trained one, deterministic under ``fastvec eval``, at least 24, and each leaf
    on its own well above what a policy blind to it scores (``_leaf_scores``'s bars).
    Export refuses in one line."""
    run = tmp_path / "composite"
    args = ["train", ENV_ID, "--total-steps", "60000", "--seed", "1", "--num-envs", "8", "--num-workers", "1"]
    args += ["--no-progress", "--no-tensorboard", "--device", "cpu", "--logdir", str(run)]
    out = _fastvec(args, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["policy"].startswith("mlp+product")
    baseline = _random_return()
    assert 10 < baseline < 14
    ev = _fastvec(["eval", str(run), "--episodes", "20"], tmp_path)
    assert ev.returncode == 0, ev.stderr[-2000:]
    mean = json.loads(ev.stdout.strip().splitlines()[-1])["mean_return"]
    assert mean >= 24.0 > baseline + 10, (mean, baseline)
    for leaf, (learned, bar) in _leaf_scores(str(run)).items():  # every leaf read its target
        assert learned > bar, (leaf, learned, bar)
    refused = _fastvec(["export", str(run), "--format", "torchscript", str(tmp_path / "p.pt")], tmp_path)
    assert refused.returncode == 2 and "composite-action policies" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("over", [{}, {"pipeline": "async"}, {"policy_core": "lstm", "core_size": 16}])
def test_the_update_sees_the_actions_acting_sampled(tmp_path, monkeypatch, over):
    """Lock-step, the async pipeline and a recurrent core: the update's actions are the
    ones the envs were given, but for the aim its raw, unclipped sample (a standard
    deviation of 1 about points within 0.8 samples past the bounds often); the first
    update (one epoch, one minibatch of the whole rollout, the weights that acted)
    recomputes each action's log-prob as recorded: a KL of 0 and no clipped ratio."""
    from fastvec.train.storage.rollout import Rollout

    batch_actions = Rollout.batch_actions
    log = tmp_path / "seen.txt"  # (written from the async pipeline's learner too: a fork of this process)

    def spy(self):
        out = batch_actions(self)
        given = self.act[1:].reshape(out.shape)
        same = torch.equal(out[:, 2:], given[:, 2:]) and torch.equal(out[:, :2].clamp(-1, 1), given[:, :2])
        with open(log, "a") as f:
            f.write(f"{int(same)} {float(out[:, :2].abs().max())}\n")
        return out

    monkeypatch.setattr(Rollout, "batch_actions", spy)
    cfg = PPOConfig(num_envs=4, n_steps=16, minibatch_size=64, n_epochs=1, total_steps=2048, num_workers=1)
    cfg.device = "cpu"
    for k, v in over.items():
        setattr(cfg, k, v)
    res = run_training(ENV_ID, cfg, run_dir=str(tmp_path), progress=False, tensorboard=False)
    assert res["env_steps"] >= 2048 and res["episodes"] > 0 and "product" in res["policy"]
    with open(tmp_path / "metrics.jsonl") as f:
        first = next(row for row in map(json.loads, f) if "losses/approx_kl" in row)
    assert abs(first["losses/approx_kl"]) < 1e-6 and first["losses/clip_fraction"] == 0, first
    seen = [line.split() for line in log.read_text().splitlines()]
    assert seen and all(same == "1" for same, _ in seen)
    assert float(seen[0][1]) > 1.0  # (the first rollout's raw aims: past the bounds somewhere)
    ckpt = load_checkpoint(str(tmp_path))
    assert isinstance(ckpt["action_space"], FlatActionBox) and ckpt["action_space"].composite == _space()


def test_a_member_with_composite_actions_is_its_run_alone(tmp_path):
    from test_train_members import _assert_same_run, _cfg, _solo

    from fastvec.train.commands.members import run_members

    cfg = _cfg(ENV_ID)
    pop = run_members(ENV_ID, cfg, seeds=[2, 5], run_dir=str(tmp_path / "pop"), progress=False, tensorboard=False)
    assert pop["learned_at_once"] is False  # (the numpy learner knows Box and Discrete actions)
    for seed in (2, 5):
        member = load_checkpoint(str(tmp_path / "pop" / f"seed-{seed}" / "checkpoint.pt"))
        _assert_same_run(member, _solo(tmp_path, ENV_ID, cfg, seed))


def test_what_composite_actions_do_not_serve_is_refused_in_one_line(tmp_path):
    import envs

    out = _fastvec(["train", ENV_ID, "--action-mask", "info", "--total-steps", "64", "--no-progress"], tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "action_mask" in out.stderr or "action masks" in out.stderr
    out = _fastvec(["train", "envs:FvCompositeText-v0", "--total-steps", "64", "--no-progress"], tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "the action leaf say is Text" in out.stderr and "worker" not in out.stderr  # (before any started)
    venv = gym.vector.SyncVectorEnv([envs.CompositeActionEnv] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    cfg = PPOConfig(num_envs=2, n_steps=8, minibatch_size=16, total_steps=32, device="cpu")
    with pytest.raises(
        ValueError, match="from envs it builds by id, or from envs wrapped in fastvec.composite_actions.FlatActions"
    ) as err:
        run_training(None, cfg, venv=venv, progress=False, tensorboard=False)
    assert "\n" not in str(err.value)
    venv = gym.vector.SyncVectorEnv(
        [lambda: FlatActions(envs.CompositeActionEnv())] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    res = run_training(None, cfg, venv=venv, progress=False, tensorboard=False)  # (the wrapped envs: taken)
    assert res["env_steps"] == 32 and "product" in res["policy"]
    wrapped = FlatActions(envs.CompositeActionEnv())
    wrapped.reset(seed=0)
    wrapped.step(flat_action(wrapped.env.action_space, wrapped.env.action_space.sample()))
    assert wrapped.env.action_space.contains(wrapped.env.received)
