"""Env steps per second of fastvec against the usual vector envs, measured side by side.

Candidates (``CANDIDATES``):

- ``sync``: ``gymnasium.vector.SyncVectorEnv``, the baseline of every ratio;
- ``gym_async``: ``gymnasium.vector.AsyncVectorEnv(shared_memory=True)``;
- ``sb3``: Stable-Baselines3's ``SubprocVecEnv`` (``start_method="fork"``);
- ``baselines``: the one-Pipe-per-env ``SubprocVecEnv`` of OpenAI baselines / easy-rl
  (``benchmarks/peers/baselines_subproc.py``);
- ``envpool``: EnvPool's own C++ envs and thread pool (``envpool.make_gymnasium``), where
  EnvPool has the env: other env code, so compare it with care;
- ``fastvec``: ``fastvec.AsyncVectorEnv`` (``copy=True``, gymnasium-like);
- ``fastvec_sb3``: ``fastvec.SubprocVecEnv`` (SB3 API, ``copy=True``);
- ``fastvec_nocopy``: ``fastvec.AsyncVectorEnv(copy=False)`` (zero-copy views).

Method. Actions are random but drawn before timing (a cycle of ``ACTION_BATCHES``
pre-made batches, in each candidate's dtype), so sampling costs nobody anything. A
*measurement* builds a candidate, resets it with a fixed seed, runs ``warmup`` steps,
then times ``steps`` calls of ``step()`` one by one (``time.perf_counter`` around each
call) and closes it. Candidates are interleaved: one *round* measures every candidate
once (the order rotates from round to round), and the ratio of a candidate is its steps
per second divided by SyncVectorEnv's in the same round, so slow drifts of a shared
machine hit both sides of a ratio alike. Over ``repeats`` rounds we report the median
ratio, its min and max, the median steps/s, and the p50/p90/p99 latency of single
``step()`` calls pooled over the rounds.
"""

from __future__ import annotations

import functools
import gc
import importlib
import importlib.util
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fastvec.options import available_cores

from .envs import make_gym, make_large_obs, make_pong

ACTION_BATCHES = 64
STEP_TIMEOUT_S = 120.0


# ---------------------------------------------------------------------------- workloads
@dataclass
class Workload:
    key: str
    title: str
    env_fn: Callable  # picklable factory of one gymnasium env
    num_envs: int
    steps: int  # timed vector steps per measurement
    warmup: int
    requires: tuple = ()  # importable modules the env needs
    envpool: tuple | None = None  # (task_id, kwargs) for envpool.make_gymnasium
    extra_candidates: tuple = ()
    target: float | None = None  # fastvec / SyncVectorEnv target (from the issue)
    target_vs_baselines: float | None = None  # fastvec / baselines SubprocVecEnv target
    short: str = ""  # label for charts


_PONG_ENVPOOL = dict(
    episodic_life=False,
    reward_clip=False,
    stack_num=4,
    frame_skip=4,
    noop_max=30,
    repeat_action_probability=0.0,
    img_height=84,
    img_width=84,
    gray_scale=True,
    use_fire_reset=False,  # AtariPreprocessing does not press FIRE on reset
)


def default_workloads() -> dict[str, Workload]:
    cartpole = functools.partial(make_gym, "CartPole-v1")
    return {
        w.key: w
        for w in [
            Workload(
                "cartpole16",
                "CartPole-v1, 16 envs",
                cartpole,
                16,
                8000,
                800,
                envpool=("CartPole-v1", {}),
                target=1.2,
                target_vs_baselines=7.0,
                short="CartPole x16",
            ),
            Workload(
                "cartpole64",
                "CartPole-v1, 64 envs",
                cartpole,
                64,
                2000,
                200,
                envpool=("CartPole-v1", {}),
                target=1.7,
                short="CartPole x64",
            ),
            Workload(
                "halfcheetah16",
                "HalfCheetah-v5, 16 envs",
                functools.partial(make_gym, "HalfCheetah-v5"),
                16,
                2000,
                200,
                requires=("mujoco",),
                envpool=("HalfCheetah-v5", {}),
                target=1.8,
                short="HalfCheetah x16",
            ),
            Workload(
                "pong8",
                "Pong (ALE/Pong-v5 + AtariPreprocessing + FrameStack 4), 8 envs",
                make_pong,
                8,
                1000,
                100,
                requires=("ale_py",),
                envpool=("Pong-v5", _PONG_ENVPOOL),
                target=1.9,
                short="Pong x8",
            ),
            Workload(
                "largeobs8",
                "LargeObs (1 MiB float32 obs, trivial dynamics), 8 envs",
                functools.partial(make_large_obs, (256, 1024), "float32"),
                8,
                200,
                20,
                extra_candidates=("fastvec_nocopy",),
                short="LargeObs 1 MiB x8",
            ),
        ]
    }


# ---------------------------------------------------------------------------- candidates
@dataclass
class Candidate:
    key: str
    label: str
    peer: str | None  # name used by --no-peers; None: always run
    build: Callable  # (workload, options) -> Handle
    requires: tuple = ()


@dataclass
class Handle:
    step: Callable
    close: Callable
    settings: str
    action_dtype: object = None  # cast actions to this dtype, if set
    extra: dict = field(default_factory=dict)


def _env_fns(w: Workload):
    return [w.env_fn for _ in range(w.num_envs)]


def _build_sync(w, opts):
    import gymnasium as gym

    env = gym.vector.SyncVectorEnv(_env_fns(w))
    env.reset(seed=opts["seed"])
    return Handle(env.step, env.close, "autoreset=next_step, copy=True")


def _build_gym_async(w, opts):
    import gymnasium as gym

    env = gym.vector.AsyncVectorEnv(_env_fns(w), shared_memory=True)
    env.reset(seed=opts["seed"])
    import multiprocessing as mp

    return Handle(
        env.step,
        env.close,
        f"shared_memory=True, {w.num_envs} processes, context={mp.get_context().get_start_method()}",
    )


def _build_sb3(w, opts):
    from stable_baselines3.common.vec_env import SubprocVecEnv

    # fork rather than SB3's default forkserver: with forkserver every worker imports SB3
    # (and so torch) afresh, which takes ~30 s for 16 envs on 2 cores; stepping is the same.
    env = SubprocVecEnv(_env_fns(w), start_method="fork")
    env.seed(opts["seed"])
    env.reset()
    return Handle(env.step, env.close, f"{w.num_envs} processes, start_method=fork")


def _build_baselines(w, opts):
    from peers.baselines_subproc import SubprocVecEnv

    env = SubprocVecEnv(_env_fns(w))
    env.reset(seed=opts["seed"])
    return Handle(env.step, env.close, f"{w.num_envs} processes, 1 Pipe each, fork")


def _build_envpool(w, opts):
    import envpool

    task, kwargs = w.envpool
    env = envpool.make_gymnasium(task, num_envs=w.num_envs, seed=opts["seed"], **kwargs)
    env.reset()
    space = env.action_space
    threads = env.spec.config.num_threads
    return Handle(
        env.step,
        getattr(env, "close", lambda: None),
        f"{task}, num_threads={threads or 'auto'}, batch_size=num_envs",
        action_dtype=getattr(space, "dtype", None),
    )


def _fastvec_settings(env, copy):
    eng = env.engine

    def spin(us):
        return "learned" if us is None else f"{us:g}"

    return (
        f"num_workers={env.num_workers}, copy={copy}, num_slots={eng.num_slots}, "
        f"spin_us={spin(eng.spin_us)}, main_spin_us={spin(eng.main_spin_us)}, context={eng.context}"
    )


def _build_fastvec(w, opts, copy=True):
    import fastvec

    env = fastvec.AsyncVectorEnv(
        _env_fns(w), num_workers=_workers(w.num_envs, opts), copy=copy, step_timeout=STEP_TIMEOUT_S
    )
    env.reset(seed=opts["seed"])
    return Handle(env.step, env.close, _fastvec_settings(env, copy))


def _build_fastvec_sb3(w, opts):
    import fastvec

    env = fastvec.SubprocVecEnv(_env_fns(w), num_workers=_workers(w.num_envs, opts), step_timeout=STEP_TIMEOUT_S)
    env.seed(opts["seed"])
    env.reset()
    return Handle(env.step, env.close, _fastvec_settings(env, True))


def _workers(num_envs, opts):
    n = opts.get("fastvec_workers")
    return None if n is None else min(int(n), num_envs)


CANDIDATES: dict[str, Candidate] = {
    c.key: c
    for c in [
        Candidate("sync", "gymnasium SyncVectorEnv", None, _build_sync),
        Candidate("gym_async", "gymnasium AsyncVectorEnv (shared_memory)", "gym_async", _build_gym_async),
        Candidate("sb3", "SB3 SubprocVecEnv", "sb3", _build_sb3, ("stable_baselines3",)),
        Candidate("baselines", "baselines SubprocVecEnv (Pipe/env)", "baselines", _build_baselines),
        Candidate("envpool", "EnvPool (C++ envs)", "envpool", _build_envpool, ("envpool",)),
        Candidate("fastvec", "fastvec.AsyncVectorEnv", None, _build_fastvec),
        Candidate("fastvec_sb3", "fastvec.SubprocVecEnv", None, _build_fastvec_sb3),
        Candidate(
            "fastvec_nocopy", "fastvec.AsyncVectorEnv (copy=False)", None, functools.partial(_build_fastvec, copy=False)
        ),
    ]
}
DEFAULT_CANDIDATES = ("sync", "gym_async", "sb3", "baselines", "envpool", "fastvec", "fastvec_sb3")
PEERS = ("gym_async", "sb3", "baselines", "envpool")


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# ---------------------------------------------------------------------------- measuring
def make_actions(space, num_envs: int, count: int, seed: int) -> list[np.ndarray]:
    """``count`` batches of ``num_envs`` random actions, drawn once, up front."""
    space.seed(seed)
    return [np.stack([np.asarray(space.sample()) for _ in range(num_envs)]) for _ in range(count)]


def time_steps(step: Callable, actions: list, warmup: int, steps: int) -> tuple[float, np.ndarray]:
    """Run ``warmup`` then ``steps`` calls of ``step``; returns (elapsed s, per-call s)."""
    k = len(actions)
    for i in range(warmup):
        step(actions[i % k])
    lat = np.empty(steps)
    clock = time.perf_counter
    t0 = clock()
    for i in range(steps):
        a = actions[i % k]
        s = clock()
        step(a)
        lat[i] = clock() - s
    return clock() - t0, lat


def measure(cand: Candidate, w: Workload, actions: list, opts: dict, steps: int, warmup: int) -> dict:
    """One measurement of one candidate: build, warm up, time, close."""
    gc.collect()
    t0 = time.perf_counter()
    handle = cand.build(w, opts)
    startup = time.perf_counter() - t0
    try:
        if handle.action_dtype is not None:
            acts = [np.ascontiguousarray(a, dtype=handle.action_dtype) for a in actions]
        else:
            acts = actions
        elapsed, lat = time_steps(handle.step, acts, warmup, steps)
    finally:
        handle.close()
    return {
        "sps": steps * w.num_envs / elapsed,
        "elapsed_s": elapsed,
        "startup_s": startup,
        "latency_s": lat,
        "settings": handle.settings,
    }


def probe(w: Workload):
    """Build one env in this process: its action space, or raise why it can't run."""
    for mod in w.requires:
        if not _has_module(mod):
            raise RuntimeError(f"`{mod}` is not installed")
    env = w.env_fn()
    try:
        return env.action_space
    finally:
        env.close()


def _quantiles_ms(lat: np.ndarray) -> dict:
    if lat.size == 0:
        return {"p50": None, "p90": None, "p99": None}
    q = np.percentile(lat, [50, 90, 99]) * 1e3
    return {"p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2])}


def _summary(values: list[float]) -> dict:
    if not values:
        return {"median": None, "min": None, "max": None}
    a = np.asarray(values, dtype=float)
    return {"median": float(np.median(a)), "min": float(a.min()), "max": float(a.max())}


def run_vecenv_bench(
    workloads: list[Workload],
    candidates: list[str] = DEFAULT_CANDIDATES,
    repeats: int = 5,
    steps: int | None = None,
    warmup: int | None = None,
    fastvec_workers: int | None = None,
    seed: int = 0,
    progress: Callable | None = None,
    notes: list | None = None,
) -> list[dict]:
    """Measure ``candidates`` on ``workloads`` in interleaved rounds; see the module doc.

    ``steps``/``warmup`` override each workload's own. ``progress(desc, n)`` is called
    before each measurement (n=0) and after it (n=1). Returns one dict per workload
    that could run; skipped workloads and candidates are explained in ``notes``.
    """
    say = progress or (lambda desc, n: None)
    notes = notes if notes is not None else []
    opts = {"seed": seed, "fastvec_workers": fastvec_workers}
    results = []
    for w in workloads:
        wsteps = steps if steps is not None else w.steps
        wwarm = warmup if warmup is not None else w.warmup
        keys = [c for c in candidates if c in CANDIDATES]
        keys += [c for c in w.extra_candidates if c not in keys and c in CANDIDATES]
        try:
            space = probe(w)
        except Exception as exc:
            notes.append(f"{w.title}: skipped ({type(exc).__name__}: {_one_line(exc)})")
            say(f"{w.key}: skipped", repeats * len(keys))
            continue
        runnable = _runnable(w, keys, notes, lambda key, w=w: say(f"{w.key}: skip {key}", repeats))
        actions = make_actions(space, w.num_envs, ACTION_BATCHES, seed)
        per, vs_baselines = _rounds(w, runnable, actions, opts, repeats, wsteps, wwarm, say)
        rows = [_row(key, per[key]) for key in runnable]
        for row in rows:
            notes += [f"{w.title}: {row['label']} failed in {e}" for e in row["errors"]]
        results.append(
            {
                "workload": w.key,
                "title": w.title,
                "short": w.short or w.title,
                "num_envs": w.num_envs,
                "steps": wsteps,
                "warmup": wwarm,
                "repeats": repeats,
                "candidates": rows,
                "target": w.target,
                "target_vs_baselines": w.target_vs_baselines,
                "fastvec_vs_baselines": _summary(vs_baselines),
                "fastvec_vs_baselines_rounds": vs_baselines,
            }
        )
    return results


def _runnable(w: Workload, keys: list, notes: list, skipped: Callable) -> list:
    """The candidates of ``keys`` that can run ``w`` here; the others explained in ``notes``."""
    runnable = []
    for key in keys:
        cand = CANDIDATES[key]
        missing = [m for m in cand.requires if not _has_module(m)]
        if missing:
            notes.append(f"{w.title}: {cand.label} skipped (`{missing[0]}` is not installed)")
        elif key == "envpool" and w.envpool is None:
            notes.append(f"{w.title}: {cand.label} skipped (EnvPool has no such env)")
        elif key == "envpool" and not _envpool_has(w.envpool[0]):
            notes.append(f"{w.title}: {cand.label} skipped (this EnvPool has no {w.envpool[0]})")
        else:
            runnable.append(key)
            continue
        skipped(key)
    return runnable


def _rounds(w, runnable, actions, opts, repeats, wsteps, wwarm, say) -> tuple[dict, list]:
    """``repeats`` rounds over ``runnable`` (order rotated): per candidate its figures per
    round, and fastvec / baselines per round."""
    per = {k: {"sps": [], "ratio": [], "startup_s": [], "lat": [], "errors": [], "settings": None} for k in runnable}
    vs_baselines = []
    for r in range(repeats):
        order = runnable[r % len(runnable) :] + runnable[: r % len(runnable)]
        round_sps = {}
        for key in order:
            say(f"{w.key} r{r + 1}/{repeats} {key}", 0)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    m = measure(CANDIDATES[key], w, actions, opts, wsteps, wwarm)
            except Exception as exc:
                per[key]["errors"].append(f"round {r + 1}: {type(exc).__name__}: {_one_line(exc)}")
            else:
                round_sps[key] = m["sps"]
                per[key]["sps"].append(m["sps"])
                per[key]["startup_s"].append(m["startup_s"])
                per[key]["lat"].append(m["latency_s"])
                per[key]["settings"] = m["settings"]
            say(f"{w.key} r{r + 1}/{repeats} {key}", 1)
        if "sync" in round_sps:
            for key, sps in round_sps.items():
                per[key]["ratio"].append(sps / round_sps["sync"])
        if "fastvec" in round_sps and "baselines" in round_sps:
            vs_baselines.append(round_sps["fastvec"] / round_sps["baselines"])
    return per, vs_baselines


def _row(key: str, p: dict) -> dict:
    """One candidate's line of a workload's result."""
    lat = np.concatenate(p["lat"]) if p["lat"] else np.empty(0)
    return {
        "candidate": key,
        "label": CANDIDATES[key].label,
        "settings": p["settings"],
        "rounds": len(p["sps"]),
        "sps": p["sps"],
        "ratios": p["ratio"],
        "median_sps": _summary(p["sps"])["median"],
        "ratio": _summary(p["ratio"]),
        "startup_s": _summary(p["startup_s"])["median"],
        "latency_ms": _quantiles_ms(lat),
        "errors": p["errors"],
    }


def _envpool_has(task: str) -> bool:
    try:
        import envpool

        return task in envpool.list_all_envs()
    except Exception:
        return False


def _one_line(exc) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


# ---------------------------------------------------------------------------- scaling
def run_scaling(
    env_id: str = "CartPole-v1",
    num_envs: tuple = (4, 8, 16, 32, 64),
    num_workers: tuple = (1, 2, 3, 4),
    repeats: int = 3,
    env_steps: int = 32000,
    warmup_frac: float = 0.1,
    seed: int = 0,
    progress: Callable | None = None,
) -> dict:
    """fastvec.AsyncVectorEnv over a grid of num_envs x num_workers, with SyncVectorEnv
    at each num_envs in the same round. Each point times ``env_steps // n`` vector steps
    (at least 20), so every point does about the same work."""
    say = progress or (lambda desc, n: None)
    opts = {"seed": seed}
    points: dict[tuple, dict] = {}
    for r in range(repeats):
        for n in num_envs:
            w = Workload(
                f"scale{n}", f"{env_id}, {n} envs", functools.partial(make_gym, env_id), n, max(20, env_steps // n), 0
            )
            wsteps = w.steps
            wwarm = max(2, int(wsteps * warmup_frac))
            space = probe(w)
            actions = make_actions(space, n, ACTION_BATCHES, seed)
            configs = [("sync", None)] + [("fastvec", k) for k in num_workers if k <= n]
            if r % 2:
                configs = configs[::-1]
            round_sps = {}
            for key, k in configs:
                say(f"scaling r{r + 1}/{repeats} n={n} {key}{'' if k is None else f' w={k}'}", 0)
                o = dict(opts, fastvec_workers=k)
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        m = measure(CANDIDATES[key], w, actions, o, wsteps, wwarm)
                    round_sps[(key, k)] = m["sps"]
                    pt = points.setdefault((key, n, k), {"sps": [], "ratio": [], "lat": []})
                    pt["sps"].append(m["sps"])
                    pt["lat"].append(m["latency_s"])
                except Exception as exc:
                    pt = points.setdefault((key, n, k), {"sps": [], "ratio": [], "lat": []})
                    pt.setdefault("errors", []).append(f"{type(exc).__name__}: {_one_line(exc)}")
                say("", 1)
            base = round_sps.get(("sync", None))
            if base:
                for (key, k), sps in round_sps.items():
                    points[(key, n, k)]["ratio"].append(sps / base)
    rows = []
    for (key, n, k), pt in sorted(points.items(), key=lambda kv: (kv[0][1], kv[0][0] != "sync", kv[0][2] or 0)):
        lat = np.concatenate(pt["lat"]) if pt["lat"] else np.empty(0)
        rows.append(
            {
                "candidate": key,
                "num_envs": n,
                "num_workers": k,
                "median_sps": _summary(pt["sps"])["median"],
                "sps": pt["sps"],
                "ratio": _summary(pt["ratio"]),
                "latency_ms": _quantiles_ms(lat),
                "errors": pt.get("errors", []),
            }
        )
    return {
        "env_id": env_id,
        "num_envs": list(num_envs),
        "num_workers": list(num_workers),
        "repeats": repeats,
        "env_steps": env_steps,
        "cores": available_cores(),
        "points": rows,
    }
