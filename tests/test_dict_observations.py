"""Dict and Tuple observations in the trainer (``fastvec.train.model.observations``):
the multi-input policy against the same weights applied by hand to leaves flattened and
one-hot encoded in numpy; the leaves acting and learning read are views of the engine's
ring; the per-leaf normaliser against a float64 reference; a goal-reaching Dict env of
the user's trained by ``fastvec train module:EnvId`` from a fresh shell past what a
policy blind to one leaf can return; a nested Dict(Tuple) trained, checkpointed and
reloaded; and every leaf or setting the trainer cannot serve refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import DictTupleEnv, GoalRingEnv
from gymnasium import spaces
from helpers import engine_storage

import fastvec
from fastvec._core.segment import leaves_of
from fastvec.train import PPO, PPOConfig, load_checkpoint
from fastvec.train.algo.checkpoints import policy_from_checkpoint
from fastvec.train.commands.evaluate import evaluate
from fastvec.train.commands.launch import run_training
from fastvec.train.model.actor_critic import MultiInputActorCritic, make_policy
from fastvec.train.model.observations import Leaves, batch_leaves
from fastvec.train.pipelines.ring import start_where_left

ROOT = Path(fastvec.__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
GOAL_ID = "envs:FvGoalRing-v0"


def _batch(space, n: int, seed: int):
    """``n`` observations of ``space`` stacked as gymnasium's vector envs give them."""
    space.seed(seed)
    return gym.vector.utils.concatenate(
        space, [space.sample() for _ in range(n)], gym.vector.utils.create_empty_array(space, n)
    )


def _hand_input(space, batch, pol) -> np.ndarray:
    """The policy's input built by hand (float64): leaf by leaf in the space's order, a
    Box flattened (and normalised with its leaf's statistics where the policy keeps
    them), Discrete and MultiDiscrete one-hot, MultiBinary as 0/1, an image through the
    policy's own CNN (the same weights) after scaling to [0, 1]."""
    cols = []
    for i, leaf in enumerate(leaves_of(space)):
        x = batch
        for k in leaf.path:
            x = x[k]
        x, sp, n = np.asarray(x), leaf.space, len(np.asarray(x))
        if isinstance(sp, spaces.Box) and sp.dtype == np.uint8 and len(sp.shape) == 3:
            img = torch.from_numpy(x).permute(0, 3, 1, 2).double() / 255.0
            cnn = pol.extractor.cnns[str(i)].double()
            cols.append(cnn(img).detach().numpy())
            pol.extractor.cnns[str(i)].float()
        elif isinstance(sp, spaces.Box):
            v = x.reshape(n, -1).astype(np.float64)
            norm = pol.extractor.norms[str(i)]
            mean, var = norm.mean.numpy(), norm.var.numpy()
            cols.append(np.clip((v - mean) / np.sqrt(var + 1e-8), -10.0, 10.0))
        elif isinstance(sp, spaces.Discrete):
            cols.append(np.eye(sp.n)[x.reshape(n) - sp.start])
        elif isinstance(sp, spaces.MultiDiscrete):
            cols += [np.eye(k)[x.reshape(n, -1)[:, j]] for j, k in enumerate(sp.nvec.reshape(-1))]
        else:
            cols.append(x.reshape(n, -1).astype(np.float64))
    return np.concatenate(cols, 1)


def _mlp(x: np.ndarray, body, head) -> np.ndarray:
    for layer in [*body.encoder, head]:
        if isinstance(layer, torch.nn.Linear):
            x = x @ layer.weight.detach().double().numpy().T + layer.bias.detach().double().numpy()
        else:
            x = np.tanh(x)
    return x


IMAGE_AND_VECTOR = spaces.Dict(
    {
        "cam": spaces.Box(0, 255, (36, 36, 3), np.uint8),
        "state": spaces.Tuple((spaces.Box(-3.0, 3.0, (2, 2), np.float32), spaces.MultiBinary(3))),
    }
)


@pytest.mark.parametrize("which", ["nested", "image"])
def test_policy_equals_the_same_weights_on_leaves_fed_by_hand(which):
    """Parameters and values of the multi-input policy on a batch of ``Leaves`` equal,
    to float tolerance, the same weights applied (float64, numpy) to the input built by
    hand from the leaves; ``predict`` takes gymnasium's nested batch the same way."""
    obs_space = DictTupleEnv().observation_space if which == "nested" else IMAGE_AND_VECTOR
    torch.manual_seed(0)
    pol = make_policy(obs_space, spaces.Discrete(5), normalize_obs=True)
    assert isinstance(pol, MultiInputActorCritic)
    batch = _batch(obs_space, 32, seed=3)
    leaves = batch_leaves(obs_space, batch).map(torch.from_numpy)
    pol.update_obs_norm(leaves)  # statistics of their own, not the identity
    pol.update_obs_norm(batch_leaves(obs_space, _batch(obs_space, 7, seed=4)).map(torch.from_numpy))
    with torch.no_grad():
        params, value = pol.params_and_value(leaves)
    x = _hand_input(obs_space, batch, pol)
    assert x.shape == (32, pol.obs_dim)
    np.testing.assert_allclose(params.numpy(), _mlp(x, pol.actor_body, pol.actor_head), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(value.numpy(), _mlp(x, pol.critic_body, pol.critic_head)[:, 0], rtol=1e-4, atol=1e-5)
    best = _mlp(x, pol.actor_body, pol.actor_head).argmax(1)
    np.testing.assert_array_equal(pol.predict(batch, deterministic=True), best)


def _collect_watched(env_fn, T: int, N: int, **cfg_kw):
    """A PPO over a forked engine of ``N`` ``env_fn`` envs whose acting step records the
    observations it was given; one rollout collected and prepared."""
    cfg = PPOConfig(num_envs=N, n_steps=T, num_workers=2, device="cpu", **cfg_kw)
    storage = engine_storage([env_fn] * N, T + 1, 2)
    try:
        ppo = PPO(cfg, storage, torch.device("cpu"))
    except BaseException:
        storage.close()
        raise
    given = []
    act = ppo.policy.act_

    def watching(obs, *args, **kwargs):
        given.append(obs)
        return act(obs, *args, **kwargs)

    ppo.policy.act_ = watching
    try:
        storage.reset(0)
        ppo.collect()
    except BaseException:
        storage.close()
        raise
    return ppo, storage, given


def test_leaves_are_views_of_the_ring():
    """Each leaf acting is given at step t, and each leaf the learner's batch holds, is a
    view of that leaf's own array in the engine's ring (slot t; slots 0..T-1)."""
    T, N = 6, 4
    ppo, storage, given = _collect_watched(DictTupleEnv, T, N)
    try:
        bufs = storage.engine.obs_bufs
        assert len(given) == T and len(bufs) == 7
        for t, obs in enumerate(given):
            assert isinstance(obs, Leaves) and len(obs.leaves) == len(bufs)
            for leaf, buf in zip(obs.leaves, bufs):
                assert np.shares_memory(leaf.numpy(), buf[t])
                assert leaf.data_ptr() == buf[t].ctypes.data
        batch = ppo.rollout.batch_obs()
        for leaf, buf in zip(batch.leaves, bufs):
            assert leaf.data_ptr() == buf.ctypes.data and np.shares_memory(leaf.numpy(), buf)
            np.testing.assert_array_equal(leaf.numpy(), buf[:T].reshape(T * N, *buf.shape[2:]))
    finally:
        storage.close()


def test_per_leaf_normaliser_matches_a_float64_reference():
    """After one rollout's targets each vector Box leaf's running mean and variance
    equal a float64 computation over that leaf's collected slots 1..T (merged with the
    normaliser's prior: mean 0, variance 1, count 1e-4); discrete leaves keep none."""
    T, N = 8, 4
    ppo, storage, _ = _collect_watched(DictTupleEnv, T, N, normalize_obs=True)
    try:
        ppo.prepare()
        ext = ppo.policy.extractor
        boxes = [i for i, k in enumerate(ext.kinds) if k == "box"]
        assert sorted(int(k) for k in ext.norms) == boxes and len(boxes) == 3
        for i in boxes:
            x = storage.engine.obs_bufs[i][1:].reshape(T * N, -1).astype(np.float64)
            n, prior = len(x), 1e-4
            mean = x.sum(0) / (n + prior)
            m2 = prior * 1.0 + ((x - x.mean(0)) ** 2).sum(0) + x.mean(0) ** 2 * prior * n / (n + prior)
            np.testing.assert_allclose(ext.norms[str(i)].mean.numpy(), mean, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(ext.norms[str(i)].var.numpy(), m2 / (n + prior), rtol=1e-10)
    finally:
        storage.close()


def _fastvec(args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, "-m", "fastvec", *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_goal_ring_trained_by_name_from_a_fresh_shell(tmp_path):
    """``fastvec train envs:FvGoalRing-v0`` (a Dict of a Box, two Discretes) from a fresh
    interpreter: a policy that ignores ``pos`` or ``goal`` lands by chance, an expected
    return of 8 / 4 = 2; the trained one returns at least twice that, in training and
    under ``fastvec eval`` (deterministic, its own env seeds)."""
    run = tmp_path / "goal"
    args = ["train", GOAL_ID, "--total-steps", "60000", "--seed", "1", "--num-envs", "8", "--num-workers", "1"]
    args += ["--no-progress", "--no-tensorboard", "--device", "cpu", "--logdir", str(run)]
    args += ["--set", "n_steps=64", "--set", "minibatch_size=128", "--set", "lr=0.001"]
    res = _fastvec(args, tmp_path)
    assert res["final_mean_return"] >= 4.0, res["final_mean_return"]
    ev = _fastvec(["eval", str(run), "--episodes", "20"], tmp_path)
    assert ev["mean_return"] >= 4.0, ev


@pytest.mark.parametrize("core", ["none", "lstm"])
def test_nested_dict_tuple_trains_reloads_and_evaluates(tmp_path, core):
    """A nested Dict(..., Tuple(Box, Discrete)) with every leaf kind trains (feed-forward
    and recurrent, observations normalised); its checkpoint's policy holds the trained
    normaliser's statistics (not the prior) and acts as the trained one did on the same
    leaves; ``fastvec eval``'s function runs it on gymnasium's nested batches."""
    cfg = PPOConfig(num_envs=4, n_steps=16, minibatch_size=32, n_epochs=2, total_steps=512, num_workers=1)
    cfg.normalize_obs, cfg.device, cfg.policy_core, cfg.core_size = True, "cpu", core, 16
    res = run_training("envs:make_dict_env", cfg, run_dir=str(tmp_path), progress=False, tensorboard=False)
    assert res["env_steps"] == 512
    ckpt = load_checkpoint(str(tmp_path))
    pol = policy_from_checkpoint(ckpt)
    assert len(pol.extractor.norms) == 3  # box, scalar and the tuple's Box
    for key, norm in pol.extractor.norms.items():
        saved = ckpt["state_dict"][f"extractor.norms.{key}.mean"]
        assert float(norm.count) > 100 and torch.equal(norm.mean, saved) and saved.abs().sum() > 0
    fresh = make_policy(pol.obs_space, pol.act_space, normalize_obs=True, core=core, core_size=16)
    fresh.load_state_dict(ckpt["state_dict"])
    batch = batch_leaves(pol.obs_space, _batch(pol.obs_space, 5, seed=2)).map(torch.from_numpy)
    state = torch.zeros(5, pol.state_size) if core != "none" else None
    with torch.no_grad():
        if core == "none":
            torch.testing.assert_close(pol.actor_params(batch), fresh.actor_params(batch))
        acts = pol.predict(batch, state=None if state is None else state.clone())
        np.testing.assert_array_equal(acts, fresh.predict(batch, state=None if state is None else state.clone()))
    ev = evaluate(ckpt, episodes=4)
    assert ev["episodes"] == 4 and 3 <= ev["mean_length"] <= 9  # DictTupleEnv's episodes: 3 to 9 steps


@pytest.mark.parametrize(
    "extra, expect",
    [
        (spaces.Text(5), "cannot encode obs['extra'], a Text space"),
        (spaces.Sequence(spaces.Discrete(2)), "cannot encode obs['extra'], a Sequence space"),
        (spaces.Box(0.0, 1.0, (3, 40, 40), np.float32), "cannot tell whether obs['extra']"),
    ],
)
def test_unsupported_leaves_are_refused_in_one_line(extra, expect):
    """A leaf the trainer cannot encode: one line naming its key path and the wrapper
    that would serve, from the policy and from a run (its engine closed again)."""
    space = GoalRingEnv(extra=extra).observation_space
    with pytest.raises(ValueError) as e:
        make_policy(space, spaces.Discrete(4))
    msg = str(e.value)
    assert expect in msg and "\n" not in msg
    assert "FilterObservation" in msg or "TransformObservation" in msg
    cfg = PPOConfig(num_envs=2, n_steps=8, total_steps=16, num_workers=1, device="cpu")
    with pytest.raises(ValueError) as e:
        run_training(
            "envs:GoalRingEnv", cfg, env_kwargs={"extra": extra}, save=False, progress=False, tensorboard=False
        )
    msg = str(e.value)  # (the engine's own refusal where the leaf has no place in shared memory)
    assert ("obs['extra']" in msg or "(at extra)" in msg) and "\n" not in msg, msg
    assert "FilterObservation" in msg or "TransformObservation" in msg


def test_what_is_not_built_for_dict_observations_is_refused():
    """The async pipeline and export refuse a Dict observation in one line each."""
    cfg = PPOConfig(num_envs=2, n_steps=8, total_steps=64, num_workers=1, device="cpu", pipeline="async")
    with pytest.raises(ValueError, match="pipeline=async does not carry Dict/Tuple observations yet"):
        run_training(GOAL_ID, cfg, save=False, progress=False, tensorboard=False)
    from fastvec.train.model.deployed import DeployedPolicy

    with pytest.raises(ValueError, match="does not export Dict/Tuple-observation policies"):
        DeployedPolicy(make_policy(GoalRingEnv().observation_space, spaces.Discrete(4)))


def test_separate_device_buffers_train_as_zero_copy():
    """The GPU's path on the CPU (each leaf copied slot by slot into buffers of its own,
    ``separate_buffers=True``) trains a nested Dict env bit for bit as zero copy, the
    normaliser's statistics and truncation bootstraps included."""
    T, N = 8, 4
    weights = []
    for separate in (False, True):
        torch.manual_seed(0)
        cfg = PPOConfig(num_envs=N, n_steps=T, minibatch_size=16, num_workers=2, device="cpu", normalize_obs=True)
        storage = engine_storage([DictTupleEnv] * N, T + 1, 2)
        try:
            ppo = PPO(cfg, storage, torch.device("cpu"), separate_buffers=separate)
            assert ppo.rollout.copies is separate
            storage.reset(0)
            for _ in range(3):
                ppo.collect()
                ppo.prepare()
                ppo.update()
                start_where_left(storage, storage, T)  # (as the lock-step schedule does)
                for buf in storage.engine.obs_bufs:
                    np.testing.assert_array_equal(buf[0], buf[T])
            weights.append({k: v.clone() for k, v in ppo.policy.state_dict().items()})
        finally:
            storage.close()
    assert weights[0].keys() == weights[1].keys()
    for k in weights[0]:
        assert torch.equal(weights[0][k], weights[1][k]), k
