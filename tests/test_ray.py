"""``fastvec.ray`` on a real multi-node Ray cluster, simulated on this machine.

One ``ray.cluster_utils.Cluster`` serves the module: a head node (the driver's) and a
second node, each with its own raylet, object store and 2 logical CPUs, every Ray
process pinned to 127.0.0.1 (checked). Actors on the head node use the shared-memory
fast path; actors on the second node go through Ray tasks and the object store, as they
would on another machine. Covered:

- placement (actors on both nodes, actors per node, envs per actor);
- trajectories equal to ``gymnasium.vector.SyncVectorEnv``, to the single-machine
  ``fastvec.AsyncVectorEnv`` and to SB3's ``DummyVecEnv``, step by step, both front
  doors, several actor counts and all autoreset modes;
- a SIGKILLed actor -> ``fastvec.WorkerError`` (no timeout needed); a frozen actor past
  ``step_timeout`` -> ``WorkerError``; with ``restart_on_error`` a replaced actor and
  truncated envs carrying ``info["fastvec_restarted"]``;
- ``close()`` leaves no actor, worker process or shared-memory segment behind, and the
  cluster's shutdown leaves no process at all;
- bad arguments -> ``ValueError`` before anything starts;
- a local Ray instance started by fastvec (in a child process) listens on loopback only
  and goes away with the last vector env; ``fastvec train --backend ray``.

Ray puts the driver's working directory on its workers' ``sys.path``: the cluster is
started from ``tests/`` so the actors import ``envs``/``fault_envs`` from here and
fastvec from wherever the tests import it (never a source tree shadowing a wheel).
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import numpy as np
import psutil
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

ray = pytest.importorskip("ray")
import conftest  # noqa: E402
import fault_envs as fe  # noqa: E402
from envs import DictTupleEnv, FlatInfoEnv, ImageEnv, RandomEndEnv, raising_factory  # noqa: E402
from helpers import assert_same  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import fastvec  # noqa: E402
import fastvec.ray as fr  # noqa: E402
from fastvec import WorkerError  # noqa: E402
from fastvec.ray.placement import split_weighted  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_CPUS = 2
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
ACTOR_TITLE = "_FastvecActor"  # Ray titles actor processes (and their forked workers) ray::_FastvecActor...
GRACE_S = 10.0

pytestmark = pytest.mark.timeout(240)


# --------------------------------------------------------------------------- helpers
def _alive(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE and ACTOR_TITLE in " ".join(p.cmdline())
    except psutil.Error:
        return False


def _actor_processes() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and ACTOR_TITLE in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            pass
    return out


def _listening(pids) -> list[tuple[int, str, int]]:
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            conns = (
                proc.net_connections(kind="inet") if hasattr(proc, "net_connections") else proc.connections(kind="inet")
            )
        except psutil.Error:
            continue
        out += [(pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


OPENED: list = []  # engines a test opened (their processes and segments are checked after it)


def opened(env):
    OPENED.append(env.engine if hasattr(env, "engine") else env)
    return env


@pytest.fixture(autouse=True)
def no_leaks():
    """Ray-aware version of conftest's check. The cluster's own processes (raylets, idle
    workers) come and go; what must not outlive a test: fastvec's actors, their engines'
    workers, the ring segment and the actors' engine segments."""
    OPENED.clear()
    conftest._created.clear()
    yield
    engines = list(OPENED)
    OPENED.clear()
    problems = []
    for eng in engines:
        if not eng.closed:
            problems.append(f"{eng!r} was left open")
            eng.close()
    pids = {pid for eng in engines for h in eng.history for pid in [h["pid"], *h["worker_pids"]]}
    segments = {h["shm_name"] for eng in engines for h in eng.history if h["shm_name"]}
    deadline = time.monotonic() + GRACE_S
    while True:
        live = sorted(pid for pid in pids if _alive(pid))
        actors = [p.pid for p in _actor_processes()]
        segs = sorted(s for s in segments if os.path.exists(os.path.join("/dev/shm", s)))
        ours = sorted(conftest._created & conftest._segments())
        if not (live or actors or segs or ours) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if live or actors:
        left = sorted(set(live) | set(actors))
        problems.append(f"actor/worker processes still alive {GRACE_S:g} s after the test: {left}")
    if segs or ours:
        problems.append(f"shared-memory segments left behind: {segs + ours}")
        for name in segs + ours:
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass
    conftest._created.clear()
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes on this machine, every Ray process on 127.0.0.1."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    cwd = os.getcwd()
    os.chdir(HERE)  # the workers' sys.path gets tests/ (envs, fault_envs)
    c = None
    try:
        with fr.loopback_only():
            c = Cluster(
                initialize_head=True,
                head_node_args={"num_cpus": NODE_CPUS, "node_ip_address": "127.0.0.1", "include_dashboard": False},
            )
            c.add_node(num_cpus=NODE_CPUS, node_ip_address="127.0.0.1")
            ray.init(address=c.address, log_to_driver=False, logging_level="error")
    except BaseException:
        if c is not None:
            c.shutdown()
        raise
    finally:
        os.chdir(cwd)
    c.head_id = c.head_node.node_id
    c.other_id = next(iter(c.worker_nodes)).node_id
    yield c
    ray.shutdown()
    c.shutdown()
    # The cluster's shutdown leaves no process behind: raylets, GCS, workers, actors.
    deadline = time.monotonic() + GRACE_S
    while True:
        left = []
        helpers = conftest._helper_pids()  # multiprocessing's resource tracker: ours, for the session
        for p in psutil.Process().children(recursive=True):
            try:
                if p.pid not in before | helpers and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{p.pid} {' '.join(p.cmdline())[:80]}")
            except psutil.Error:
                pass
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"processes left after the cluster's shutdown: {left}"


# Env factories come from modules the actors can import (tests/ is on their path); a
# function of this module would make them import the test module itself.
cartpole = fe.make_cartpole


def faulty_fns(n):
    return [functools.partial(fe.make_faulty, i) for i in range(n)]


def lockstep_gym(env, ref, steps, seed, mode, extra_refs=()):
    seen = {"ends": 0, "final": 0, "masked": 0}
    got = env.reset(seed=seed)
    for r in (ref, *extra_refs):
        want = r.reset(seed=seed)
        assert_same(got[0], want[0], "reset obs")
        assert_same(got[1], want[1], "reset infos")
    space = ref.action_space
    space.seed(seed + 1000)
    for t in range(steps):
        actions = space.sample()
        got = env.step(actions)
        for r in (ref, *extra_refs):
            want = r.step(actions)
            for name, a, b in zip(("obs", "rewards", "terminated", "truncated", "infos"), got, want):
                assert_same(a, b, f"step {t} {name}")
        done = got[2] | got[3]
        seen["ends"] += int(done.sum())
        seen["final"] += "final_obs" in got[4]
        if mode == AutoresetMode.DISABLED and done.any():
            g = env.reset(options={"reset_mask": done.copy()})
            for r in (ref, *extra_refs):
                w = r.reset(options={"reset_mask": done.copy()})
                assert_same(g[0], w[0], f"step {t} masked reset obs")
                assert_same(g[1], w[1], f"step {t} masked reset infos")
            seen["masked"] += 1
    return seen


# --------------------------------------------------------------------------- placement
def test_cluster_is_loopback_only_and_actors_span_nodes(cluster):
    env = opened(fr.AsyncVectorEnv([cartpole] * 6, num_actors=2))
    try:
        eng = env.engine
        assert env.num_actors == env.num_workers == 2
        assert repr(env) == "fastvec.ray.AsyncVectorEnv(num_envs=6, num_actors=2)"
        assert eng.groups == [(0, 3), (3, 6)]
        nodes = [p["node_id"] for p in eng.placement]
        assert nodes == [cluster.head_id, cluster.other_id]  # one per node, the driver's first
        assert [p["fast_path"] for p in eng.placement] == [True, False]
        info = eng.process_info()
        assert [i["node_id"] for i in info] == nodes  # as the actors themselves report
        # each actor's engine: as many workers as the actor's CPUs (2), at most one per env
        assert all(len(i["worker_pids"]) == 2 and i["pid"] not in i["worker_pids"] for i in info)
        # the defaults fill the CPUs Ray reports: each actor holds its node's 2 CPUs
        assert [p["num_cpus"] for p in eng.placement] == [NODE_CPUS, NODE_CPUS]
        deadline = time.monotonic() + 10  # the cluster's resource view lags a little
        while ray.available_resources().get("CPU", 0) != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ray.available_resources().get("CPU", 0) == 0
        env.reset(seed=0)
        env.step(env.action_space.sample())
        # Every process of the cluster listens on loopback only (Ray would take the
        # machine's outward address unless pinned).
        tree = [p.pid for p in psutil.Process().children(recursive=True)] + [os.getpid()]
        sockets = _listening(tree)
        assert any(pid in [i["pid"] for i in info] for pid, _, _ in sockets)  # the actors' own servers
        assert len({pid for pid, _, _ in sockets}) >= 4  # GCS, 2 raylets, workers...
        outward = [s for s in sockets if s[1] not in LOOPBACK]
        assert not outward, f"listening beyond loopback: {outward}"
    finally:
        env.close()


def test_actors_per_node_and_envs_per_actor(cluster):
    eng = opened(fr.RayEngine([cartpole] * 7, actors_per_node=2, workers_per_actor=1))
    try:
        assert eng.num_actors == 4
        assert [p["node_id"] for p in eng.placement] == [cluster.head_id] * 2 + [cluster.other_id] * 2
        assert [p["num_cpus"] for p in eng.placement] == [1.0] * 4
        assert eng.groups == [(0, 2), (2, 4), (4, 6), (6, 7)]
        assert [p["num_workers"] for p in eng.placement] == [1, 1, 1, 1]
    finally:
        eng.close()
    eng = opened(fr.RayEngine([cartpole] * 7, envs_per_actor=3, num_cpus_per_actor=0, workers_per_actor=2))
    try:
        assert eng.num_actors == 3
        assert eng.groups == [(0, 3), (3, 6), (6, 7)]
        assert [p["num_workers"] for p in eng.placement] == [2, 2, 1]
        assert sorted(set(p["node_id"] for p in eng.placement)) == sorted([cluster.head_id, cluster.other_id])
    finally:
        eng.close()


def test_split_weighted():
    assert split_weighted(10, [2, 2]) == [(0, 5), (5, 10)]
    assert split_weighted(10, [4, 1]) == [(0, 8), (8, 10)]
    assert split_weighted(3, [100, 1, 1]) == [(0, 1), (1, 2), (2, 3)]
    assert split_weighted(7, [1, 1, 1]) == [(0, 3), (3, 5), (5, 7)]
    with pytest.raises(ValueError):
        split_weighted(2, [1, 1, 1])


# --------------------------------------------------------------------------- equivalence
GYM_CASES = [
    # (id, maker, num_envs, ray kwargs, mode, steps)
    ("cartpole-2actors-same", cartpole, 6, {"num_actors": 2}, AutoresetMode.SAME_STEP, 200),
    (
        "random_end-3actors-next",
        RandomEndEnv,
        7,
        {"actors_per_node": 2, "num_actors": 3, "num_cpus_per_actor": 0},
        AutoresetMode.NEXT_STEP,
        80,
    ),
    (
        "random_end-2actors-same-ray_tasks",
        RandomEndEnv,
        5,
        {"num_actors": 2, "local_fast_path": False},
        AutoresetMode.SAME_STEP,
        80,
    ),
    ("dict_tuple-2actors-disabled", DictTupleEnv, 5, {"num_actors": 2}, AutoresetMode.DISABLED, 60),
    ("flat_info-2actors-same", FlatInfoEnv, 6, {"num_actors": 2}, AutoresetMode.SAME_STEP, 100),
    ("random_end-1actor-same", RandomEndEnv, 4, {"num_actors": 1}, AutoresetMode.SAME_STEP, 60),
    # 30 KB observations, 4 envs per actor: they come back in chunks Ray sends inline
    (
        "image-2actors-same-ray_tasks-chunked",
        functools.partial(ImageEnv, (100, 100, 3)),
        8,
        {"num_actors": 2, "local_fast_path": False},
        AutoresetMode.SAME_STEP,
        60,
    ),
]


@pytest.mark.parametrize("case", GYM_CASES, ids=[c[0] for c in GYM_CASES])
def test_gym_door_matches_sync_and_local_engine(cluster, case):
    _id, maker, n, kwargs, mode, steps = case
    fns = [maker] * n
    env = opened(fr.AsyncVectorEnv(fns, autoreset_mode=mode, **kwargs))
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    local = fastvec.AsyncVectorEnv(fns, num_workers=2, autoreset_mode=mode)
    try:
        assert env.num_actors == kwargs.get("num_actors", 2)
        assert env.metadata["autoreset_mode"] == mode
        chunked = [c is not None for c in env.engine._chunks]
        assert chunked == [_id.endswith("chunked")] * env.num_actors
        seen = lockstep_gym(env, ref, steps, seed=5, mode=mode, extra_refs=(local,))
        # env methods across actors, in env order
        assert env.get_attr("spec") == ref.get_attr("spec")
        if maker is RandomEndEnv:
            assert env.get_attr("episodes") == ref.get_attr("episodes")
            env.set_attr("p_end", [0.5 + i / 100 for i in range(n)])
            assert env.get_attr("p_end") == tuple(0.5 + i / 100 for i in range(n))
            assert_same(env.render(), ref.render(), "render")
    finally:
        env.close()
        ref.close()
        local.close()
    assert seen["ends"] > 0
    if mode == AutoresetMode.SAME_STEP:
        assert seen["final"] > 0
    if mode == AutoresetMode.DISABLED:
        assert seen["masked"] > 0


@pytest.mark.parametrize(
    "maker,n,kwargs",
    [
        (RandomEndEnv, 5, {"num_actors": 2}),
        (cartpole, 6, {"num_actors": 3, "num_cpus_per_actor": 0, "local_fast_path": False}),
    ],
    ids=["random_end-2actors", "cartpole-3actors-ray_tasks"],
)
def test_sb3_door_matches_dummy(cluster, maker, n, kwargs):
    from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv

    fns = [maker] * n
    env = opened(fr.SubprocVecEnv(fns, **kwargs))
    ref = DummyVecEnv(fns)
    try:
        assert isinstance(env, VecEnv)
        env.seed(3)
        ref.seed(3)
        assert_same(env.reset(), ref.reset(), "reset obs")
        assert_same(env.reset_infos, ref.reset_infos, "reset infos")
        space = env.action_space
        space.seed(11)
        dones = 0
        for t in range(120):
            actions = np.array([space.sample() for _ in range(n)])
            got, want = env.step(actions), ref.step(actions)
            for name, a, b in zip(("obs", "rewards", "dones", "infos"), got, want):
                assert_same(a, b, f"step {t} {name}")
            assert_same(env.reset_infos, ref.reset_infos, f"step {t} reset infos")
            dones += int(want[2].sum())
        assert dones > 0
        assert_same(
            env.env_method("reset", seed=4, indices=[n - 1, 0]),
            ref.env_method("reset", seed=4, indices=[n - 1, 0]),
            "env_method",
        )
        assert env.get_attr("np_random_seed", indices=[1, 2]) == ref.get_attr("np_random_seed", indices=[1, 2])
        assert env.env_is_wrapped(gym.Wrapper) == ref.env_is_wrapped(gym.Wrapper)
    finally:
        env.close()
        ref.close()


def test_render_and_calls_across_actors(cluster):
    fns = [functools.partial(RandomEndEnv, render_mode="rgb_array")] * 5
    env = opened(fr.AsyncVectorEnv(fns, num_actors=2, num_cpus_per_actor=0))
    ref = SyncVectorEnv(fns)
    try:
        env.reset(seed=1)
        ref.reset(seed=1)
        frames = env.render()
        assert len(frames) == 5 and all(f.shape == (8, 8, 3) and f.dtype == np.uint8 for f in frames)
        assert_same(frames, ref.render(), "render")
        assert_same(env.call("reset", seed=9), ref.call("reset", seed=9), "call")
        assert env.np_random_seed == ref.np_random_seed
    finally:
        env.close()
        ref.close()


def test_fast_path_falls_back_to_ray_tasks(cluster):
    """An actor on the driver's node that cannot map the driver's ring steps through Ray
    tasks instead (with a warning)."""
    eng = opened(fr.RayEngine([cartpole] * 2, num_actors=1, num_cpus_per_actor=0, local_fast_path=False))
    try:
        assert eng.placement[0]["node_id"] == cluster.head_id and not eng.placement[0]["fast_path"]
        eng.local_fast_path = True
        ring = eng.shm_name
        eng.shm_name = "fastvec_" + "0" * 24  # no such segment
        with pytest.warns(RuntimeWarning, match="cannot share this process's memory"):
            eng._open_fast_path(0)
        eng.shm_name = ring
        assert not eng.placement[0]["fast_path"]
        eng.reset(0, {0: {"seed": 1}, 1: {"seed": 2}})
        eng.step_async(np.zeros(2, np.int64), 1)
        eng.step_wait()
        ray_path = eng.obs_bufs[0][1].copy()
        eng._open_fast_path(0)  # the real ring: now through shared memory
        assert eng.placement[0]["fast_path"]
        eng.reset(0, {0: {"seed": 1}, 1: {"seed": 2}})
        eng.step_async(np.zeros(2, np.int64), 1)
        eng.step_wait()
        np.testing.assert_array_equal(eng.obs_bufs[0][1], ray_path)
    finally:
        eng.close()


def test_trainer_backend_layout(cluster):
    """What the trainer uses: step_async(IN_SLOT, slot) on actions written straight into the
    ring, ``num_slots = n_steps + 1`` slots, results in place."""
    T, n = 6, 4
    eng = opened(fr.RayEngine([RandomEndEnv] * n, num_actors=2, num_slots=T + 1))
    from fastvec.engine import IN_SLOT

    local = fastvec.engine.Engine([RandomEndEnv] * n, num_workers=2, num_slots=T + 1)
    try:
        kw = {i: {"seed": 10 + i} for i in range(n)}
        assert_same(eng.reset(0, kw), local.reset(0, kw))
        rng = np.random.default_rng(0)
        for rollout in range(3):
            for t in range(T):
                acts = rng.integers(0, 3, n)
                for e in (eng, local):
                    e.act_bufs[0][t + 1] = acts
                    e.step_async(IN_SLOT, t + 1)
                assert_same(
                    eng.step_wait().env_records(),
                    local.step_wait().env_records(),
                    f"rollout {rollout} step {t} records",
                )
            for name in ("obs_bufs", "final_bufs"):
                got, want = getattr(eng, name)[0], getattr(local, name)[0]
                done = eng.terminated[1:] | eng.truncated[1:]
                if name == "final_bufs":
                    np.testing.assert_array_equal(got[1:][done], want[1:][done])
                else:
                    np.testing.assert_array_equal(got, want)
            for name in ("rewards", "terminated", "truncated"):
                np.testing.assert_array_equal(getattr(eng, name), getattr(local, name))
            for e in (eng, local):
                for buf in e.obs_bufs:
                    buf[0] = buf[T]
    finally:
        eng.close()
        local.close()


def test_steps_are_pipelined(cluster):
    """Actions reach every actor at once: two actors that each sleep 1 s in one step
    sleep at the same time, not one after the other (shown by the sleeps' own clocks, so
    a slow host cannot make or break it), and the step returns after both."""
    env = opened(fr.AsyncVectorEnv(faulty_fns(4), num_actors=2, num_cpus_per_actor=0))
    try:
        env.reset(seed=0)
        env.set_attr("arm_step", ["slow", None, "slow", None])
        t0 = time.monotonic()
        env.step(np.zeros(4, np.int64))
        t1 = time.monotonic()
        spans = env.get_attr("slow_span")
        (a0, a1), (b0, b1) = spans[0], spans[2]  # env 0 on actor 0, env 2 on actor 1
        assert spans[1] is None and spans[3] is None, spans
        assert max(a0, b0) < min(a1, b1), f"the actors slept one after the other: {spans}"
        assert t0 <= min(a0, b0) and max(a1, b1) <= t1, (t0, spans, t1)
    finally:
        env.close()


# --------------------------------------------------------------------------- faults
def _kill(pid: int, sig=signal.SIGKILL) -> None:
    os.kill(pid, sig)


def _stop(pid: int, timeout: float = 5.0) -> None:
    """SIGSTOP ``pid`` and return once all its threads are stopped: the signal is
    delivered asynchronously, and a spinning actor could otherwise answer one more step."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _is_stopped(pid):
            return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not stop within {timeout} s")


def _is_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (by a signal or a tracer)."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:  # a thread that just ended
            pass
    return bool(states) and all(s in "Tt" for s in states)


@pytest.mark.parametrize("door", ["gym", "sb3"])
@pytest.mark.parametrize("victim", [0, 1], ids=["fast_path_actor", "remote_actor"])
def test_killed_actor_raises_worker_error(cluster, door, victim):
    fns = faulty_fns(4)
    env = opened(
        fr.AsyncVectorEnv(fns, num_actors=2, num_cpus_per_actor=0)
        if door == "gym"
        else fr.SubprocVecEnv(fns, num_actors=2, num_cpus_per_actor=0)
    )
    try:
        env.reset(seed=1) if door == "gym" else env.reset()
        name = "AsyncVectorEnv" if door == "gym" else "SubprocVecEnv"
        assert repr(env) == f"fastvec.ray.{name}(num_envs=4, num_actors=2)" and env.num_actors == 2
        acts = np.zeros(4, np.int64)
        env.step(acts)
        pid = env.engine.placement[victim]["pid"]
        _kill(pid)
        t0 = time.perf_counter()
        with pytest.raises(WorkerError) as info:  # no step_timeout: death alone is enough
            for _ in range(50):
                env.step(acts)
                time.sleep(0.05)
        assert time.perf_counter() - t0 < 30
        err = info.value
        assert err.worker == victim
        assert err.env_indices == ((0, 1) if victim == 0 else (2, 3))
        assert f"actor {victim}" in str(err) and "died" in str(err)
        with pytest.raises(WorkerError, match="unusable"):
            env.step(acts)
    finally:
        env.close()
    env.close()  # idempotent


def test_killed_actor_during_step(cluster):
    env = opened(fr.AsyncVectorEnv(faulty_fns(4), num_actors=2, num_cpus_per_actor=0))
    try:
        env.reset(seed=1)
        env.set_attr("arm_step", [None, None, "slow", None])
        env.step_async(np.zeros(4, np.int64))
        time.sleep(0.2)
        _kill(env.engine.placement[1]["pid"])
        t0 = time.perf_counter()
        with pytest.raises(WorkerError, match="actor 1") as info:
            env.step_wait()
        assert time.perf_counter() - t0 < 20
        assert info.value.env_indices == (2, 3)
    finally:
        env.close()


@pytest.mark.parametrize("victim", [0, 1], ids=["fast_path_actor", "remote_actor"])
def test_frozen_actor_times_out(cluster, victim):
    env = opened(fr.AsyncVectorEnv(faulty_fns(4), num_actors=2, num_cpus_per_actor=0, step_timeout=1.0))
    pid = None
    try:
        env.reset(seed=1)
        pid = env.engine.placement[victim]["pid"]
        _stop(pid)
        t0 = time.perf_counter()
        with pytest.raises(WorkerError, match="did not answer within") as info:
            env.step(np.zeros(4, np.int64))
        assert time.perf_counter() - t0 < 6.0  # not a hang
        # the deadline it reports waiting out is step_timeout plus the driver's grace
        # (max(1, 0.5 s)), and the actor was still frozen when the step gave up on it
        waited = float(re.search(r"did not answer within (\S+) s", str(info.value)).group(1))
        assert waited == pytest.approx(1.0 + 1.0, abs=0.05), str(info.value)
        assert _is_stopped(pid) and info.value.worker == victim
    finally:
        env.close()  # kills the stopped actor
        if pid is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass


def test_hung_env_reported_by_the_actors_engine(cluster):
    env = opened(fr.AsyncVectorEnv(faulty_fns(4), num_actors=2, num_cpus_per_actor=0, step_timeout=1.0))
    try:
        env.reset(seed=1)
        env.set_attr("arm_step", [None, None, None, "hang"])
        t0 = time.perf_counter()
        with pytest.raises(WorkerError) as info:
            env.step(np.zeros(4, np.int64))
        assert time.perf_counter() - t0 < 6.0
        assert info.value.worker == 1 and info.value.env_indices == (2, 3)
    finally:
        env.close()


def test_env_raises_in_step(cluster):
    env = opened(fr.AsyncVectorEnv(faulty_fns(4), num_actors=2, num_cpus_per_actor=0))
    try:
        env.reset(seed=1)
        env.set_attr("arm_step", [None, None, "raise", None])
        with pytest.raises(WorkerError) as info:
            env.step(np.zeros(4, np.int64))
        err = info.value
        assert err.env_index == 2 and err.worker == 1
        assert err.exc_type == "ValueError" and "injected step fault in env 2" in err.exc_message
        assert "_raise_in_step" in err.worker_traceback
        # an env that raised leaves the vector env usable: reset and go on
        env.reset(seed=2)
        env.step(np.zeros(4, np.int64))
        env.set_attr("explosive", [False, False, False, True])
        with pytest.raises(WorkerError) as info:
            env.call("explode")
        assert info.value.env_index == 3 and info.value.exc_type == "ValueError"
        env.step(np.zeros(4, np.int64))
    finally:
        env.close()


@pytest.mark.parametrize(
    "door,victim",
    [("gym", 1), ("sb3", 1), ("gym", 0)],
    ids=["gym-remote_actor", "sb3-remote_actor", "gym-fast_path_actor"],
)
def test_restart_on_error_replaces_a_killed_actor(cluster, door, victim):
    fns = faulty_fns(4)
    mine = (0, 1) if victim == 0 else (2, 3)
    others = (2, 3) if victim == 0 else (0, 1)
    expect = [i in mine for i in range(4)]
    kwargs = dict(num_actors=2, num_cpus_per_actor=0, restart_on_error=True)
    env = opened(
        fr.AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP, **kwargs)
        if door == "gym"
        else fr.SubprocVecEnv(fns, **kwargs)
    )
    try:
        env.reset(seed=1) if door == "gym" else env.reset()
        acts = np.zeros(4, np.int64)
        out = env.step(acts)
        before_obs = np.array(out[0])
        old = env.engine.placement[victim]["pid"]
        _kill(old)
        with pytest.warns(RuntimeWarning, match=f"restarted actor {victim}"):
            out = env.step(acts)
        new = env.engine.placement[victim]["pid"]
        assert new != old and not _alive(old)
        assert env.engine.placement[victim]["fast_path"] == (victim == 0), (env.engine.placement, cluster.head_id)
        assert env.engine.restarts[-1]["actor"] == victim and env.engine.restarts[-1]["envs"] == list(mine)
        if door == "gym":
            obs, rew, term, trunc, infos = out
            np.testing.assert_array_equal(trunc, expect)
            np.testing.assert_array_equal(term, [False] * 4)
            np.testing.assert_array_equal(rew[list(mine)], [0.0, 0.0])
            # same-step autoreset: the ended episode's info is the final_info
            np.testing.assert_array_equal(infos["_final_obs"], expect)
            np.testing.assert_array_equal(infos["final_info"]["_fastvec_restarted"], expect)
            for i in mine:  # the last observation before the actor died
                np.testing.assert_array_equal(infos["final_obs"][i], before_obs[i])
        else:
            obs, rew, dones, infos = out
            np.testing.assert_array_equal(dones, expect)
            assert all(infos[i]["fastvec_restarted"] for i in mine)
            assert not any(infos[i].get("fastvec_restarted") for i in others)
            assert "died" in infos[mine[0]]["fastvec_error"]
            np.testing.assert_array_equal(infos[mine[0]]["terminal_observation"], before_obs[mine[0]])
        for _ in range(20):  # the replacement steps like any actor: its new envs took them all
            env.step(acts)
        assert list(env.get_attr("steps")) == [20 if i in mine else 22 for i in range(4)]
    finally:
        env.close()


def test_restart_on_error_env_raises_restarts_one_worker(cluster):
    env = opened(
        fr.AsyncVectorEnv(
            faulty_fns(4),
            num_actors=1,
            workers_per_actor=2,
            num_cpus_per_actor=0,
            restart_on_error=True,
            autoreset_mode=AutoresetMode.SAME_STEP,
        )
    )
    try:
        env.reset(seed=1)
        env.set_attr("arm_step", [None, None, None, "raise"])
        with pytest.warns(RuntimeWarning, match="restarted its worker 1"):
            _obs, _rew, _term, trunc, infos = env.step(np.zeros(4, np.int64))
        np.testing.assert_array_equal(trunc, [False, False, True, True])
        np.testing.assert_array_equal(infos["final_info"]["_fastvec_restarted"], [False, False, True, True])
        rec = env.engine.restarts[-1]
        assert rec["actor"] == 0 and rec["inner_worker"] == 1 and rec["envs"] == [2, 3]
        env.step(np.zeros(4, np.int64))
    finally:
        env.close()


def test_close_with_a_step_in_flight_and_double_close(cluster):
    env = opened(fr.AsyncVectorEnv([cartpole] * 4, num_actors=2, num_cpus_per_actor=0))
    env.reset(seed=0)
    env.step_async(np.zeros(4, np.int64))
    env.close()
    env.close()
    with pytest.raises(fastvec.ClosedError):
        env.step(np.zeros(4, np.int64))


def test_bad_actions_dispatch_nothing(cluster):
    # the "bounds" rule (the gymnasium door's default passes out-of-range values on)
    env = opened(fr.AsyncVectorEnv([cartpole] * 4, num_actors=2, num_cpus_per_actor=0, action_check="bounds"))
    try:
        env.reset(seed=0)
        for bad in (np.full(4, 2), np.zeros(3, np.int64), np.array([0.5, 0, 0, 0]), "0000", None):
            with pytest.raises(ValueError):
                env.step(bad)
        env.step(np.zeros(4, np.int64))  # still fine
    finally:
        env.close()


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_actors": 0}, "num_actors"),
        ({"num_actors": True}, "num_actors"),
        ({"num_actors": "2"}, "num_actors"),
        ({"num_actors": 5}, "exceeds num_envs"),
        ({"actors_per_node": 0}, "actors_per_node"),
        ({"envs_per_actor": -1}, "envs_per_actor"),
        ({"envs_per_actor": 2, "num_actors": 3}, "does not match"),
        ({"workers_per_actor": 0}, "workers_per_actor"),
        ({"num_cpus_per_actor": -1}, "num_cpus_per_actor"),
        ({"num_cpus_per_actor": 1.5}, "whole number"),
        ({"num_slots": 0}, "num_slots"),
        ({"autoreset_mode": "sometimes"}, "autoreset_mode"),
        ({"step_timeout": 0}, "step_timeout"),
        ({"step_timeout": float("nan")}, "step_timeout"),
        ({"context": "thread"}, "context"),
        ({"ray_address": ""}, "ray_address"),
        ({"ray_address": 6379}, "ray_address"),
        ({"ray_init_kwargs": ["num_cpus", 1]}, "ray_init_kwargs"),
        ({"spin_us": -1}, "spin_us"),
    ],
)
def test_bad_arguments(kwargs, match):
    """Rejected before anything starts (no Ray connection is needed)."""
    with pytest.raises(ValueError, match=match):
        fr.RayEngine([cartpole] * 4, **kwargs)


def test_bad_env_fns():
    with pytest.raises(ValueError, match="empty"):
        fr.RayEngine([])
    with pytest.raises(ValueError, match="not callable"):
        fr.RayEngine([cartpole, 3])
    import threading

    lock = threading.Lock()
    with pytest.raises(ValueError, match="pickle"):
        fr.RayEngine([lambda: (lock, cartpole())[1]] * 2)


def test_bad_placement_and_spaces(cluster):
    with pytest.raises(ValueError, match="need 3 nodes"):
        fr.RayEngine([cartpole] * 6, num_actors=5, actors_per_node=2)
    with pytest.raises(ValueError, match="do not fit"):
        fr.RayEngine([cartpole] * 6, num_actors=2, num_cpus_per_actor=NODE_CPUS + 1)
    with pytest.raises(ValueError, match="all envs of a vector env must share their spaces"):
        fr.RayEngine([cartpole, cartpole, RandomEndEnv, RandomEndEnv], num_actors=2, num_cpus_per_actor=0)
    with pytest.raises(WorkerError) as info:
        fr.RayEngine([cartpole, cartpole, cartpole, raising_factory], num_actors=2, num_cpus_per_actor=0)
    assert info.value.env_index == 3 and info.value.exc_type == "ValueError"
    assert not _actor_processes() or _wait_no_actors()


def _wait_no_actors() -> bool:
    deadline = time.monotonic() + GRACE_S
    while _actor_processes():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_other_address_than_the_connection(cluster):
    with pytest.raises(ValueError, match="already initialized"):
        fr.RayEngine([cartpole] * 2, ray_address="127.0.0.1:1")


# --------------------------------------------------------------------------- local instance
LOCAL_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np, psutil
    import fastvec.ray as fr
    from envs import RandomEndEnv

    me = psutil.Process()
    def listening():
        out = []
        for p in [me] + me.children(recursive=True):
            try:
                conns = p.net_connections(kind="inet") if hasattr(p, "net_connections") else p.connections(kind="inet")
            except psutil.Error:
                continue
            out += [[p.pid, c.laddr.ip, c.laddr.port] for c in conns if c.status == psutil.CONN_LISTEN]
        return out

    a = fr.AsyncVectorEnv([RandomEndEnv] * 4, num_actors=2, num_cpus_per_actor=0)
    b = fr.SubprocVecEnv([RandomEndEnv] * 2, num_actors=1, num_cpus_per_actor=0)  # shares the instance
    a.reset(seed=0); b.reset()
    for _ in range(20):
        a.step(np.zeros(4, np.int64)); b.step(np.zeros(2, np.int64))
    import ray
    report = {"nodes": [n["NodeManagerAddress"] for n in ray.nodes()], "listening": listening(),
              "fast": [p["fast_path"] for p in a.engine.placement],
              "tree": len(me.children(recursive=True))}
    a.close()
    report["still_up"] = ray.is_initialized()  # b still uses it
    b.close()
    report["after"] = ray.is_initialized()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = [p for p in me.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE
                and "resource_tracker" not in " ".join(p.cmdline())]
        if not left:
            break
        time.sleep(0.2)
    report["left"] = [" ".join(p.cmdline())[:80] for p in left]
    print(json.dumps(report))
""")


@pytest.mark.slow
def test_local_instance_is_loopback_and_goes_away(tmp_path):
    """No address and no connection: fastvec starts a local Ray instance, pinned to
    127.0.0.1, shared by the vector envs of the process and stopped with the last one."""
    script = tmp_path / "local_ray.py"
    script.write_text(LOCAL_SCRIPT)
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(script)], cwd=HERE, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["nodes"] == ["127.0.0.1"]
    assert report["fast"] == [True, True]
    assert len(report["listening"]) >= 4, report
    outward = [s for s in report["listening"] if s[1] not in LOOPBACK]
    assert not outward, f"listening beyond loopback: {outward}"
    assert report["still_up"] and not report["after"]
    assert report["left"] == []


KILLED_DRIVER_SCRIPT = textwrap.dedent("""
    import json, numpy as np, psutil
    import fastvec.ray as fr
    from envs import RandomEndEnv
    a = fr.AsyncVectorEnv([RandomEndEnv] * 4, num_actors=2, num_cpus_per_actor=0)
    a.reset(seed=0)
    a.step(np.zeros(4, np.int64))
    eng = a.engine
    print(json.dumps({"pids": [p for h in eng.history for p in [h["pid"], *h["worker_pids"]]],
                      "segments": [h["shm_name"] for h in eng.history] + [eng.shm_name]}), flush=True)
    input()  # until killed
""")


@pytest.mark.slow
def test_killed_driver_leaves_no_actor_or_segment(tmp_path):
    """The driver (which started the local Ray instance) is SIGKILLed: Ray ends the
    actors, and none of fastvec's segments survives (the actors' engines gave up their
    segment names at start-up; the ring goes with the driver's resource tracker)."""
    script = tmp_path / "driver.py"
    script.write_text(KILLED_DRIVER_SCRIPT)
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=HERE,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        report = json.loads(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait(30)
    assert len(report["pids"]) == 4 and len(report["segments"]) == 3
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        live = [pid for pid in report["pids"] if _alive(pid)]
        segs = [s for s in report["segments"] if os.path.exists(os.path.join("/dev/shm", s))]
        if not live and not segs:
            break
        time.sleep(0.2)
    assert not live and not segs, (live, segs)


@pytest.mark.slow
def test_train_cli_with_ray_backend(tmp_path):
    """``fastvec train ... --backend ray --actors 2`` on a local loopback Ray instance
    trains exactly like the single-machine engine: same seed, same episodes, same
    returns."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    results = {}
    for backend in ("ray", "engine"):
        cmd = [
            sys.executable,
            "-m",
            "fastvec",
            "train",
            "CartPole-v1",
            "--num-envs",
            "4",
            "--total-steps",
            "3072",
            "--set",
            "n_steps=64",
            "--no-progress",
            "--no-tensorboard",
            "--logdir",
            str(tmp_path / backend),
            "--seed",
            "3",
            "--backend",
            backend,
        ]
        if backend == "ray":
            cmd += ["--actors", "2"]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[backend] = json.loads(proc.stdout.strip().splitlines()[-1])
    ray_run, engine_run = results["ray"], results["engine"]
    assert ray_run["backend"] == "fastvec-ray" and engine_run["backend"] == "fastvec"
    assert ray_run["num_workers"] == 2  # actors
    assert ray_run["updates"] >= 10 and ray_run["episodes"] > 10
    for key in ("env_steps", "episodes", "updates", "final_mean_return"):
        assert ray_run[key] == engine_run[key], (key, ray_run[key], engine_run[key])
    assert os.path.exists(tmp_path / "ray" / "checkpoint.pt")


def test_fastvec_never_needs_ray():
    """``import fastvec`` and its doors work without Ray; ``import fastvec.ray`` says how
    to get it."""
    code = textwrap.dedent("""
        import sys
        sys.modules["ray"] = None  # as if Ray were not installed
        import fastvec
        fastvec.AsyncVectorEnv, fastvec.SubprocVecEnv, fastvec.Engine
        try:
            import fastvec.ray
        except ImportError as exc:
            print("ImportError:", exc)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert 'pip install "fastvec[ray]"' in proc.stdout


def test_train_cli_flags_without_ray_backend(tmp_path):
    from fastvec.train.commands.cli import main

    assert main("train", ["CartPole-v1", "--actors", "2", "--no-progress"]) == 2
    assert main("train", ["CartPole-v1", "--backend", "ray", "--actors", "0", "--no-progress"]) == 2
