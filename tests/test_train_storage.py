"""Where the trainer's rollouts come from (``fastvec.train.storage``): views of the
engine's shared memory (zero copy), and other vector envs (gymnasium's, SB3's) giving
the same training as the engine on the same seeds, or refused where they cannot."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import engine_storage

from fastvec.options import available_cores
from fastvec.train import PPO, ConfigError, PPOConfig, apply_overrides
from fastvec.train.commands.cli import run_training as train
from fastvec.train.config.presets import env_factory, preset_for
from fastvec.train.config.seeding import env_seeds
from fastvec.train.run import loop


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


def test_same_trajectories_on_sb3_vec_env(monkeypatch):
    """SB3's VecEnv API (terminal_observation / TimeLimit.truncated in the infos). Its
    ``seed(s)`` takes one int (env i: ``s + i``, s the rule's seed of env 0): the engine's
    run is given the same seeds."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv

    cfg = apply_overrides(PPOConfig(), preset_for("CartPole-v1"))
    apply_overrides(cfg, ["total_steps=3000", "seed=5", "device=cpu", "num_envs=4"])
    fn = env_factory("CartPole-v1", {"max_episode_steps": 60})  # truncations happen
    first = env_seeds(5, 0, 1)[0]
    with monkeypatch.context() as m:
        m.setattr(loop, "env_seeds", lambda seed, a, n, **kw: [first + i for i in range(a, a + n)])
        a = train("CartPole-v1", cfg, env_kwargs={"max_episode_steps": 60}, progress=False)
    venv = DummyVecEnv([fn] * cfg.num_envs)
    try:
        b = train(None, cfg, venv=venv, progress=False)
    finally:
        venv.close()
    assert b["backend"] == "subproc"
    assert a["episodes"] == b["episodes"]
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


def test_vec_env_without_final_observations_is_refused():
    import pathlib

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
