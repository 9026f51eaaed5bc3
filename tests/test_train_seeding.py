"""How ``fastvec train`` seeds its envs (``fastvec.train.config.seeding``): env i of a run
from its own ``SeedSequence`` stream, against numpy's own computation; no two runs
sharing an env's seed; the first observations of every kind of storage equal single envs
reset with the rule's seeds; a resume's own streams, and a checkpoint written before the
scheme had a name resuming with ``seed + env_steps + i`` as it did; the front doors
still seeding env i with ``seed + i``, as gymnasium and SB3 do."""

from __future__ import annotations

import os
import shutil
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest

import fastvec
from fastvec.train import Monitor, PPOConfig, apply_overrides, load_checkpoint, run_training, train
from fastvec.train.config.mix import mix_factories, resolve_mix
from fastvec.train.config.presets import env_factory
from fastvec.train.config.seeding import OFFSET, SPAWNED, env_seeds, seeds_for
from fastvec.train.run.loop import run_env_seeds
from fastvec.train.storage.sources import EngineStorage
from fastvec.train.storage.vector_copies import GymVectorStorage, SB3VecStorage

LEGACY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "legacy")


def _word(entropy: int, key: tuple) -> int:
    return int(np.random.SeedSequence(entropy, spawn_key=key).generate_state(1, np.uint32)[0])


# ============================================================================ the rule
def test_the_rule_is_numpys_spawned_streams():
    """Env i of a run alone is child i of member 0 of the run's SeedSequence (numpy's
    ``spawn``, reached the other way), a resume's the key one longer; ``offset`` is seed + i."""
    root = np.random.SeedSequence(7)
    members = root.spawn(3)
    envs = members[0].spawn(7)  # spawn keys (0, 0) .. (0, 6)
    assert env_seeds(7, 3, 4) == [int(envs[i].generate_state(1, np.uint32)[0]) for i in range(3, 7)]
    assert env_seeds(7, 0, 2, member=2) == [int(s.generate_state(1, np.uint32)[0]) for s in members[2].spawn(2)]
    assert env_seeds(7, 3, 4, env_steps=1000) == [_word(7, (0, i, 1000)) for i in range(3, 7)]
    assert all(0 <= s < 2**32 for s in env_seeds(7, 0, 50))
    assert env_seeds(7, 3, 4, scheme=OFFSET) == [10, 11, 12, 13]
    assert env_seeds(7, 3, 4, scheme=OFFSET, env_steps=1000) == [1010, 1011, 1012, 1013]
    assert env_seeds(7, 0, 0) == []


def test_no_two_runs_share_an_env_seed():
    """Seeds 1 and 2 share no env seed (under ``offset`` they share 15 of 16); runs 1 to
    100 with 16 envs none; nor a run's start and its resumes, nor two members."""
    one, two = set(env_seeds(1, 0, 16)), set(env_seeds(2, 0, 16))
    assert len(one) == 16 and not one & two
    assert len(set(env_seeds(1, 0, 16, scheme=OFFSET)) & set(env_seeds(2, 0, 16, scheme=OFFSET))) == 15
    every = [s for seed in range(1, 101) for s in env_seeds(seed, 0, 16)]
    assert len(set(every)) == len(every) == 1600
    streams = [env_seeds(5, 0, 16), env_seeds(5, 0, 16, env_steps=4096), env_seeds(5, 0, 16, env_steps=8192)]
    streams.append(env_seeds(5, 0, 16, member=1))
    joined = [s for stream in streams for s in stream]
    assert len(set(joined)) == len(joined)
    assert env_seeds(5, 0, 16, env_steps=4096) == env_seeds(5, 0, 16, env_steps=4096)  # every resume alike


def test_bad_seeds_are_one_line_errors():
    for call, match in [
        (lambda: env_seeds(-1, 0, 4), "seed must be an int >= 0"),
        (lambda: env_seeds(1, 0, 4, scheme="sequential"), "env seeding must be one of spawned, offset"),
        (lambda: env_seeds(1, 0, 4, scheme=OFFSET, member=1), "'offset' has no members"),
        (lambda: seeds_for([1, 2], 3), r"one seed per env \(3\), got 2"),
        (lambda: seeds_for("12", 2), "None, an int or one int per env"),
        (lambda: seeds_for([1, -2], 2), "a reset seed must be an int >= 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            call()
    assert seeds_for(4, 3) == [4, 5, 6] and seeds_for(None, 3) is None and seeds_for((9, 1), 2) == [9, 1]
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        PPOConfig(seed=-3).validate()


def test_a_rank_seeds_its_share_of_the_runs_envs():
    """Rank r of a run with n envs a rank seeds the run's envs r n .. r n + n - 1: rank 1
    of two ranks of 4 envs, the last 4 of one rank of 8 (a resume's too)."""
    cfg = PPOConfig(seed=9)
    ppo = SimpleNamespace(storage=SimpleNamespace(num_envs=4, num_seeds=4), env_seeding=SPAWNED, env_steps=640)
    whole = SimpleNamespace(storage=SimpleNamespace(num_envs=8, num_seeds=8), env_seeding=SPAWNED, env_steps=640)
    rank1 = SimpleNamespace(rank=1)
    assert run_env_seeds(cfg, ppo, rank1) == run_env_seeds(cfg, whole)[4:] == env_seeds(9, 4, 4)
    assert run_env_seeds(cfg, ppo, rank1, resumed=True) == run_env_seeds(cfg, whole, resumed=True)[4:]
    assert run_env_seeds(cfg, ppo, rank1, resumed=True) == [_word(9, (0, i, 640)) for i in range(4, 8)]


# ============================================================================ first observations
def _record_resets(monkeypatch, cls) -> list:
    """Every ``cls.reset`` from now on: (the seed it was given, the observations it left)."""
    seen, real = [], cls.reset

    def reset(self, seed, slot=0):
        if cls is EngineStorage:
            real(self, seed, slot=slot)
        else:
            real(self, seed)
        seen.append((seed, self.obs[slot].copy()))

    monkeypatch.setattr(cls, "reset", reset)
    return seen


def _cfg(*overrides) -> PPOConfig:
    cfg = apply_overrides(PPOConfig(), ["num_envs=4", "n_steps=8", "total_steps=32", "num_workers=2", "seed=11"])
    return apply_overrides(cfg, ["device=cpu", "torch_threads=1", *overrides]).validate()


def _single_obs(fns, seeds) -> np.ndarray:
    out = []
    for fn, s in zip(fns, seeds):
        env = fn()
        out.append(env.reset(seed=s)[0])
        env.close()
    return np.stack(out)


@pytest.mark.parametrize("pipeline", ["lockstep", "async"])
def test_a_runs_first_observations_are_single_envs_reset_with_the_rule(monkeypatch, pipeline):
    seen = _record_resets(monkeypatch, EngineStorage)
    run_training("CartPole-v1", _cfg(f"pipeline={pipeline}"), save=False, progress=False, tensorboard=False)
    ((seed, obs),) = seen
    assert list(seed) == env_seeds(11, 0, 4)
    np.testing.assert_array_equal(obs, _single_obs([env_factory("CartPole-v1", {})] * 4, env_seeds(11, 0, 4)))


def test_a_mix_numbers_its_envs_group_by_group(monkeypatch):
    seen = _record_resets(monkeypatch, EngineStorage)
    groups = ["count=1,max_episode_steps=50", "count=3,max_episode_steps=80"]
    run_training("CartPole-v1", _cfg(), mix=groups, save=False, progress=False, tensorboard=False)
    ((seed, obs),) = seen
    fns = mix_factories(resolve_mix(groups, "CartPole-v1", 4))
    np.testing.assert_array_equal(obs, _single_obs(fns, env_seeds(11, 0, 4)))


def test_agent_rows_seed_each_copy_with_the_rule(monkeypatch):
    """A PettingZoo env's copies (3 copies of Dwindle's 3 agents): copy c with the rule's
    seed c, its agents' rows from that one reset."""
    pytest.importorskip("pettingzoo")
    from test_agents import AGENTS, Dwindle

    seen = _record_resets(monkeypatch, EngineStorage)  # (AgentStorage resets as the engine's storage)
    run_training("pettingzoo:test_agents:Dwindle", _cfg("num_envs=3"), save=False, progress=False, tensorboard=False)
    ((seed, obs),) = seen
    assert list(seed) == env_seeds(11, 0, 3)
    want = np.zeros((9, 3), np.float32)
    for c, s in enumerate(env_seeds(11, 0, 3)):
        first, _ = Dwindle().reset(seed=s)
        for j, agent in enumerate(AGENTS):
            want[3 * c + j] = first[agent]
    np.testing.assert_array_equal(obs, want)


def test_a_gymnasium_vector_env_of_ones_own_gets_the_rules_seeds(monkeypatch):
    seen = _record_resets(monkeypatch, GymVectorStorage)
    fns = [env_factory("CartPole-v1", {})] * 4
    venv = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        run_training("CartPole-v1", _cfg(), venv=venv, save=False, progress=False, tensorboard=False)
    finally:
        venv.close()
    ((seed, obs),) = seen
    np.testing.assert_array_equal(obs, _single_obs(fns, env_seeds(11, 0, 4)))


def test_an_sb3_vec_env_takes_env_0s_seed_plus_i(monkeypatch):
    """SB3's ``VecEnv.seed`` takes one int (env i: it + i): env 0 gets the rule's seed."""
    vec_env = pytest.importorskip("stable_baselines3.common.vec_env")
    seen = _record_resets(monkeypatch, SB3VecStorage)
    fns = [env_factory("CartPole-v1", {})] * 4
    venv = vec_env.DummyVecEnv(fns)
    try:
        run_training("CartPole-v1", _cfg(), venv=venv, save=False, progress=False, tensorboard=False)
    finally:
        venv.close()
    ((seed, obs),) = seen
    first = env_seeds(11, 0, 4)[0]
    np.testing.assert_array_equal(obs, _single_obs(fns, [first + i for i in range(4)]))


class _IntSeededStorage(EngineStorage):
    """A storage written for the protocol before per-env seeds: no ``num_seeds``, and a
    ``reset`` that takes one int (env i: it + i)."""

    def __init__(self, engine):
        super().__init__(engine)
        del self.num_seeds
        self.given: list = []

    def reset(self, seed, slot=0):  # as EngineStorage's was
        assert seed is None or isinstance(seed, int), f"got {seed!r}"
        self.given.append(seed)
        self.engine.reset(slot, {i: ({"seed": seed + i} if seed is not None else {}) for i in range(self.num_envs)})


def test_a_storage_without_per_env_seeds_gets_one_int_and_its_run_says_offset(tmp_path):
    cfg = _cfg()
    fns = [env_factory("CartPole-v1", {})] * 4
    storage = _IntSeededStorage(
        fastvec.Engine(fns, num_workers=2, num_slots=cfg.n_steps + 1, autoreset_mode="same_step")
    )
    run = tmp_path / "r"
    train(cfg, storage, Monitor(str(run), tensorboard=False), env_id="CartPole-v1", progress=False)  # closes both
    assert storage.given == [11]
    assert load_checkpoint(str(run / "checkpoint.pt"))["train_state"]["env_seeding"] == OFFSET


# ============================================================================ resumes
def test_a_resume_resets_with_its_own_streams(tmp_path, monkeypatch):
    run = tmp_path / "r"
    run_training("CartPole-v1", _cfg(), run_dir=str(run), progress=False, tensorboard=False)
    ckpt = load_checkpoint(str(run / "checkpoint.pt"))
    assert ckpt["train_state"]["env_seeding"] == SPAWNED and ckpt["train_state"]["env_steps"] == 32
    seen = _record_resets(monkeypatch, EngineStorage)
    run_training(config=_cfg("total_steps=64"), resume=str(run), progress=False, tensorboard=False)
    ((seed, obs),) = seen
    want = env_seeds(11, 0, 4, env_steps=32)
    assert list(seed) == want and not set(want) & set(env_seeds(11, 0, 4))
    np.testing.assert_array_equal(obs, _single_obs([env_factory("CartPole-v1", {})] * 4, want))
    assert load_checkpoint(str(run / "checkpoint.pt"))["train_state"]["env_seeding"] == SPAWNED


def test_a_checkpoint_from_before_resumes_with_seed_plus_env_steps_plus_i(tmp_path, monkeypatch):
    """tests/data/legacy/cartpole names no scheme: its resume resets env i with
    ``seed + env_steps + i`` as before, and the checkpoint it writes names ``offset``."""
    run = tmp_path / "cartpole"
    shutil.copytree(os.path.join(LEGACY, "cartpole"), run)
    old = load_checkpoint(str(run / "checkpoint.pt"))
    assert "env_seeding" not in old["train_state"]
    seed, steps, n = old["config"]["seed"], old["train_state"]["env_steps"], old["config"]["num_envs"]
    seen = _record_resets(monkeypatch, EngineStorage)
    run_training(resume=str(run), progress=False, tensorboard=False)
    ((got, obs),) = seen
    want = [seed + steps + i for i in range(n)]
    assert list(got) == want
    np.testing.assert_array_equal(obs, _single_obs([env_factory(old["env_id"], old["env_kwargs"])] * n, want))
    assert load_checkpoint(str(run / "checkpoint.pt"))["train_state"]["env_seeding"] == OFFSET


# ============================================================================ the doors
def test_the_doors_still_seed_env_i_with_seed_plus_i():
    fns = [lambda: gym.make("CartPole-v1")] * 3
    envs = fastvec.AsyncVectorEnv(fns, num_workers=2)
    try:
        obs, _ = envs.reset(seed=21)
    finally:
        envs.close()
    np.testing.assert_array_equal(obs, _single_obs(fns, [21, 22, 23]))
    pytest.importorskip("stable_baselines3")
    venv = fastvec.SubprocVecEnv(fns, num_workers=2)
    try:
        venv.seed(21)
        obs = venv.reset()
    finally:
        venv.close()
    np.testing.assert_array_equal(obs, _single_obs(fns, [21, 22, 23]))
