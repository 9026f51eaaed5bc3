"""``fastvec train`` on PettingZoo envs: the trainer's storage over the copies' agent
rows against a serial loop of the same copies (test_agents' reference), the samples of
agents that left their episode kept out of the update, and the commands end to end.

Dwindle (test_agents) has agents that leave at different steps, terminated or truncated;
mpe2's simple_spread has every agent end together.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")
from test_agents import Reference, random_actions

from fastvec.bench import main as bench_main
from fastvec.train import PPO, PPOConfig, apply_overrides, run_training
from fastvec.train.agent_storage import AgentStorage
from fastvec.train.checkpoints import load_checkpoint
from fastvec.train.cli import main as cli_main
from fastvec.train.launch import build_storage
from fastvec.train.statistics import EpisodeTracker

DWINDLE = "pettingzoo:test_agents:Dwindle"


def _config(*overrides, num_envs=3, T=8):
    cfg = apply_overrides(PPOConfig(), [f"num_envs={num_envs}", f"n_steps={T}", "num_workers=2", "seed=3", *overrides])
    return cfg.validate()


def _serial(seed, box_actions=False, num_envs=3):
    from test_agents import Dwindle

    return Reference([lambda: Dwindle(box_actions=box_actions)] * num_envs, same_step=True)


@pytest.mark.parametrize("box_actions", [False, True])
def test_storage_rows_match_the_serial_loop_as_agents_leave(box_actions):
    """Every slot's rows (observations, rewards, flags, which agents act) and the final
    observation of every row that ended, step by step; the episode statistics of the
    rows (returns, and lengths in the steps each agent acted) against the loop's."""
    cfg = _config()
    storage = build_storage(DWINDLE, cfg, env_kwargs={"box_actions": box_actions})
    ref = _serial(3, box_actions)
    try:
        assert isinstance(storage, AgentStorage) and storage.num_envs == 9
        storage.reset(3)
        want_obs, want_active = ref.reset(3)
        np.testing.assert_allclose(storage.obs[0], want_obs, rtol=1e-6)
        np.testing.assert_array_equal(storage.active[0], want_active)
        S = storage.obs.shape[0]
        rows = {"rewards": [], "terminated": [], "truncated": [], "acted": []}
        ret, length, episodes = np.zeros(9), np.zeros(9, np.int64), []
        acting = want_active
        for t in range(1, 60):
            slot = t % S
            actions = random_actions(storage.single_action_space, 9, t)
            storage.act[slot] = actions
            obs, rew, term, trunc, active, finals = ref.step(actions)
            storage.step(slot)
            np.testing.assert_allclose(storage.obs[slot], obs, rtol=1e-6)
            np.testing.assert_allclose(storage.rewards[slot], rew, rtol=1e-6)
            np.testing.assert_array_equal(storage.terminated[slot], term)
            np.testing.assert_array_equal(storage.truncated[slot], trunc)
            np.testing.assert_array_equal(storage.active[slot], active)
            for row in np.flatnonzero(term | trunc):
                c, j = divmod(row, 3)
                last = finals[c][j] if c in finals else obs[row]
                np.testing.assert_allclose(storage.final_obs[slot, row], last, rtol=1e-6)
            for name, value in (("rewards", rew), ("terminated", term), ("truncated", trunc), ("acted", acting)):
                rows[name].append(value)
            ret += rew
            length += acting
            for row in np.flatnonzero(term | trunc):
                episodes.append((float(ret[row]), int(length[row])))
                ret[row], length[row] = 0.0, 0
            acting = active
        assert (~np.array(rows["acted"])).sum() > 20, "agents must have left their episodes for a while"
        tracker = EpisodeTracker(9, 1000)
        for a in range(0, 59, 8):  # in rollouts of 8 steps, as the trainer feeds it
            tracker.update(*(np.array(rows[k][a : a + 8]) for k in ("rewards", "terminated", "truncated", "acted")))
        returns, lengths = tracker.drain()
        assert sorted(zip(np.round(returns, 5), lengths)) == sorted((round(r, 5), n) for r, n in episodes)
    finally:
        storage.close()


def _update(ppo, seed):
    torch.manual_seed(seed)
    ppo.update()
    return ppo.flat_param.detach().clone()


def test_samples_of_agents_that_left_do_not_change_the_update():
    """The same update from the same rollout, once as it is and once with every
    sample of a row that did not act replaced by garbage (its observation, advantage,
    return, value and log-prob): the same weights. Garbage in one acted sample: other
    weights (so the comparison can fail)."""
    cfg = _config("minibatch_size=24", "n_epochs=2", "normalize_obs=false")
    storage = build_storage(DWINDLE, cfg)
    try:
        ppo = PPO(cfg, storage, torch.device("cpu"))
        ppo.restart_envs(cfg.seed)
        ppo.collect()
        ppo.prepare()
        ro = ppo.rollout
        idle = ~storage.active[: ro.T]  # [T, N]: rows whose agent had left
        assert idle.sum() > 5 and (~idle).sum() > 24
        start = (ppo.flat_param.detach().clone(), ppo.updater.opt.state_dict())
        saved = [x.clone() for x in (ro.adv, ro.ret, ro.values, ro.logp, ro.obs)]

        def again(garbage):
            ppo.flat_param.data.copy_(start[0])
            ppo.updater.opt.load_state_dict(start[1])
            ppo.updater.updates = 0
            for x, keep in zip((ro.adv, ro.ret, ro.values, ro.logp, ro.obs), saved):
                x.copy_(keep)
            mask = torch.from_numpy(garbage)
            for x in (ro.adv, ro.ret, ro.values[: ro.T], ro.logp, ro.obs[: ro.T]):
                x[mask] = 1e3
            return _update(ppo, 0)

        want = again(np.zeros_like(idle))
        torch.testing.assert_close(again(idle), want, rtol=0, atol=0)
        one = np.zeros_like(idle)
        one[np.argwhere(~idle)[0][0], np.argwhere(~idle)[0][1]] = True
        assert not torch.equal(again(one), want)
    finally:
        storage.close()


def test_simple_spread_trains_past_random_play_then_evaluates_and_resumes(tmp_path, capsys):
    """One shared policy over 3 agents x 16 copies (the preset): within 100k agent steps
    the training return is well above random play's (-27 per agent per episode); the
    checkpoint names the agents, ``fastvec eval`` plays agent episodes, a resume goes on."""
    pytest.importorskip("mpe2")
    run = tmp_path / "spread"
    env = "pettingzoo:mpe2.simple_spread_v3"
    args = [env, "--total-steps", "100000", "--logdir", str(run), "--no-progress", "--no-tensorboard", "--seed", "1"]
    assert cli_main("train", args) == 0
    result = json.loads((run / "result.json").read_text())
    assert result["num_envs"] == 48 and result["env_steps"] >= 100000
    assert result["final_mean_return"] > -24.0, result["final_mean_return"]
    ckpt = load_checkpoint(str(run / "checkpoint.pt"))
    assert ckpt["agents"] == ["agent_0", "agent_1", "agent_2"] and ckpt["env_id"] == env
    capsys.readouterr()
    assert cli_main("eval", [str(run), "--episodes", "9"]) == 0
    ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ev["episodes"] == 9 and ev["mean_length"] == 25.0 and ev["mean_return"] > -27.0
    assert cli_main("train", ["--resume", str(run), "--total-steps", "110000", "--no-progress"]) == 0
    resumed = json.loads((run / "result.json").read_text())
    assert resumed["resumed"] and resumed["env_steps"] >= 110000


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--set", "pipeline=async"], "pipeline=async is not built for PettingZoo envs"),
        (["--set", "policy_core=lstm"], "policy_core=lstm is not built"),
        (["--set", "env_groups=2"], "env_groups=2 is not built"),
        (["--nproc", "2"], "2 ranks is not built"),
        (["--backend", "ray"], "not with backend='ray'"),
    ],
)
def test_what_agent_rows_cannot_do_yet_fails_in_one_line(flags, match, tmp_path, capsys):
    argv = [DWINDLE, "--total-steps", "100", "--logdir", str(tmp_path / "r"), "--no-progress", *flags]
    assert cli_main("train", argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "env_id, match",
    [
        ("pettingzoo:9bad", "is not a PettingZoo env path"),
        ("pettingzoo:test_agents:nothing", "has no callable 'nothing'"),
        ("pettingzoo:no_such_module_here", "cannot import no_such_module_here"),
        ("pettingzoo:test_agents:AGENTS", "has no callable 'AGENTS'"),
    ],
)
def test_a_bad_pettingzoo_id_fails_in_one_line(env_id, match, tmp_path, capsys):
    assert cli_main("train", [env_id, "--logdir", str(tmp_path / "r"), "--no-progress"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err


def test_an_aec_env_or_a_mix_or_a_vector_env_is_refused_before_training():
    with pytest.raises(ValueError, match="AECEnv"):
        run_training("pettingzoo:mpe2.simple_spread_v3:env", _config(), run_dir=None, progress=False)
    with pytest.raises(ValueError, match="not with a mix"):
        run_training(DWINDLE, _config(), mix=["count=3"], run_dir=None, progress=False)


def test_bench_takes_gymnasium_ids_only(capsys):
    assert bench_main("bench", ["pettingzoo:mpe2.simple_spread_v3"]) == 2
    assert "is a PettingZoo env" in capsys.readouterr().err
