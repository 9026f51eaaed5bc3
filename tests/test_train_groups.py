"""The trainer with batch groups (``PPOConfig.env_groups``): while one group of envs
steps in its workers, the policy acts on another.

References: the same trainer in lock-step (same seeds: the same rollouts, up to the
rounding of smaller batches) and a replay of each env's actions on a single env
(observations, rewards, flags, final observations, step by step).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from fastvec.engine import Engine
from fastvec.train import PPO, ConfigError, EngineStorage, PPOConfig, apply_overrides
from fastvec.train.commands.cli import build_storage
from fastvec.train.commands.cli import run_training as train
from fastvec.train.config.presets import env_factory, preset_for


def _cartpole():
    return gym.make("CartPole-v1")


def _pendulum():
    return gym.make("Pendulum-v1", max_episode_steps=20)  # truncations inside a rollout


def _rollouts(env_fn, groups, *, num_envs=8, workers=2, T=24, rollouts=3, seed=5):
    """``rollouts`` rollouts of an untrained policy: copies of the storage's arrays."""
    cfg = PPOConfig(num_envs=num_envs, n_steps=T, device="cpu", seed=seed, env_groups=groups)
    torch.manual_seed(seed)
    storage = EngineStorage(
        Engine([env_fn] * num_envs, num_workers=workers, num_slots=T + 1, autoreset_mode="same_step", context="fork"),
        groups=groups,
    )
    try:
        ppo = PPO(cfg, storage, torch.device("cpu"))
        with torch.no_grad():  # logits well above the sampling noise: actions depend on what the policy sees
            ppo.policy.actor_head.weight.mul_(300.0)
        storage.reset(seed)
        out = []
        for _ in range(rollouts):
            ppo.collect()
            ended = storage.terminated | storage.truncated
            out.append(
                {
                    "obs": storage.obs.copy(),
                    "act": storage.act.copy(),
                    "rewards": storage.rewards.copy(),
                    "terminated": storage.terminated.copy(),
                    "truncated": storage.truncated.copy(),
                    "final_obs": np.where(
                        ended.reshape(ended.shape + (1,) * (storage.obs.ndim - 2)), storage.final_obs, 0
                    ),
                }
            )
            ppo.rollout.obs[0].copy_(ppo.rollout.obs[T])
        return out
    finally:
        storage.close()


def _replay(env_fn, rollouts, seed):
    """Each env alone, on the actions the trainer gave it: the trainer's arrays match."""
    n = rollouts[0]["obs"].shape[1]
    for i in range(n):
        env = env_fn()
        obs, _ = env.reset(seed=seed + i)
        for r, ro in enumerate(rollouts):
            np.testing.assert_array_equal(ro["obs"][0, i], obs, err_msg=f"env {i}, rollout {r}, step 0")
            for t in range(1, ro["obs"].shape[0]):
                where = f"env {i}, rollout {r}, step {t}"
                obs, rew, term, trunc, _ = env.step(ro["act"][t, i])
                assert ro["rewards"][t, i] == rew, where
                assert (ro["terminated"][t, i], ro["truncated"][t, i]) == (term, trunc), where
                if term or trunc:
                    np.testing.assert_array_equal(ro["final_obs"][t, i], obs, err_msg=where)
                    obs, _ = env.reset()
                np.testing.assert_array_equal(ro["obs"][t, i], obs, err_msg=where)
        env.close()


@pytest.mark.parametrize("groups,workers", [(2, 2), (4, 4), (2, 4)])
def test_group_rollouts_replay_on_single_envs_and_match_lockstep(groups, workers):
    """CartPole (episodes end inside rollouts): every env's data replays exactly, and
    the rollouts are the lock-step trainer's (discrete actions: equal)."""
    got = _rollouts(_cartpole, groups, workers=workers)
    _replay(_cartpole, got, seed=5)
    ref = _rollouts(_cartpole, 1, workers=workers)
    assert sum(int(r["terminated"].sum()) for r in got) > 0  # the replay saw episode ends
    for g, r in zip(got, ref):
        for key in g:
            np.testing.assert_array_equal(g[key], r[key], err_msg=key)


def test_group_rollouts_with_gaussian_actions_and_truncation():
    """Pendulum with a 20-step limit (truncations inside rollouts, final observations):
    exact replay on single envs; lock-step's rollouts up to float rounding."""
    got = _rollouts(_pendulum, 2)
    _replay(_pendulum, got, seed=5)
    assert sum(int(r["truncated"].sum()) for r in got) > 0
    ref = _rollouts(_pendulum, 1)
    for g, r in zip(got, ref):
        for key in g:
            np.testing.assert_allclose(g[key], r[key], rtol=1e-4, atol=1e-4, err_msg=key)


def _lockstep_and_groups(device: str, total_steps: int, seed: int):
    """The CartPole preset trained in lock-step, then with 2 batch groups: the same
    episodes and the same final mean return."""
    cfg = apply_overrides(PPOConfig(), preset_for("CartPole-v1"))
    apply_overrides(cfg, [f"total_steps={total_steps}", f"seed={seed}", f"device={device}", "num_workers=2"])
    a = train("CartPole-v1", cfg, progress=False, save=False, tensorboard=False)
    apply_overrides(cfg, ["env_groups=2"])
    b = train("CartPole-v1", cfg, progress=False, save=False, tensorboard=False)
    assert (a["env_steps"], a["episodes"]) == (b["env_steps"], b["episodes"])
    assert a["final_mean_return"] == pytest.approx(b["final_mean_return"])
    assert (a["env_groups"], b["env_groups"], b["num_workers"]) == (1, 2, 2)
    return a, b


def test_training_with_groups_learns_as_lockstep():
    _lockstep_and_groups("cpu", 6000, seed=2)


class _DiesSometimes(gym.Wrapper):
    """CartPole whose process exits at its 150th step (once per env process)."""

    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == 150:
            raise RuntimeError("injected failure")
        return self.env.step(action)


def test_groups_survive_a_restart():
    """An env raising with restart_on_error: its worker is replaced, the other group's
    step in flight is unharmed, the run completes and counts the restart."""
    gym.register("FastvecTestGroupsFlaky-v0", entry_point=_DiesSometimes)
    try:
        cfg = PPOConfig(num_envs=4, num_workers=2, n_steps=64, total_steps=2048, device="cpu", env_groups=2, seed=0)
        with pytest.warns(RuntimeWarning, match="restarted"):
            res = train("FastvecTestGroupsFlaky-v0", cfg, progress=False, save=False, tensorboard=False)
    finally:
        gym.registry.pop("FastvecTestGroupsFlaky-v0", None)
    assert res["env_steps"] >= 2048 and res["restarts"] >= 1, res


def test_bad_env_groups():
    with pytest.raises(ConfigError, match="env_groups must be a positive integer"):
        PPOConfig(env_groups=0).validate()
    with pytest.raises(ConfigError, match="env_groups must be a positive integer"):
        PPOConfig(env_groups=True).validate()
    with pytest.raises(ConfigError, match="env_groups=3 must divide num_envs=8"):
        PPOConfig(num_envs=8, env_groups=3).validate()
    with pytest.raises(ConfigError, match="num_workers=3 must be a multiple of env_groups=2"):
        build_storage("CartPole-v1", PPOConfig(num_envs=6, num_workers=3, env_groups=2).validate())
    with pytest.raises(ConfigError, match="env_groups=2 needs the engine backend: Ray"):
        build_storage("CartPole-v1", PPOConfig(env_groups=2).validate(), backend="ray")
    venv = gym.vector.SyncVectorEnv([env_factory("CartPole-v1")] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        with pytest.raises(ConfigError, match="a vector env of your own"):
            train(
                None,
                PPOConfig(num_envs=2, n_steps=4, total_steps=8, device="cpu", env_groups=2),
                venv=venv,
                progress=False,
            )
    finally:
        venv.close()
    eng = Engine([_cartpole] * 4, num_workers=1, num_slots=3, autoreset_mode="same_step", context="fork")
    with pytest.raises(ValueError, match=r"envs \[0, 2\) are not whole workers' envs"):
        EngineStorage(eng, groups=2)  # closes the engine it refuses
    assert eng.closed


# ============================================================================ busy fraction
def test_busy_fraction_on_cpu_is_the_trainers_compute_share(tmp_path):
    """CPU: the busy fraction of each logging interval is the trainer's compute
    (acting + targets + learning) over that interval's wall time, from the same
    counters the time/* scalars report; the run's fraction is in the result."""
    import json

    cfg = apply_overrides(PPOConfig(), preset_for("CartPole-v1"))
    apply_overrides(
        cfg, ["total_steps=24000", "seed=0", "device=cpu", "log_every_s=0.05", "env_groups=2", "num_workers=2"]
    )
    res = train("CartPole-v1", cfg, run_dir=str(tmp_path / "run"), progress=False, tensorboard=False)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    timed = [r for r in rows if "device/busy_fraction" in r]
    assert len(timed) >= 3
    for prev, row in zip(timed, timed[1:]):
        compute = sum(row[f"time/{k}_s"] - prev[f"time/{k}_s"] for k in ("act", "prepare", "learn"))
        wall = row["time/wall_s"] - prev["time/wall_s"]
        assert row["device/busy_fraction"] == pytest.approx(min(1.0, compute / wall), rel=0.05, abs=0.02)
    assert 0.0 < res["device_busy_fraction"] <= 1.0
    # The run's fraction covers the time from the start of training to its end, not the
    # engine's close after it (which the result's wall time counts): at most the whole
    # run's compute over the time to the last logging point, which it covers.
    t = res["time_breakdown"]
    covered = timed[-1]["time/wall_s"] - res["startup_seconds"]
    assert res["device_busy_fraction"] <= (t["act"] + t["prepare"] + t["learn"]) / covered + 0.02


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_groups_and_busy_fraction_on_cuda():
    """CUDA: batch groups copy each group's rows to the device and back (the same run as
    lock-step on CUDA), and the busy fraction comes from CUDA events, in (0, 1]."""
    for r in _lockstep_and_groups("cuda", 4000, seed=1):
        assert r["device"].startswith("cuda") and 0.0 < r["device_busy_fraction"] <= 1.0
