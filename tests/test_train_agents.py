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
from fastvec.train import PPO, PPOConfig, apply_overrides, preset_for, run_training
from fastvec.train.algo.checkpoints import load_checkpoint
from fastvec.train.algo.statistics import EpisodeTracker
from fastvec.train.commands.cli import main as cli_main
from fastvec.train.commands.launch import build_storage
from fastvec.train.storage.agent_rows import AgentStorage

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


def test_the_trainers_episodes_over_rollouts_are_the_serial_loops():
    """Five lock-step rollouts of 8 steps (``LockStep``: each starts where the last
    ended): the episodes the trainer counts (returns, and lengths in the steps each agent
    acted) are those of the serial loop replaying the actions the trainer took."""
    from fastvec.train.pipelines.lockstep import LockStep

    cfg = _config("normalize_obs=false")
    storage = build_storage(DWINDLE, cfg)
    try:
        ppo = PPO(cfg, storage, torch.device("cpu"))
        ppo.restart_envs(cfg.seed)
        schedule, taken = LockStep(ppo), []
        for _ in range(5):
            schedule.collect()
            taken.extend(storage.act[1 : cfg.n_steps + 1].copy())
            schedule.learn()
        returns, lengths = ppo.tracker.drain()
    finally:
        storage.close()
    ref = _serial(cfg.seed)
    _obs, acting = ref.reset(cfg.seed)
    ret, length, episodes = np.zeros(9), np.zeros(9, np.int64), []
    for actions in taken:
        _obs, rew, term, trunc, active, _finals = ref.step(actions)
        ret += rew
        length += acting
        for row in np.flatnonzero(term | trunc):
            episodes.append((round(float(ret[row]), 4), int(length[row])))
            ret[row], length[row] = 0.0, 0
        acting = active
    assert len(episodes) > 20
    assert sorted(zip(np.round(returns, 4), lengths)) == sorted(episodes)


def _update(ppo, seed):
    torch.manual_seed(seed)
    ppo.update()
    return ppo.flat_param.detach().clone()


@pytest.mark.parametrize("core", ["none", "lstm"])
def test_samples_of_agents_that_left_do_not_change_the_update(core):
    """The same update from the same rollout, once as it is and once with every
    sample of a row that did not act replaced by garbage (its observation, advantage,
    return, value and log-prob): the same weights and explained variance (an LSTM's
    sequences run through the garbage, and start afresh where the row acts again).
    Garbage in one acted sample: other weights (so the comparison can fail)."""
    cfg = _config("minibatch_size=24", "n_epochs=2", "normalize_obs=false", f"policy_core={core}", "bptt=4")
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
            weights = _update(ppo, 0)
            return weights, ppo.updater.summary(ro)["losses/explained_variance"]

        want, want_ev = again(np.zeros_like(idle))
        got, got_ev = again(idle)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert got_ev == want_ev
        one = np.zeros_like(idle)
        one[np.argwhere(~idle)[0][0], np.argwhere(~idle)[0][1]] = True
        got, got_ev = again(one)
        assert not torch.equal(got, want) and got_ev != want_ev
    finally:
        storage.close()


def test_an_lstm_over_agent_rows_remembers_each_agent_episode_alone():
    """Two rollouts of an LSTM policy over Dwindle's rows: at every step a row acted,
    the rollout's value and old log-prob equal the policy stepped through that agent's
    own episode alone (its acted observations only, from a zero state): no memory
    crosses from one agent episode into the next, nor through the steps a row idles."""
    from test_train_recurrent import _stepwise

    cfg = _config("policy_core=lstm", "core_size=8", "normalize_obs=false", T=16)
    storage = build_storage(DWINDLE, cfg)
    try:
        ppo = PPO(cfg, storage, torch.device("cpu"))
        ppo.restart_envs(cfg.seed)
        ro, pol, T = ppo.rollout, ppo.policy, cfg.n_steps
        obs, values, logp, acted, ended = [], [], [], [], []
        for _ in range(2):
            ppo.collect()
            ppo.prepare()
            obs.append(ro.obs[:T].clone())
            values.append(ro.values[:T].clone())
            logp.append(ro.logp.clone())
            acted.append(storage.active[:T].copy())
            ended.append(storage.terminated[1:] | storage.truncated[1:])  # the agent's step t ended its episode
        obs, values, logp = torch.cat(obs), torch.cat(values), torch.cat(logp)
        acted, ended = np.concatenate(acted), np.concatenate(ended)
        acts = ro.batch_actions()
        acts = acts.view(T, ro.N, *acts.shape[1:])  # (the last rollout's)
        episodes = 0
        for r in range(ro.N):
            steps = np.flatnonzero(acted[:, r])
            first = np.ones(len(steps), bool)  # where an agent episode starts among them
            first[1:] = ended[steps[:-1], r] | (np.diff(steps) > 1)
            episodes += first.sum()
            with torch.no_grad():
                p, v, _fed = _stepwise(
                    pol, obs[steps, r : r + 1], torch.zeros(1, pol.state_size), torch.from_numpy(first[:, None])
                )
            torch.testing.assert_close(values[steps, r], v[:, 0], rtol=1e-5, atol=1e-5)
            last = steps >= T  # the second rollout's steps: its actions are at hand
            want = pol.dist.log_prob(p[last, 0], acts[steps[last] - T, r])
            torch.testing.assert_close(logp[steps[last], r], want, rtol=1e-5, atol=1e-5)
        assert episodes > 2 * ro.N and (~acted).sum() > 20, "agent episodes must end inside the rollouts"
    finally:
        storage.close()


def test_eval_feeds_each_agent_episode_a_fresh_state():
    """``fastvec eval``'s loop over agent rows with an LSTM policy: the state fed is zero
    exactly at each agent episode's first step (after the agent's own end, or the idle
    steps until its copy resets), never inside an episode."""
    from test_agents import Dwindle

    from fastvec.doors.gymnasium_agents import AgentVectorEnv
    from fastvec.train.commands.evaluate import _episodes
    from fastvec.train.model.actor_critic import make_policy

    venv = AgentVectorEnv([Dwindle] * 2, autoreset_mode="same_step", num_workers=1)
    torch.manual_seed(0)
    pol = make_policy(venv.single_observation_space, venv.single_action_space, core="lstm", core_size=8)
    fed, acting, ended = [], [], []

    class Spy:
        recurrent, state_size, masked = True, pol.state_size, pol.masked

        def predict(self, obs, deterministic, state, mask=None):
            fed.append(state.clone())
            acting.append(venv.active)
            return pol.predict(obs, deterministic, state, mask=mask)

    class Flags:  # the vector env, its step's flags recorded
        def __getattr__(self, name):
            return getattr(venv, name)

        def step(self, actions):
            out = venv.step(actions)
            ended.append(out[2] | out[3])
            return out

    try:
        returns, _lengths, _g, _s = _episodes(Flags(), Spy(), np.zeros(6, np.int64), 30, 0, True)
    finally:
        venv.close()
    assert len(returns) == 30
    zero = torch.stack([(f == 0).all(1) for f in fed]).numpy()  # [steps, rows]
    acting, ended = np.array(acting), np.array(ended)
    starts = acting.copy()  # an agent episode's first step: after the row idled, or right after its end
    starts[1:] &= ~acting[:-1] | ended[: len(acting) - 1]
    assert starts[1:].sum() > 20
    np.testing.assert_array_equal(zero[acting], starts[acting])


@pytest.mark.parametrize("core", ["none", "lstm"])
def test_separate_device_buffers_match_zero_copy_on_agent_rows(core):
    """The GPU's code path on the CPU (``separate_buffers``: the learner's tensors are
    copies of the ring) over Dwindle's rows: three rounds of collect, targets and update
    give the same advantages, returns, log-probs and weights as zero copy, exactly."""
    from fastvec.train.pipelines.ring import start_where_left

    cfg = _config("minibatch_size=24", "normalize_reward=true", f"policy_core={core}", "bptt=4")
    runs = []
    for separate in (False, True):
        storage = build_storage(DWINDLE, cfg)
        try:
            torch.manual_seed(7)
            ppo = PPO(cfg, storage, torch.device("cpu"), separate_buffers=separate)
            assert ppo.rollout.copies == separate
            ppo.restart_envs(cfg.seed)
            got = []
            for _ in range(3):
                ppo.collect()
                ppo.prepare()
                ppo.update()
                ro = ppo.rollout
                got.append([x.detach().cpu().clone() for x in (ro.adv, ro.ret, ro.logp, ppo.flat_param)])
                start_where_left(storage, storage, cfg.n_steps)
            runs.append(got)
        finally:
            storage.close()
    for zero, sep in zip(*runs):
        for x, y in zip(zero, sep):
            torch.testing.assert_close(y, x, rtol=0, atol=0)


def test_the_reward_scale_counts_the_rows_that_acted_only():
    """``normalize_reward``: the same rollout's targets twice from the same scaler
    state, once with every reward of a row that did not act replaced by garbage: the
    same scale and the same advantages wherever a row acted (an agent that left has no
    return to count). Garbage in one acted reward: another scale."""
    cfg = _config("normalize_reward=true", "normalize_obs=false")
    storage = build_storage(DWINDLE, cfg)
    try:
        ppo = PPO(cfg, storage, torch.device("cpu"))
        ppo.restart_envs(cfg.seed)
        ppo.collect()
        ro, scaler = ppo.rollout, ppo.targets.reward_scaler
        acted = storage.active[: ro.T].copy()
        assert (~acted).sum() > 5
        start = (scaler.state(), scaler.acc.copy(), storage.rewards.copy())

        def targets(garbage):
            scaler.load(start[0])
            scaler.acc[:] = start[1]
            storage.rewards[:] = start[2]
            storage.rewards[1:][garbage] = 1e3
            ppo.prepare()
            return scaler.var, ro.adv[torch.from_numpy(acted)].clone()

        want_var, want_adv = targets(np.zeros_like(acted))
        got_var, got_adv = targets(~acted)
        assert got_var == want_var
        torch.testing.assert_close(got_adv, want_adv, rtol=0, atol=0)
        one = np.zeros_like(acted)
        one[tuple(np.argwhere(acted)[0])] = True
        assert targets(one)[0] != want_var
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


def test_an_lstm_policy_trains_evaluates_and_resumes_on_agent_rows(tmp_path, capsys):
    """``policy_core=lstm`` on a PettingZoo env through the CLI: it trains, the
    checkpoint holds the core, ``fastvec eval`` carries each row's state, a resume goes on."""
    run = tmp_path / "dwindle"
    args = [DWINDLE, "--total-steps", "1000", "--logdir", str(run), "--no-progress", "--no-tensorboard"]
    over = ["--set", "num_envs=4", "--set", "n_steps=32", "--set", "policy_core=lstm", "--set", "bptt=8"]
    assert cli_main("train", [*args, *over, "--set", "minibatch_size=64"]) == 0
    assert load_checkpoint(str(run / "checkpoint.pt"))["config"]["policy_core"] == "lstm"
    capsys.readouterr()
    assert cli_main("eval", [str(run), "--episodes", "12"]) == 0
    ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ev["episodes"] == 12 and 1 <= ev["mean_length"] <= 6
    assert cli_main("train", ["--resume", str(run), "--total-steps", "1500", "--no-progress"]) == 0
    assert json.loads((run / "result.json").read_text())["env_steps"] >= 1500


@pytest.mark.parametrize("core", ["none", "lstm"])
def test_async_at_lag_0_is_the_lockstep_run_on_agent_rows(tmp_path, core):
    """``pipeline=async`` with ``max_policy_lag=0`` over Dwindle's rows: the learner
    process sees the ring as the same rows (``agent_views``) and the run ends with the
    lock-step run's weights, optimiser state and statistics, bit for bit."""
    from test_train_pipeline import _assert_same_run, _run

    def make(**c):
        over = ["total_steps=2304", "n_steps=32", "minibatch_size=96", "normalize_reward=true", "torch_threads=1"]
        return _config(*over, f"policy_core={core}", "bptt=8", *(f"{k}={v}" for k, v in c.items()), num_envs=4)

    ra, a = _run(tmp_path, "lock", make(), env=DWINDLE)
    rb, b = _run(tmp_path, "async", make(pipeline="async", max_policy_lag=0), env=DWINDLE)
    assert ra["pipeline"] == "lockstep" and rb["pipeline"] == "async" and ra["episodes"] > 100
    _assert_same_run(a, b, ra, rb)


def test_async_with_a_lag_learns_simple_spread(tmp_path):
    """The preset with ``pipeline=async`` (lag 1): past random play (-27) within 100k agent steps."""
    pytest.importorskip("mpe2")
    cfg = apply_overrides(PPOConfig(), preset_for("pettingzoo:mpe2.simple_spread_v3"))
    apply_overrides(cfg, ["pipeline=async", "max_policy_lag=1", "total_steps=100000", "seed=1"])
    res = run_training(
        "pettingzoo:mpe2.simple_spread_v3",
        cfg.validate(),
        run_dir=str(tmp_path / "r"),
        progress=False,
        tensorboard=False,
    )
    assert res["pipeline"] == "async" and res["pipeline_stats"]["policy_lag_max"] <= 1
    assert res["final_mean_return"] > -24.0, res["final_mean_return"]


@pytest.mark.parametrize(
    "flags, match",
    [
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
