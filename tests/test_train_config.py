"""The trainer's configuration and its storage protocol.

``PPOConfig`` keeps the transport settings (``context``, ``spin_us``, ``main_spin_us``,
``env_groups``) in a ``TransportConfig`` of their own; ``--set``, the constructor, the
flat attributes and checkpoints written before the split work as they did. Every
rollout storage implements ``RolloutStorage``: what the loop and PPO use of it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import types

import gymnasium as gym
import numpy as np
import pytest

from fastvec.train import (
    PPO,
    ConfigError,
    EngineStorage,
    GymVectorStorage,
    PPOConfig,
    RolloutStorage,
    SB3VecStorage,
    TransportConfig,
    apply_overrides,
)
from fastvec.train.commands.cli import _train_parser
from fastvec.train.commands.cli import main as cli_main
from fastvec.train.config.overrides import FIELD_KINDS, SAFE_ON_RESUME, check_resume_config
from fastvec.train.config.settings import TRANSPORT_KEYS
from fastvec.train.storage.sources import RayEngineStorage

# A checkpoint's config as fastvec wrote it before the transport settings had a class
# of their own: one flat dict, the transport keys after total_steps.
OLD_CONFIG = {
    "num_envs": 4,
    "num_workers": 2,
    "n_steps": 64,
    "total_steps": 20000,
    "context": "spawn",
    "spin_us": 50.0,
    "main_spin_us": 0.0,
    "env_groups": 2,
    "lr": 0.001,
    "anneal_lr": True,
    "n_epochs": 4,
    "minibatch_size": 64,
    "max_grad_norm": 0.5,
    "adam_eps": 1e-05,
    "target_kl": None,
    "gamma": 0.98,
    "gae_lambda": 0.95,
    "clip_coef": 0.2,
    "anneal_clip": False,
    "clip_vf": None,
    "ent_coef": 0.0,
    "vf_coef": 0.5,
    "norm_adv": True,
    "hidden": [32, 32],
    "activation": "tanh",
    "ortho_init": True,
    "log_std_init": 0.0,
    "normalize_obs": False,
    "normalize_reward": False,
    "seed": 3,
    "device": "cpu",
    "torch_threads": None,
    "learn_threads": None,
    "learner": "auto",
    "stop_at_return": None,
    "solve_return": None,
    "return_window": 20,
    "log_every_s": 1.0,
    "checkpoint_every": 100000,
    "keep_checkpoints": 3,
    "restart_on_error": True,
    "max_restarts": 20,
    "restart_window": 50000,
    "step_timeout": 300.0,
}


# =============================================================================== the config
def test_old_flat_config_loads_and_is_written_back_the_same():
    cfg = PPOConfig.from_dict(OLD_CONFIG)
    assert cfg.transport == TransportConfig(
        num_workers=2, context="spawn", spin_us=50.0, main_spin_us=0.0, env_groups=2
    )
    assert (cfg.num_envs, cfg.n_steps, cfg.hidden, cfg.gamma, cfg.seed) == (4, 64, (32, 32), 0.98, 3)
    assert cfg.validate() is cfg
    out = cfg.to_dict()
    assert {k: out[k] for k in OLD_CONFIG} == OLD_CONFIG
    assert [k for k in out if k in OLD_CONFIG] == list(OLD_CONFIG)  # the same keys, in the same order
    defaults = PPOConfig().to_dict()  # keys added since the dict was written: their defaults
    assert {k: out[k] for k in out if k not in OLD_CONFIG} == {k: defaults[k] for k in out if k not in OLD_CONFIG}
    assert list(FIELD_KINDS) == list(out)


def test_nested_transport_dict_loads_too():
    d = {k: v for k, v in OLD_CONFIG.items() if k not in TRANSPORT_KEYS}
    d["transport"] = {"context": "forkserver", "env_groups": 4}
    cfg = PPOConfig.from_dict(d)
    assert cfg.transport == TransportConfig(context="forkserver", env_groups=4)


def test_a_config_written_before_a_key_existed_gets_its_default():
    d = {k: v for k, v in OLD_CONFIG.items() if k not in ("main_spin_us", "env_groups")}
    cfg = PPOConfig.from_dict(d)
    assert (cfg.context, cfg.spin_us, cfg.main_spin_us, cfg.env_groups) == ("spawn", 50.0, None, 1)


@pytest.mark.parametrize(
    "d, bad",
    [
        ({**OLD_CONFIG, "spin": 3}, "['spin']"),
        ({"transport": {"context": "fork", "doorbell": 1}}, "['doorbell']"),
    ],
)
def test_unknown_config_keys_are_refused(d, bad):
    with pytest.raises(ConfigError, match=rf"unknown config keys \{bad}\ .*another fastvec version"):
        PPOConfig.from_dict(d)


def test_transport_keys_flat_on_the_config():
    cfg = PPOConfig(num_envs=4, context="spawn", env_groups=2)
    assert (cfg.context, cfg.env_groups, cfg.spin_us) == ("spawn", 2, None)
    assert cfg.transport == TransportConfig(context="spawn", env_groups=2)
    cfg.spin_us = 20.0
    cfg.main_spin_us = 5.0
    assert cfg.transport == TransportConfig(context="spawn", spin_us=20.0, main_spin_us=5.0, env_groups=2)
    # every config owns its transport, as it owned its flat fields
    other = copy.copy(cfg)
    other.env_groups = 1
    replaced = dataclasses.replace(cfg, lr=1e-3)
    replaced.context = "forkserver"
    given = TransportConfig(env_groups=4)
    from_given = PPOConfig(num_envs=8, transport=given)
    from_given.env_groups = 8
    assert (cfg.env_groups, cfg.context, given.env_groups) == (2, "spawn", 4)
    assert cfg == PPOConfig(num_envs=4, context="spawn", env_groups=2, spin_us=20.0, main_spin_us=5.0)
    assert cfg != other


def test_transport_keys_validate_with_the_same_messages():
    for kw, msg in [
        ({"env_groups": 0}, "env_groups must be a positive integer"),
        ({"num_envs": 8, "env_groups": 3}, "env_groups=3 must divide num_envs=8"),
        ({"spin_us": -1.0}, "spin_us must be in"),
        ({"main_spin_us": 1e6}, "main_spin_us must be in"),
        ({"context": "thread"}, "context must be one of"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            PPOConfig(**kw).validate()


def test_set_reaches_transport_keys():
    cfg = apply_overrides(PPOConfig(), ["context=spawn", "spin-us=20", "main_spin_us=none", "env_groups=2"])
    assert cfg.transport == TransportConfig(context="spawn", spin_us=20.0, main_spin_us=None, env_groups=2)
    with pytest.raises(ConfigError, match=r"bad value for spin_us: 'fast' \(expected a number or none\)"):
        apply_overrides(PPOConfig(), ["spin_us=fast"])


def test_unknown_set_key_still_errors_clearly():
    with pytest.raises(
        ConfigError,
        match=r"unknown --set key 'spin' \(did you mean spin_us, main_spin_us\?\); "
        r"known keys: .*context.*env_groups",
    ):
        apply_overrides(PPOConfig(), ["spin=20"])
    with pytest.raises(ConfigError, match="unknown config key 'transport'"):
        apply_overrides(PPOConfig(), {"transport": TransportConfig()})


def test_cli_set_and_help_with_transport_keys(capsys):
    assert (
        cli_main(
            "train",
            ["CartPole-v1", "--set", "context=spawn", "--set", "spin_us=20", "--set", "env_groups=1", "--list-keys"],
        )
        == 0
    )
    keys = json.loads(capsys.readouterr().out)
    assert list(keys) == list(FIELD_KINDS)
    assert (keys["context"], keys["spin_us"], keys["main_spin_us"], keys["env_groups"]) == ("spawn", 20.0, None, 1)
    assert cli_main("train", ["CartPole-v1", "--set", "spinus=20"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fastvec train: error: unknown --set key 'spinus'") and "\n" not in err
    assert cli_main("train", ["CartPole-v1", "--set", "context=thread"]) == 2
    assert "context must be one of" in capsys.readouterr().err
    help_text = " ".join(_train_parser().format_help().split())
    assert "TransportConfig" in help_text and "context, spin_us, main_spin_us, env_groups" in help_text


def test_transport_is_safe_to_change_on_resume():
    assert set(TRANSPORT_KEYS) <= SAFE_ON_RESUME
    run = PPOConfig.from_dict(OLD_CONFIG)
    new = PPOConfig.from_dict(OLD_CONFIG)
    new.transport = TransportConfig()
    check_resume_config(run, new)
    new.n_steps = 32
    with pytest.raises(ConfigError, match=r"cannot change n_steps \(64 -> 32\)"):
        check_resume_config(run, new)


def test_overrides_parse_types_and_reject_bad_input():
    cfg = apply_overrides(
        PPOConfig(),
        [
            "lr=1e-3",
            "n_steps=64",
            "hidden=32,16",
            "anneal_lr=false",
            "target_kl=none",
            "clip_vf=0.2",
            "num_workers=none",
            "total_steps=1e5",
        ],
    )
    assert cfg.lr == 1e-3 and cfg.n_steps == 64 and cfg.hidden == (32, 16) and cfg.anneal_lr is False
    assert cfg.target_kl is None and cfg.clip_vf == 0.2 and cfg.num_workers is None and cfg.total_steps == 100000
    with pytest.raises(ConfigError, match="unknown --set key 'learning_rate'"):
        apply_overrides(PPOConfig(), ["learning_rate=1"])
    with pytest.raises(ConfigError, match="bad value for n_steps"):
        apply_overrides(PPOConfig(), ["n_steps=abc"])
    with pytest.raises(ConfigError, match="bad value for n_steps"):
        apply_overrides(PPOConfig(), ["n_steps=1.5"])
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides(PPOConfig(), ["lr"])
    with pytest.raises(ConfigError, match="gamma"):
        apply_overrides(PPOConfig(), ["gamma=2"]).validate()
    with pytest.raises(ConfigError, match="n_steps"):
        apply_overrides(PPOConfig(), ["n_steps=0"]).validate()
    assert apply_overrides(PPOConfig(), ["step_timeout=none"]).validate().step_timeout is None
    assert apply_overrides(PPOConfig(), ["step_timeout=30"]).validate().step_timeout == 30.0
    for bad in ("0", "-1", "inf"):
        with pytest.raises(ConfigError, match="step_timeout must be a positive number or none"):
            apply_overrides(PPOConfig(), [f"step_timeout={bad}"]).validate()
    with pytest.raises(ConfigError, match="bad value for step_timeout"):
        apply_overrides(PPOConfig(), ["step_timeout=nan"])


# =============================================================================== the storage protocol
def _same_step_venv(n=2):
    return gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


def _check_protocol(storage, n):
    assert isinstance(storage, RolloutStorage)
    assert storage.num_envs == n and storage.on_restart is None and storage.restarts == []
    assert storage.groups == [(0, n)]  # lock-step: one group
    t = storage.transport()
    assert list(t) == ["num_workers", "main_spin_us", "env_groups", "backend", "placement"]
    assert t["env_groups"] == 1 and t["backend"] == storage.kind and t["num_workers"] == storage.num_workers


def test_copy_storages_implement_the_protocol():
    from stable_baselines3.common.vec_env import DummyVecEnv

    venv = _same_step_venv()
    try:
        s = GymVectorStorage(venv, num_slots=3)
        _check_protocol(s, 2)
        assert s.lost_wakeups() is None and s.transport()["main_spin_us"] is None and s.worker_pids == []
        s.reset(0)
        s.act[1] = [0, 1]
        s.send(0, 1)  # the only group: the whole step
        s.recv(0, 1)
        stepped = s.obs[1].copy()
        s.reset(0)
        s.step(1)
        np.testing.assert_array_equal(s.obs[1], stepped)  # send/recv as step
    finally:
        venv.close()
    sb3 = DummyVecEnv([lambda: gym.make("CartPole-v1")] * 3)
    try:
        _check_protocol(SB3VecStorage(sb3, num_slots=3), 3)
    finally:
        sb3.close()


def _fake_engine(n=2):
    """What EngineStorage reads of an engine, without starting one."""
    space = gym.spaces.Box(-1, 1, (3,), np.float32)
    z = np.zeros((3, n), np.float64)
    return types.SimpleNamespace(
        single_observation_space=space,
        single_action_space=gym.spaces.Discrete(2),
        autoreset_mode="same_step",
        num_envs=n,
        num_workers=1,
        obs_bufs=[np.zeros((3, n, 3), np.float32)],
        final_bufs=[np.zeros((3, n, 3), np.float32)],
        act_bufs=[np.zeros((3, n), np.int64)],
        rewards=z,
        terminated=z.astype(bool),
        truncated=z.astype(bool),
        step_async=None,
        step_wait=None,
        restarts=[],
        worker_pids=[4242],
        main_spin_us=0.0,
        closed=False,
        wait_counts=lambda: {"parent": {"lost": 1}, "workers": [{"lost": 2}]},
    )


def test_engine_storages_implement_the_protocol():
    s = EngineStorage(_fake_engine())
    _check_protocol(s, 2)
    assert s.worker_pids == [4242] and s.lost_wakeups() == 3
    assert s.transport() == {
        "num_workers": 1,
        "main_spin_us": 0.0,
        "env_groups": 1,
        "backend": "fastvec",
        "placement": None,
    }
    r = RayEngineStorage(_fake_engine())
    _check_protocol(r, 2)
    # actors on other nodes: no local pids to watch, no wait counts, their engines' own waits
    assert r.worker_pids == [] and r.lost_wakeups() is None
    assert r.transport() == {
        "num_workers": 1,
        "main_spin_us": None,
        "env_groups": 1,
        "backend": "fastvec-ray",
        "placement": None,
    }


def test_ppo_counters_declared_and_public():
    import torch

    venv = _same_step_venv()
    try:
        cfg = PPOConfig(num_envs=2, n_steps=4, minibatch_size=4, n_epochs=1, device="cpu", hidden=(8,))
        ppo = PPO(cfg, GymVectorStorage(venv, num_slots=5), torch.device("cpu"))
        assert (ppo.learn_samples, ppo.grad_steps, ppo.last_stats) == (0, 0, None) and ppo.summarize() == {}
        ppo.storage.reset(0)
        ppo.collect()
        ppo.prepare()
        ppo.update()
        assert (ppo.learn_samples, ppo.grad_steps) == (8, 2) and ppo.last_stats is not None
        assert "losses/policy" in ppo.summarize()
        state = ppo.train_state()
        assert (state["learn_samples"], state["grad_steps"]) == (8, 2)  # the keys checkpoints always had
        again = PPO(cfg, GymVectorStorage(venv, num_slots=5), torch.device("cpu"))
        again.load_train_state(state)
        assert (again.learn_samples, again.grad_steps) == (8, 2)
    finally:
        venv.close()
