"""Which envs each worker runs (``placement``): any set of envs per worker, chosen by
hand, by given costs or by a probe, gives exactly what ``SyncVectorEnv`` and
``DummyVecEnv`` give for the same seeds and actions; bad placements are refused before
any process starts."""

from __future__ import annotations

import functools
import itertools
import os
import time

import conftest
import gymnasium as gym
import numpy as np
import psutil
import pytest
from envs import CostEnv, DictTupleEnv, FlatInfoEnv, RandomEndEnv
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import assert_same
from test_gym_equivalence import MODES
from test_gym_equivalence import run_lockstep as gym_lockstep
from test_pickled_leaves import CONFIGS as PICKLED_CONFIGS
from test_pickled_leaves import PickledEnv
from test_sb3_equivalence import run_lockstep as sb3_lockstep

import fastvec
from fastvec._core.placement import GAIN, _best_contiguous, _spread, balance, check_placement, contiguous

# 5 envs: two workers that interleave, and three with a lone env and gaps.
PLACEMENTS = {
    "interleaved": [[0, 3, 4], [1, 2]],
    "scattered": [[4], [0, 2], [1, 3]],
}
MAKERS = {"random_end": RandomEndEnv, "flat_info": FlatInfoEnv, "dict_tuple": DictTupleEnv}


def _shm() -> set[str]:
    """The fastvec segments this process created that still exist (another test run or a
    benchmark on the machine makes and removes segments of its own meanwhile)."""
    return conftest._created & conftest._segments()


# ----------------------------------------------------------------- the placement itself
def test_best_contiguous_split_is_optimal():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 9))
        w = int(rng.integers(1, n + 1))
        costs = rng.choice([1.0, 2.0, 4.0, 7.5], size=n)
        got, runs = _best_contiguous(costs, w)
        best = min(
            max(costs[a:b].sum() for a, b in zip((0, *cuts), (*cuts, n)))
            for cuts in itertools.combinations(range(1, n), w - 1)
        )
        assert got == pytest.approx(best)
        assert [int(i) for r in runs for i in r] == list(range(n)) and all(len(r) for r in runs)
        assert max(costs[r].sum() for r in runs) == pytest.approx(got)


def test_balance_spreads_uneven_costs_and_keeps_even_ones_in_runs():
    # four envs at 4x the others, given together: runs cannot do better than 12 of 20
    placement = balance(np.array([4, 4, 4, 4, 1, 1, 1, 1], float), 2)
    assert [p.tolist() for p in placement] == [[0, 2, 4, 6], [1, 3, 5, 7]]  # 10 each
    # equal costs, or costs a probe measures a few percent apart: the default's runs
    for costs in ([1.0] * 8, [1.0, 1.04, 0.98, 1.0, 1.02, 0.97, 1.0, 1.05]):
        assert [p.tolist() for p in balance(np.array(costs), 2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [p.tolist() for p in balance(np.ones(7), 3)] in ([[0, 1, 2], [3, 4], [5, 6]], [[0, 1], [2, 3, 4], [5, 6]])
    rng = np.random.default_rng(1)
    for _ in range(200):  # a placement, never worse than the default, within GAIN of the best found
        n = int(rng.integers(1, 10))
        w = int(rng.integers(1, n + 1))
        costs = rng.uniform(0.1, 5.0, size=n)
        p = balance(costs, w)
        assert sorted(int(i) for e in p for i in e) == list(range(n)) and all(e.size for e in p)
        worst = max(costs[e].sum() for e in p)
        assert worst <= max(costs[e].sum() for e in contiguous(n, w)) + 1e-9
        assert worst <= GAIN * min(_best_contiguous(costs, w)[0], _spread(costs, w)[0]) + 1e-9
        assert _spread(costs, w)[0] <= max(costs.max(), costs.sum() / w) * 4 / 3 + 1e-9  # LPT's bound


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"placement": [[0, 1], [2, 9]]}, "names env 9, but there are 4 envs"),
        ({"placement": [[0, 1], [1, 2, 3]]}, "env 1 is placed twice"),
        ({"placement": [[0, 1], [3]]}, "leaves env 2 out"),
        ({"placement": [[0, 1, 2, 3], []]}, r"placement\[1\] must be a non-empty list"),
        ({"placement": [[0, 1.5], [2, 3]]}, "env indices are ints"),
        ({"placement": "by-cost"}, "placement must be one of"),
        ({"placement": [[0, 1], [2, 3]], "num_workers": 3}, "conflicts with a placement of 2 workers"),
        ({"placement": "balanced", "env_costs": [1, 2, 3]}, "env_costs has 3 entries for 4 envs"),
        ({"placement": "balanced", "env_costs": [1, 2, -3, 1]}, r"env_costs\[2\] = -3"),
        ({"placement": "balanced", "env_costs": [1, 2, float("nan"), 1]}, "positive, finite"),
        ({"env_costs": [1, 1, 1, 1]}, "env_costs are for placement='balanced'"),
        ({"placement": [[0, 2], [1, 3]], "batch_size": 2}, "contiguous run"),
    ],
)
def test_bad_placements_are_refused_before_any_process_starts(kwargs, message):
    before_children, before_shm = psutil.Process().children(recursive=True), _shm()
    with pytest.raises(ValueError, match=message) as err:
        fastvec.AsyncVectorEnv([RandomEndEnv] * 4, num_workers=kwargs.pop("num_workers", None), **kwargs)
    assert "\n" not in str(err.value)
    if "batch_size" not in kwargs:  # the batch check needs the engine's placement: after start-up
        assert psutil.Process().children(recursive=True) == before_children
    assert _shm() == before_shm


def test_check_placement_sorts_each_workers_envs():
    assert [p.tolist() for p in check_placement([[3, 0], (2, 1)], 4)] == [[0, 3], [1, 2]]


# ----------------------------------------------------------------- same results as the references
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("env_name", list(MAKERS))
@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_any_placement_matches_sync(placement, env_name, mode):
    fns = [MAKERS[env_name]] * 5
    env = fastvec.AsyncVectorEnv(fns, placement=PLACEMENTS[placement], autoreset_mode=mode)
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    try:
        assert env.num_workers == len(PLACEMENTS[placement])
        assert [list(w) for w in env.placement.workers] == [sorted(w) for w in PLACEMENTS[placement]]
        seen = gym_lockstep(env, ref, 80, seed=11, mode=mode)
        assert seen["ends"] > 0
        if env_name != "dict_tuple":
            assert seen["infos"] > 0
        # calls reach each env, answers come back in env order
        assert env.get_attr("np_random_seed") == ref.get_attr("np_random_seed")
        env.set_attr("marker", list(range(10, 15)))
        ref.set_attr("marker", list(range(10, 15)))
        assert env.get_attr("marker") == ref.get_attr("marker") == tuple(range(10, 15))
        assert_same(env.reset(seed=[4, None, 6, None, 8])[1], ref.reset(seed=[4, None, 6, None, 8])[1], "reset infos")
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("env_name", ["random_end", "flat_info"])
@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_any_placement_matches_dummy(placement, env_name):
    from stable_baselines3.common.vec_env import DummyVecEnv

    fns = [MAKERS[env_name]] * 5
    env = fastvec.SubprocVecEnv(fns, placement=PLACEMENTS[placement])
    ref = DummyVecEnv(fns)
    try:
        seen = sb3_lockstep(env, ref, 80, seed=4)
        assert seen["dones"] > 0 and seen["infos"] > 0
        assert env.env_method("get_wrapper_attr", "np_random_seed") == ref.env_method(
            "get_wrapper_attr", "np_random_seed"
        )
        assert env.get_attr("np_random_seed") == ref.get_attr("np_random_seed")
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("name", ["dict_mixed", "oneof_action"])
def test_pickled_leaves_with_a_scattered_placement(name):
    fns = [functools.partial(PickledEnv, *PICKLED_CONFIGS[name]) for _ in range(5)]
    env = fastvec.AsyncVectorEnv(fns, placement=PLACEMENTS["scattered"], autoreset_mode=AutoresetMode.SAME_STEP)
    ref = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        assert_same(env.reset(seed=2), ref.reset(seed=2), "reset")
        ref.action_space.seed(3)
        for t in range(30):
            actions = ref.action_space.sample()
            assert_same(env.step(actions), ref.step(actions), f"step {t}")
    finally:
        env.close()
        ref.close()


def test_balanced_by_given_costs_matches_sync():
    fns = [RandomEndEnv] * 6
    env = fastvec.AsyncVectorEnv(fns, num_workers=2, placement="balanced", env_costs=[5, 5, 5, 1, 1, 1])
    ref = SyncVectorEnv(fns)
    try:
        report = env.placement
        assert report.mode == "balanced" and report.probe_us == (5, 5, 5, 1, 1, 1)
        shares = [sum(report.probe_us[i] for i in w) for w in report.workers]
        assert max(shares) == 10  # runs could do no better than 15 of 18
        gym_lockstep(env, ref, 40, seed=1, mode=AutoresetMode.NEXT_STEP)
    finally:
        env.close()
        ref.close()


def test_a_restarted_worker_keeps_its_envs():
    """Worker 0 runs envs 0 and 3; env 3 raises at its 4th step: the replacement runs 0
    and 3 again, both end truncated there, and the others go on untouched."""
    text_env = functools.partial(PickledEnv, *PICKLED_CONFIGS["text_only"], p_end=0.0)
    fns = [text_env] * 3 + [functools.partial(text_env, fail_at=4)]
    placement = [[0, 3], [1, 2]]
    with pytest.warns(RuntimeWarning, match=r"restarted worker 0 and reset envs 0, 3"):
        with fastvec.AsyncVectorEnv(fns, placement=placement, restart_on_error=True) as env:
            env.reset(seed=0)
            env.action_space.seed(0)
            for _ in range(3):
                env.step(env.action_space.sample())
            _obs, _rew, _term, trunc, infos = env.step(env.action_space.sample())
            assert infos["_fastvec_restarted"].tolist() == [True, False, False, True]
            assert trunc.tolist()[0] and trunc.tolist()[3]
            assert env.engine.restarts[0]["envs"] == [0, 3]
            assert [list(w) for w in env.placement.workers] == placement
            env.step(env.action_space.sample())  # the replacement steps its envs


# ----------------------------------------------------------------- the probe and the report
def test_probe_places_costly_envs_apart_and_reports_costs():
    # four envs at 4x the others, given together
    fns = [functools.partial(CostEnv, 800.0)] * 4 + [functools.partial(CostEnv, 200.0)] * 4
    with fastvec.AsyncVectorEnv(fns, num_workers=2, placement="balanced") as env:
        report = env.placement
        assert report.mode == "balanced"
        probe = np.array(report.probe_us)
        assert probe[:4].min() > 2 * probe[4:].max()
        assert [sorted(i < 4 for i in w) for w in report.workers] == [[False, False, True, True]] * 2
        env.reset(seed=0)
        for _ in range(100):
            env.step(env.action_space.sample())
        report = env.placement
        env_us = np.array(report.env_us)
        # Each env's wall time per step: on any host at least what its steps spin (all but
        # the one of the 100 that is its autoreset), whatever else a loaded host puts on
        # its clock by preempting it (which moves a ratio of costly to cheap); and the
        # placement is even by the costs its probe measured (CPU time, or the fastest
        # wall times: robust to load).
        assert np.isfinite(env_us).all() and env_us[:4].min() > 0.9 * 800 and env_us[4:].min() > 0.9 * 200, env_us
        assert report.share_us == pytest.approx([env_us[list(w)].sum() for w in report.workers])
        probe_shares = [probe[list(w)].sum() for w in report.workers]
        assert min(probe_shares) > 0.8 * max(probe_shares), probe_shares
        assert 0 < report.balance <= 1
        assert "worker 1" in str(report)


def test_probe_costs_a_waiting_env_its_wall_time():
    """The probe counts CPU time (robust to a busy machine), but an env that sleeps costs
    its worker the wait: two envs that wait 3 ms, given together, go to both workers."""
    fns = [functools.partial(CostEnv, 3000.0, sleep=True)] * 2 + [functools.partial(CostEnv, 50.0)] * 2
    with fastvec.AsyncVectorEnv(fns, num_workers=2, placement="balanced") as env:
        probe = np.array(env.placement.probe_us)
        assert probe[:2].min() > 2500 and probe[:2].min() > 10 * probe[2:].max()
        assert sorted(len(set(w) & {0, 1}) for w in env.placement.workers) == [1, 1]


def test_probe_keeps_runs_for_envs_alike():
    with fastvec.AsyncVectorEnv([functools.partial(CostEnv, 300.0)] * 6, num_workers=2, placement="balanced") as env:
        assert [list(w) for w in env.placement.workers] == [[0, 1, 2], [3, 4, 5]]
        assert env.engine.groups == [(0, 3), (3, 6)]
        env.reset(seed=0)
        env.step(env.action_space.sample())


def test_probe_failure_is_a_worker_error_and_leaves_nothing_behind():
    before = _shm()
    fns = [CostEnv] * 3 + [functools.partial(CostEnv, fail_in_step=True)]
    with pytest.raises(fastvec.WorkerError, match=r"env 3 raised RuntimeError: this env cannot step.*placement probe"):
        fastvec.AsyncVectorEnv(fns, num_workers=2, placement="balanced")
    assert _shm() == before


def test_default_placement_report_measures_the_step():
    venv = fastvec.SubprocVecEnv([lambda: gym.make("CartPole-v1")] * 4, num_workers=2)
    try:
        venv.reset()
        report = venv.placement
        assert report.mode == "contiguous" and report.probe_us is None
        assert np.isnan(report.env_us).all()  # nothing stepped yet
        for _ in range(10):
            venv.step(np.zeros(4, dtype=np.int64))
        assert all(0 < us < 1e5 for us in venv.placement.env_us)
    finally:
        venv.close()
    with pytest.raises(fastvec.ClosedError):
        venv.placement  # noqa: B018


def test_ray_doors_refuse_a_placement_before_ray_starts():
    ray_doors = pytest.importorskip("fastvec.ray")
    with pytest.raises(ValueError, match="not available on Ray"):
        ray_doors.AsyncVectorEnv([RandomEndEnv] * 2, placement="balanced")


# ----------------------------------------------------------------- mixed envs in one vector env
def test_mixed_env_ids_and_settings_balanced_match_sync():
    """HalfCheetah under two settings and two CartPole versions side by side (one shape
    of spaces), placed by their costs: each env's trajectory is SyncVectorEnv's. (The
    probe's own placement is tested on envs of set costs above: a probe's choice
    between near-equal splits would make this test depend on the machine's noise.)"""
    slow = functools.partial(gym.make, "HalfCheetah-v5", frame_skip=40)
    fast = functools.partial(gym.make, "HalfCheetah-v5", ctrl_cost_weight=0.5)
    fns = [slow, slow, fast, fast, fast, fast]
    env = fastvec.AsyncVectorEnv(fns, num_workers=2, placement="balanced", env_costs=[5, 5, 1, 1, 1, 1])
    ref = SyncVectorEnv(fns)
    try:
        assert [sorted(i < 2 for i in w) for w in env.placement.workers] == [[False, False, True]] * 2
        gym_lockstep(env, ref, 60, seed=3, mode=AutoresetMode.NEXT_STEP)
    finally:
        env.close()
        ref.close()
    versions = [functools.partial(gym.make, v) for v in ("CartPole-v0", "CartPole-v1", "CartPole-v0", "CartPole-v1")]
    env = fastvec.AsyncVectorEnv(versions, placement=[[0, 3], [1, 2]], autoreset_mode=AutoresetMode.SAME_STEP)
    ref = SyncVectorEnv(versions, autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        assert gym_lockstep(env, ref, 300, seed=5, mode=AutoresetMode.SAME_STEP)["final"] > 0
        assert env.get_attr("spec") == ref.get_attr("spec")
    finally:
        env.close()
        ref.close()


def test_mixed_bounds_with_observation_mode_different_and_a_placement():
    from test_gym_dropin import _bounded_fns

    env = fastvec.AsyncVectorEnv(_bounded_fns(), observation_mode="different", placement=[[2], [0, 1]])
    ref = SyncVectorEnv(_bounded_fns(), observation_mode="different")
    try:
        assert env.observation_space == ref.observation_space
        gym_lockstep(env, ref, 20, seed=1, mode=AutoresetMode.NEXT_STEP)
    finally:
        env.close()
        ref.close()


def test_a_killed_worker_is_replaced_with_its_envs_and_the_rest_stay_sync():
    """kill -9 of the worker running envs 0 and 3: the replacement runs 0 and 3 again
    (they end truncated there), while envs 1 and 2 go on exactly as SyncVectorEnv's."""
    import signal

    fns = [RandomEndEnv] * 4
    placement = [[0, 3], [1, 2]]
    ref = SyncVectorEnv(fns)
    with pytest.warns(RuntimeWarning, match=r"restarted worker 0 and reset envs 0, 3"):
        with fastvec.AsyncVectorEnv(fns, placement=placement, restart_on_error=True) as env:
            assert_same(env.reset(seed=9)[0], ref.reset(seed=9)[0], "reset")
            space = ref.action_space
            space.seed(9)
            for t in range(30):
                if t == 10:
                    pid = env.worker_pids[0]
                    os.kill(pid, signal.SIGKILL)
                    while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:  # dead, not reaped
                        time.sleep(0.01)
                actions = space.sample()
                obs, rew, term, trunc, infos = env.step(actions)
                robs, rrew, rterm, rtrunc, _ = ref.step(actions)
                keep = [1, 2]
                assert_same(obs[keep], robs[keep], f"step {t} obs")
                assert_same(rew[keep], rrew[keep], f"step {t} rewards")
                assert_same(term[keep], rterm[keep], f"step {t} terminated")
                if t == 10:
                    assert infos["_fastvec_restarted"].tolist() == [True, False, False, True]
                    assert trunc[0] and trunc[3]
            assert [list(w) for w in env.placement.workers] == placement
            assert env.engine.restarts[0]["envs"] == [0, 3] and env.worker_pids[0] != pid
    ref.close()
