"""PettingZoo ParallelEnvs in the vector env (fastvec.pettingzoo_copies, fastvec.doors.gymnasium_agents).

Each door is stepped beside a reference: the same ParallelEnv copies stepped here, in a
serial loop, with the same seeds and actions, and the rows built by hand from
PettingZoo's dicts (the rules in fastvec.pettingzoo_copies' docstring). Dwindle, a ParallelEnv of
this file's, has agents that leave at different steps; mpe2's simple_spread has all of
them end together.
"""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
from gymnasium import spaces

pettingzoo = pytest.importorskip("pettingzoo")
from pettingzoo.utils.env import ParallelEnv

from fastvec.doors.gymnasium_agents import AgentVectorEnv
from fastvec.doors.sb3_agents import AgentVecEnv
from fastvec.errors import WorkerError

AGENTS = ("a", "b", "c")


class Dwindle(ParallelEnv):
    """Three agents, each leaving after a lifetime drawn at reset (1 to 6 steps),
    terminated or (every third lifetime) truncated; observations and rewards depend on
    the step, the agent and its last action, so a wrong row or a missed action shows."""

    metadata = {"name": "dwindle_v0"}

    def __init__(self, box_actions: bool = False, obs_space=None, act_space=None, extra_agent=None):
        self.possible_agents = list(AGENTS)
        self.box_actions = box_actions
        self._obs = obs_space or spaces.Box(-100, 100, (3,), np.float32)
        default = spaces.Box(-1, 1, (2,), np.float32) if box_actions else spaces.Discrete(4)
        self._act = act_space or default
        self.extra_agent = extra_agent  # (name, step): an agent that turns up then
        self.rng = np.random.default_rng()

    def observation_space(self, agent):
        return self._obs

    def action_space(self, agent):
        return self._act

    def _ob(self, agent, value):
        i = AGENTS.index(agent)
        return np.array([self.t, i, value], dtype=np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.agents = list(self.possible_agents)
        self.life = {a: int(self.rng.integers(1, 7)) for a in self.agents}
        return {a: self._ob(a, self.life[a]) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
        self.t += 1
        value = {a: float(np.sum(actions[a])) + float(self.rng.random()) for a in self.agents}
        obs = {a: self._ob(a, value[a]) for a in self.agents}
        rewards = {a: value[a] * (AGENTS.index(a) + 1) for a in self.agents}
        ends = {a: self.t >= self.life[a] for a in self.agents}
        terms = {a: ends[a] and self.life[a] % 3 != 0 for a in self.agents}
        truncs = {a: ends[a] and self.life[a] % 3 == 0 for a in self.agents}
        self.agents = [a for a in self.agents if not ends[a]]
        if self.extra_agent is not None and self.t == self.extra_agent[1]:
            self.agents.append(self.extra_agent[0])
        return obs, rewards, terms, truncs, {a: {} for a in obs}


class Reference:
    """The copies stepped in this process: rows by hand from PettingZoo's dicts."""

    def __init__(self, env_fns, same_step: bool):
        self.envs = [fn() for fn in env_fns]
        self.agents = tuple(self.envs[0].possible_agents)
        self.m, self.same_step = len(self.agents), same_step
        self.shape = self.envs[0].observation_space(self.agents[0]).shape
        self.ended = [False] * len(self.envs)

    def _rows(self):
        n = len(self.envs) * self.m
        return np.zeros((n, *self.shape), np.float64), np.zeros(n), np.zeros(n, bool), np.zeros(n, bool)

    def _active(self):
        return np.array([a in env.agents for env in self.envs for a in self.agents])

    def reset(self, seed):
        obs, *_ = self._rows()
        for c, env in enumerate(self.envs):
            self._fill(obs, c, env.reset(seed=seed + c)[0])
        self.ended = [False] * len(self.envs)
        return obs, self._active()

    def _fill(self, rows, c, values, default=None):
        for j, a in enumerate(self.agents):
            if a in values:
                rows[c * self.m + j] = values[a]

    def step(self, actions):
        obs, rew, term, trunc = self._rows()
        finals = {}
        for c, env in enumerate(self.envs):
            if self.ended[c]:  # next_step: this step is the copy's reset
                self._fill(obs, c, env.reset()[0])
                self.ended[c] = False
                continue
            acts = {}
            for j, a in enumerate(self.agents):
                if a in env.agents:
                    act = actions[c * self.m + j]
                    acts[a] = act if env.action_space(a).shape else int(act)
            o, r, te, tr, _ = env.step(acts)
            alive = set(acts)
            self._fill(obs, c, {a: v for a, v in o.items() if a in alive})
            self._fill(rew, c, {a: v for a, v in r.items() if a in alive})
            self._fill(term, c, {a: v for a, v in te.items() if a in alive})
            self._fill(trunc, c, {a: v for a, v in tr.items() if a in alive})
            if not env.agents:
                self.ended[c] = True
                if self.same_step:
                    finals[c] = obs[c * self.m : (c + 1) * self.m].copy()
                    obs[c * self.m : (c + 1) * self.m] = 0
                    self._fill(obs, c, env.reset()[0])
                    self.ended[c] = False
        return obs, rew, term, trunc, self._active(), finals


def dwindle_fns(n, **kw):
    return [lambda: Dwindle(**kw) for _ in range(n)]


def random_actions(space, n, seed):
    space = spaces.Box(space.low, space.high, space.shape, space.dtype) if isinstance(space, spaces.Box) else space
    rng = np.random.default_rng(seed)
    if isinstance(space, spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, size=(n,))
    return rng.uniform(space.low, space.high, size=(n, *space.shape)).astype(space.dtype)


def _check_rows(env, ref_step, got):
    obs, rew, term, trunc, active, _finals = ref_step
    np.testing.assert_allclose(got[0], obs, rtol=1e-6)
    np.testing.assert_allclose(got[1], rew, rtol=1e-6)
    np.testing.assert_array_equal(got[2], term)
    np.testing.assert_array_equal(got[3], trunc)
    np.testing.assert_array_equal(env.active, active)


def _run_gymnasium(fns, mode, steps, seed=7):
    ref = Reference(fns, mode == "same_step")
    with AgentVectorEnv(fns, autoreset_mode=mode, num_workers=2) as env:
        assert env.num_envs == len(fns) * ref.m
        assert env.row_agents == ref.agents * len(fns)
        np.testing.assert_array_equal(env.row_copy, np.repeat(np.arange(len(fns)), ref.m))
        obs, infos = env.reset(seed=seed)
        want_obs, want_active = ref.reset(seed)
        np.testing.assert_allclose(obs, want_obs, rtol=1e-6)
        np.testing.assert_array_equal(env.active, want_active)
        seen = {"dead rows": 0, "copy ends": 0}
        for t in range(steps):
            actions = random_actions(env.single_action_space, env.num_envs, seed + t)
            want = ref.step(actions)
            got = env.step(actions)
            _check_rows(env, want, got)
            finals = want[5]
            assert ("final_obs" in got[4]) == bool(finals)
            for c, final in finals.items():
                rows = range(c * ref.m, (c + 1) * ref.m)
                for j, row in enumerate(rows):
                    ended = want[2][row] or want[3][row]
                    assert got[4]["_final_obs"][row] == ended
                    if ended:
                        np.testing.assert_allclose(got[4]["final_obs"][row], final[j], rtol=1e-6)
            seen["dead rows"] += int((~env.active).sum())
            seen["copy ends"] += int(sum(ref.ended)) + len(finals)
        return seen


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
@pytest.mark.parametrize("box_actions", [False, True])
def test_gymnasium_door_matches_the_serial_loop_as_agents_leave(mode, box_actions):
    seen = _run_gymnasium(dwindle_fns(3, box_actions=box_actions), mode, 40)
    assert seen["dead rows"] > 0 and seen["copy ends"] > 0  # the episodes covered deaths and resets


def test_sb3_door_matches_the_serial_loop_as_agents_leave():
    fns = dwindle_fns(3)
    ref = Reference(fns, same_step=True)
    with AgentVecEnv(fns, num_workers=2) as venv:
        assert venv.num_envs == 9 and venv.row_agents == AGENTS * 3
        venv.seed(3)
        np.testing.assert_allclose(venv.reset(), ref.reset(3)[0], rtol=1e-6)
        dones_seen = 0
        for t in range(40):
            actions = random_actions(venv.action_space, venv.num_envs, t)
            obs, rew, term, trunc, active, finals = ref.step(actions)
            got_obs, got_rew, dones, infos = venv.step(actions)
            np.testing.assert_allclose(got_obs, obs, rtol=1e-6)
            np.testing.assert_allclose(got_rew, rew.astype(np.float32), rtol=1e-6)
            assert got_rew.dtype == np.float32
            np.testing.assert_array_equal(dones, term | trunc)
            np.testing.assert_array_equal(venv.active, active)
            for row in range(venv.num_envs):
                c, j = divmod(row, 3)
                assert infos[row]["TimeLimit.truncated"] == bool(trunc[row] and not term[row])
                if dones[row]:
                    last = finals[c][j] if c in finals else obs[row]
                    np.testing.assert_allclose(infos[row]["terminal_observation"], last, rtol=1e-6)
                else:
                    assert "terminal_observation" not in infos[row]
            dones_seen += int(dones.sum())
        assert dones_seen > 0


def test_views_are_rows_of_the_shared_ring():
    with AgentVectorEnv(dwindle_fns(2), copy=False, num_workers=1) as env:
        obs, _ = env.reset(seed=0)
        ring = env.copies.engine.obs_bufs  # the Dict's leaves in key order: active, obs, ...
        assert obs.shape == (6, 3) and any(np.shares_memory(obs, buf) for buf in ring)
        obs2, *_ = env.step(np.zeros(6, np.int64))
        assert any(np.shares_memory(obs2, buf) for buf in ring) and not np.shares_memory(obs, obs2)


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_mpe_simple_spread_matches_the_serial_loop(mode):
    simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")
    fns = [lambda: simple_spread_v3.parallel_env(N=3, max_cycles=8) for _ in range(3)]
    _run_gymnasium(fns, mode, 20)


def test_sb3_ppo_trains_one_policy_over_every_agent():
    simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")
    sb3 = pytest.importorskip("stable_baselines3")
    fns = [lambda: simple_spread_v3.parallel_env(N=3, max_cycles=10) for _ in range(2)]
    with AgentVecEnv(fns, num_workers=1) as venv:
        model = sb3.PPO("MlpPolicy", venv, n_steps=16, batch_size=48, n_epochs=1, seed=0, device="cpu")
        model.learn(total_timesteps=2 * 16 * venv.num_envs)
        assert model.num_timesteps == 2 * 16 * 6


# ---------------------------------------------------------------- bad input


def _no_workers():
    return multiprocessing.active_children() == []


class MixedObservations(Dwindle):
    def observation_space(self, agent):
        return spaces.Box(0, 1, (4 if agent == "b" else 3,), np.float32)


class MixedActions(Dwindle):
    def action_space(self, agent):
        return spaces.Discrete(3 if agent == "c" else 4)


@pytest.mark.parametrize("door", [AgentVectorEnv, AgentVecEnv])
@pytest.mark.parametrize(
    "cls, match", [(MixedObservations, "observation spaces differ"), (MixedActions, "action spaces differ")]
)
def test_agents_whose_spaces_differ_fail_before_any_worker(door, cls, match):
    with pytest.raises(ValueError, match=match):
        door([cls] * 2)
    assert _no_workers()


def test_an_aec_env_is_told_to_use_aec_to_parallel():
    simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")
    with pytest.raises(ValueError, match="aec_to_parallel"):
        AgentVectorEnv([lambda: simple_spread_v3.env(N=3)])
    assert _no_workers()


@pytest.mark.parametrize(
    "fns, match",
    [
        ([lambda: object()], "must return PettingZoo ParallelEnvs, got object"),
        ("Dwindle", "non-empty sequence of callables"),
        ([], "non-empty sequence of callables"),
        ([Dwindle(), Dwindle()], r"env_fns\[0\] is not callable"),
        ([lambda: Dwindle(obs_space=spaces.Dict({"x": spaces.Discrete(2)}))], "take Box, Discrete"),
    ],
)
def test_what_is_not_a_list_of_parallel_env_functions_fails_in_one_line(fns, match):
    with pytest.raises(ValueError, match=match):
        AgentVecEnv(fns)
    assert _no_workers()


def test_bad_door_arguments_fail_in_one_line():
    with pytest.raises(ValueError, match="autoreset_mode must be 'next_step' or 'same_step'"):
        AgentVectorEnv(dwindle_fns(1), autoreset_mode="disabled")
    with AgentVectorEnv(dwindle_fns(2), num_workers=1) as env:
        env.reset(seed=0)
        with pytest.raises(ValueError, match=r"actions must have shape \(6,\)"):
            env.step(np.zeros(5, np.int64))
        with pytest.raises(ValueError, match="one seed per copy"):
            env.reset(seed=[1, 2, 3])


@pytest.mark.parametrize(
    "extra, match",
    [
        (("a", 2), "agent 'a' appeared mid-episode"),  # back after its first death
        (("d", 1), "agent 'd', which is not in possible_agents"),
    ],
)
def test_an_agent_appearing_mid_episode_is_an_error_when_it_happens(extra, match):
    class Immortal(Dwindle):  # "a" dies at step 1 and comes back at step 2
        def reset(self, seed=None, options=None):
            obs, infos = super().reset(seed, options)
            self.life = {"a": 1, "b": 9, "c": 9}
            return obs, infos

    with AgentVectorEnv([lambda: Immortal(extra_agent=extra)] * 2, num_workers=1) as env:
        env.reset(seed=0)
        with pytest.raises(WorkerError, match=match):
            for _ in range(3):
                env.step(np.zeros(6, np.int64))


def test_sb3_attribute_access_answers_per_row_from_its_copy():
    import fastvec

    assert fastvec.AgentVecEnv is AgentVecEnv and fastvec.AgentVectorEnv is AgentVectorEnv
    with AgentVecEnv(dwindle_fns(2), num_workers=1) as venv:
        venv.set_attr("tag", "x", indices=[4])  # row 4 is copy 1's agent "b"
        assert venv.get_attr("tag", indices=[3, 5]) == ["x", "x"]
        assert venv.env_method("get_wrapper_attr", "tag", indices=[4]) == ["x"]
        with pytest.raises(AttributeError):
            venv.get_attr("tag", indices=[0])
        assert venv.get_attr("render_mode") == [None] * 6
