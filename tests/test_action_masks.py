"""Action masks (``fastvec.action_masks``) in the trainer: masked log-probabilities and
entropies against a float64 reference that drops the invalid actions, a million samples
none of which is invalid, a masked env trained through ``fastvec train`` and evaluated
through ``fastvec eval``, the rollout's masks against the env's replayed by hand, and
each bad input's one-line error."""

from __future__ import annotations

import json

import envs
import numpy as np
import pytest
import torch
from gymnasium import spaces
from helpers import one_line_error

from fastvec.action_masks import ActionMaskObservation, check_action_mask, first_unactable
from fastvec.train import PPO, ConfigError, PPOConfig, load_checkpoint
from fastvec.train.algo.checkpoints import policy_from_checkpoint
from fastvec.train.commands.cli import main as cli_main
from fastvec.train.commands.launch import build_storage, settle_mask_source
from fastvec.train.model.actor_critic import make_policy
from fastvec.train.model.distributions import make_dist

ENV = "envs:MaskedChoiceEnv"


def _random_masks(rng, n: int, nvec) -> np.ndarray:
    """``[n, sum(nvec)]`` random masks, at least one valid choice per branch."""
    parts = []
    for k in nvec:
        m = rng.random((n, k)) < 0.4
        m[np.arange(n), rng.integers(k, size=n)] = True
        parts.append(m)
    return np.concatenate(parts, 1)


def _reference(logits: np.ndarray, mask: np.ndarray, actions: np.ndarray, nvec):
    """float64 log-probabilities and entropies over the valid choices only: per branch,
    the invalid logits dropped before the softmax."""
    logp, ent = np.zeros(len(logits)), np.zeros(len(logits))
    for b in range(len(logits)):
        col = 0
        for i, k in enumerate(nvec):
            z = logits[b, i * max(nvec) : i * max(nvec) + k].astype(np.float64)
            valid = np.flatnonzero(mask[b, col : col + k])
            zv = z[valid]
            lse = np.log(np.exp(zv - zv.max()).sum()) + zv.max()
            lp = zv - lse
            logp[b] += z[actions[b, i]] - lse
            ent[b] -= (np.exp(lp) * lp).sum()
            col += k
    return logp, ent


@pytest.mark.parametrize("nvec", [[6], [3, 5, 2]], ids=["discrete", "multidiscrete"])
def test_masked_log_prob_and_entropy_equal_a_float64_reference(nvec):
    rng = np.random.default_rng(1)
    space = spaces.Discrete(nvec[0]) if len(nvec) == 1 else spaces.MultiDiscrete(nvec)
    dist = make_dist(space, masked=True)
    B = 64
    logits = rng.normal(scale=3.0, size=(B, len(nvec) * max(nvec))).astype(np.float32)
    mask = _random_masks(rng, B, nvec)
    offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
    actions = np.stack(
        [[rng.choice(np.flatnonzero(mask[b, o : o + k])) for o, k in zip(offsets, nvec)] for b in range(B)]
    )
    ref_logp, ref_ent = _reference(logits, mask, actions, nvec)
    params = torch.tensor(logits, requires_grad=True)
    a = torch.as_tensor(actions if len(nvec) > 1 else actions[:, 0])
    logp, ent = dist.log_prob_entropy(params, a, mask=torch.as_tensor(mask))
    np.testing.assert_allclose(logp.detach().numpy(), ref_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent.detach().numpy(), ref_ent, rtol=1e-5, atol=1e-5)
    # the learner's form: each action joined with its mask gives the same numbers
    logp_j, ent_j = dist.log_prob_entropy(params, dist.join(a, torch.as_tensor(mask)))
    assert torch.equal(logp_j, logp) and torch.equal(ent_j, ent)
    # gradients are finite, and none reaches an invalid logit
    (logp.sum() + ent.sum()).backward()
    grad = params.grad.numpy()
    assert np.isfinite(grad).all()
    valid = dist.valid(torch.as_tensor(mask)).reshape(B, -1).numpy()
    assert (grad[~valid] == 0).all() and (grad[valid] != 0).any()


@pytest.mark.parametrize("nvec", [[7], [4, 3]], ids=["discrete", "multidiscrete"])
def test_a_million_sampled_actions_are_all_valid(nvec):
    """Through the policy's acting step (Discrete: the numpy actor; MultiDiscrete: torch),
    random weights and observations, a fresh random mask on every row."""
    rng = np.random.default_rng(2)
    space = spaces.Discrete(nvec[0]) if len(nvec) == 1 else spaces.MultiDiscrete(nvec)
    obs_space = spaces.Box(-1.0, 1.0, (5,), np.float32)
    torch.manual_seed(0)
    pol = make_policy(obs_space, space, action_masks=True, ortho_init=False)
    assert (pol.acting_path().numpy is not None) == (len(nvec) == 1)
    B, draws = 20_000, 50  # a million samples
    offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
    out = torch.empty((B, *pol.dist.action_shape), dtype=torch.int64)
    noise = torch.empty(pol.dist.noise_shape(B))
    seen = np.zeros(sum(nvec), bool)
    with torch.inference_mode():
        for _ in range(draws):
            obs = torch.as_tensor(rng.normal(size=(B, 5)).astype(np.float32))
            mask = _random_masks(rng, B, nvec)
            pol.act_(obs, pol.dist.sample_noise(noise), out, mask=torch.as_tensor(mask))
            picked = offsets + out.numpy().reshape(B, len(nvec))
            assert mask[np.arange(B)[:, None], picked].all()
            seen[picked.reshape(-1)] = True
    assert seen.all()  # every action is sampled somewhere (the masks do not freeze the choice)


def _train(tmp_path, capsys, *argv):
    run = tmp_path / "run"
    base = ["--total-steps", "24576", "--num-envs", "8", "--num-workers", "2", "--seed", "3", "--no-progress"]
    code = cli_main("train", [ENV, *base, "--logdir", str(run), *argv])
    out = capsys.readouterr().out
    assert code == 0, out
    return run, json.loads(out.strip().splitlines()[-1])


def _oracle_step_reward() -> float:
    """The expected reward of a step under the best policy (the highest valid action):
    the env's own mask draws, sampled."""
    env = envs.MaskedChoiceEnv()
    env.reset(seed=123)
    total = 0.0
    for _ in range(20_000):
        env._draw()
        total += (np.flatnonzero(env.mask).max() + 1) / 6
    return total / 20_000


@pytest.mark.parametrize("source", ["info", "method"])
def test_a_masked_env_trained_through_fastvec_train_and_evaluated(tmp_path, capsys, source):
    """``--action-mask auto`` settles to the env's source (recorded in the checkpoint);
    the run takes no invalid action (an invalid one would end an episode at once) and
    learns the best valid one; eval honours the masks (the policy's own choice without
    them is often invalid)."""
    run, result = _train(tmp_path, capsys, "--action-mask", "auto", "--env-kwargs", f"source={source}")
    ckpt = load_checkpoint(str(run / "checkpoint.pt"))
    assert ckpt["config"]["action_mask"] == source
    assert "+masked" in ckpt["policy"] and "+masked" in result["policy"]
    per_env = result["env_steps"] // 8
    assert result["episodes"] == 8 * (per_env // 10)  # every episode ran its 10 steps: no invalid action
    oracle = 10 * _oracle_step_reward()
    assert result["final_mean_return"] > 0.9 * oracle
    assert cli_main("eval", [str(run), "--episodes", "16"]) == 0
    ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ev["mean_length"] == 10.0
    assert ev["mean_return"] > 0.95 * oracle
    # the same policy without the masks picks invalid actions
    pol = policy_from_checkpoint(ckpt)
    env = envs.MaskedChoiceEnv(source="both")
    obs, info = env.reset(seed=0)
    invalid = 0
    for _ in range(200):
        with torch.inference_mode():
            a = int(pol.actor_params(torch.as_tensor(obs[None])).argmax())
        invalid += not info["action_mask"][a]
        act = pol.predict(obs[None], mask=info["action_mask"][None])[0]
        assert info["action_mask"][act]
        obs, _r, term, trunc, info = env.step(act)
        if term or trunc:
            obs, info = env.reset()
    assert invalid > 20


@pytest.mark.parametrize(
    "multi, settings",
    [(False, {}), (True, {}), (False, {"copies": True}), (True, {"env_groups": 2}), (False, {"policy_core": "gru"})],
    ids=["discrete", "multidiscrete", "device-copies", "batch-groups", "recurrent"],
)
def test_rollout_masks_equal_the_envs_replayed_one_by_one(multi, settings):
    """The masks stored in the rollout, and the log-probs the update starts from, against
    each env rebuilt alone, reset with the same seed and fed the same actions (acting with
    separate device buffers, by batch groups and with a recurrent core too)."""
    T, N = 40, 4
    settings = dict(settings)
    copies = settings.pop("copies", None)
    cfg = PPOConfig(num_envs=N, n_steps=T, num_workers=2, device="cpu", action_mask="info", **settings)
    kwargs = {"multi": multi, "length": 7}
    cfg = settle_mask_source(cfg, ENV, kwargs)
    storage = build_storage(ENV, cfg, env_kwargs=kwargs)
    try:
        ppo = PPO(cfg, storage, torch.device("cpu"), separate_buffers=copies)
        assert ppo.rollout.copies == bool(copies) and len(storage.groups) == cfg.env_groups
        seeds = [11, 22, 33, 44]
        storage.reset(seeds)
        ppo.collect()
        ppo.prepare()
        masks, acts = storage.action_mask.copy(), storage.act.copy()
        obs = storage.obs.copy()
        logp = ppo.rollout.logp.numpy().copy()
        if not ppo.policy.recurrent:  # (its log-probs need the states it was fed: the update's own pass)
            with torch.inference_mode():  # (before the update changes the weights)
                params = ppo.policy.actor_params(torch.as_tensor(obs[:T].reshape(T * N, -1))).numpy()
        ppo.update()  # the joined actions and masks through the minibatches (recurrent: sequences)
        assert torch.isfinite(ppo.flat_param).all() and ppo.updater.updates == 1
    finally:
        storage.close()
    nvec = [3, 4] if multi else [6]
    for i in range(N):
        env = envs.MaskedChoiceEnv(**kwargs)
        o, info = env.reset(seed=seeds[i])
        for t in range(T):
            assert np.array_equal(masks[t, i], info["action_mask"].astype(bool)), (i, t)
            assert np.array_equal(obs[t, i], o)
            o, _r, term, trunc, info = env.step(acts[t + 1, i])
            assert not term  # no invalid action was taken
            if trunc:
                o, info = env.reset()
    if ppo.policy.recurrent:
        return
    # the old log-probs: under each step's mask (float64, the invalid actions dropped)
    a = acts[1:].reshape(T * N, len(nvec))
    ref, _ = _reference(params, masks[:T].reshape(T * N, -1), a, nvec)
    np.testing.assert_allclose(logp.reshape(-1), ref, rtol=1e-4, atol=1e-4)


def test_a_step_whose_mask_allows_nothing_names_the_env(tmp_path, capsys):
    argv = [ENV, "--action-mask", "info", "--mix", "count=3", "--mix", "count=1,bad=empty", "--no-progress"]
    code = cli_main("train", [*argv, "--total-steps", "2048", "--logdir", str(tmp_path / "run")])
    one_line_error(capsys, code, "env 3's action mask allows no action")
    mask = np.ones((4, 7), bool)
    mask[2, 3:] = False  # env 2's second branch allows nothing
    assert first_unactable(mask, np.array([3, 4])) == 2
    assert first_unactable(mask, np.array([7])) is None


@pytest.mark.parametrize(
    "argv, expect",
    [
        ([ENV, "--action-mask", "method", "--env-kwargs", "source=method,bad=shape"], "has shape (5,), not (6,)"),
        (
            [ENV, "--action-mask", "info", "--env-kwargs", "bad=dtype"],
            "must hold booleans (or 0/1 integers), not float32",
        ),
        ([ENV, "--action-mask", "info", "--env-kwargs", "bad=empty_first"], "first action mask allows no action"),
        (
            [ENV, "--action-mask", "method", "--env-kwargs", "source=method,multi=true,bad=shape"],
            "not (7,) (one boolean per action",
        ),
        (["CartPole-v1", "--action-mask", "info"], 'reset gives no info["action_mask"]'),
        (["Taxi-v4", "--action-mask", "method"], "the env has no action_masks() method"),
        (["CartPole-v1", "--action-mask", "auto"], "the env gives no action mask"),
        (["Pendulum-v1", "--action-mask", "auto"], "need a Discrete or MultiDiscrete action space, not Box"),
        ([ENV, "--action-mask", "info", "--set", "pipeline=async"], "action masks need pipeline=lockstep"),
        ([ENV, "--set", "action_mask=sometimes"], "action_mask must be one of none, auto, info, method"),
    ],
)
def test_bad_input_is_one_line_before_any_worker_starts(capsys, monkeypatch, argv, expect):
    import fastvec.engine

    def no_engine(*a, **k):
        raise AssertionError("an engine started")

    monkeypatch.setattr(fastvec.engine, "Engine", no_engine)
    code = cli_main("train", [*argv, "--no-progress", "--total-steps", "1024"])
    one_line_error(capsys, code, expect)
    assert code == 2  # bad input, not a failure while training


def test_bad_input_from_python():
    import gymnasium as gym

    from fastvec.train import run_training
    from fastvec.train.model.deployed import DeployedPolicy

    venv = gym.vector.SyncVectorEnv([lambda: envs.MaskedChoiceEnv()] * 2, autoreset_mode="SameStep")
    with pytest.raises(ConfigError, match="needs an env id .* not a vector env of your own"):
        run_training(venv=venv, config=PPOConfig(action_mask="info", num_envs=2), progress=False, run_dir=None)
    venv.close()
    pol = make_policy(spaces.Box(0, 1, (6,)), spaces.Discrete(6), action_masks=True)
    obs = np.zeros((2, 6), np.float32)
    with pytest.raises(ValueError, match="trained with action masks: pass predict"):
        pol.predict(obs)
    with pytest.raises(ValueError, match=r"mask must be booleans of shape \(2, 6\)"):
        pol.predict(obs, mask=np.ones((2, 5), bool))
    with pytest.raises(ValueError, match="allows no action for env 1"):
        pol.predict(obs, mask=np.array([[1, 0, 0, 0, 0, 0], [0] * 6], bool))
    with pytest.raises(ValueError, match="not exported"):
        DeployedPolicy(pol)
    with pytest.raises(ValueError, match="need a Discrete or MultiDiscrete action space"):
        make_policy(spaces.Box(0, 1, (6,)), spaces.Box(-1, 1, (2,)), action_masks=True)
    with pytest.raises(ValueError, match="the env has no action_masks"):
        check_action_mask(lambda: envs.MaskedChoiceEnv(source="info"), "method")
    env = ActionMaskObservation(envs.MaskedChoiceEnv(source="method", bad="shape"), "method")
    with pytest.raises(ValueError, match=r"has shape \(5,\), not \(6,\)"):
        env.reset(seed=0)
