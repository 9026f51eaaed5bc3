#!/usr/bin/env python
"""PPO benchmarks: fastvec's trainer against Stable-Baselines3, side by side.

    python benchmarks/bench_train.py                       # everything (~10-20 min on 2 cores)
    python benchmarks/bench_train.py --only cartpole --seeds 5
    python benchmarks/bench_train.py --only pendulum --seeds 3
    python benchmarks/bench_train.py --only pong
    python benchmarks/bench_train.py --only transports --seeds 3
    python benchmarks/bench_train.py --only learners --seeds 3
    python benchmarks/bench_train.py --only learners --learner-envs CartPole-v1 --seeds 30
    python benchmarks/bench_train.py --out benchmarks/results/train   # also writes train.json / train.md

Sections
--------
cartpole
    Wall time until the mean return of the last 20 episodes reaches 475, per seed, for
    SB3 PPO with RL Zoo's CartPole hyperparameters (DummyVecEnv of 8 envs, n_steps 32,
    batch 256, gamma 0.98, lambda 0.8, 20 epochs, linear lr 1e-3 and clip 0.2), for
    ``fastvec train CartPole-v1`` (its preset) and for ``fastvec train CartPole-v1
    --zoo`` (fastvec's trainer with the same hyperparameters as SB3). Goal: fastvec's
    median <= 0.5x SB3's, every seed solved.
pendulum
    InvertedPendulum-v5 to a mean return of 950. SB3: 8 envs, n_steps 256, batch 256,
    10 epochs, otherwise SB3 defaults. Goal: <= 0.5x SB3's median, 3 of 3 seeds.
pong
    ALE/Pong-v5 (AtariPreprocessing + 4-frame stack), 8 envs: the engine's random-action
    steps/s against the training loop's steps/s (rollouts + PPO updates, same envs and
    workers), and the rollout collection alone. Goal: training loop >= 0.6x random.
learners
    The trainer's two minibatch gradients, the numpy learner (the default for small MLPs
    on the CPU) and torch's autograd (``--set learner=torch``), on the same seeds and
    engine: wall time and env steps to solve CartPole-v1 and InvertedPendulum-v5, the
    mean return of HalfCheetah-v5 after 200k steps, and the learner's own time. The two
    compute the same loss and gradient up to float rounding
    (``tests/test_numpy_learner.py``), so they should learn alike; this checks it.
transports
    The same trainer and seed on gymnasium's SyncVectorEnv, on a classic one-Pipe-per-env
    SubprocVecEnv (baselines style) and on fastvec: wall time to solve CartPole and
    InvertedPendulum, and steps/s. With the same seed the three see the same
    trajectories (same env seeds, same sampling noise; checked: equal env steps), so
    only the transport differs.

Method
------
Every run is a fresh Python process (imports, torch._dynamo's first-optimizer import
and the first torch op are done before the clock starts, for SB3 too); runs of the
candidates alternate seed by seed so that background load hits them alike. Wall time
counts env start-up, model construction and training. Every run uses
``torch.set_num_threads(1)``: on 2 cores that is the fastest setting for SB3 as well
(2 threads fight the env for the second core; measured 5-20x slower under load).
The machine is shared and noisy: compare candidates within one run, not across runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from peers.baselines_subproc import SubprocVecEnv as PipeSubprocVecEnv

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SB3_CARTPOLE = dict(
    n_envs=8,
    n_steps=32,
    batch_size=256,
    gamma=0.98,
    gae_lambda=0.8,
    n_epochs=20,
    ent_coef=0.0,
    lr=("lin", 1e-3),
    clip_range=("lin", 0.2),
)
SB3_PENDULUM = dict(n_envs=8, n_steps=256, batch_size=256, n_epochs=10)


# =============================================================================== children
def _warm_torch():
    import torch

    torch.set_num_threads(1)
    p = torch.nn.Parameter(torch.zeros(4))
    (p * 2).sum().backward()
    torch.optim.Adam([p]).step()  # imports torch._dynamo (seconds)


def child_sb3(env_id: str, seed: int, hp: dict, threshold: float, max_steps: int) -> dict:
    _warm_torch()
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    class Stop(BaseCallback):
        def __init__(self):
            super().__init__()
            self.rets = collections.deque(maxlen=20)
            self.solved = False

        def _on_step(self):
            for info in self.locals["infos"]:
                ep = info.get("episode")
                if ep is not None:
                    self.rets.append(ep["r"])
            if len(self.rets) == 20 and np.mean(self.rets) >= threshold:
                self.solved = True
                return False
            return True

    def sched(v):
        if isinstance(v, (tuple, list)) and v[0] == "lin":
            return lambda frac, x=v[1]: frac * x
        return v

    hp = dict(hp)
    n_envs = hp.pop("n_envs")
    kw = dict(n_steps=hp.pop("n_steps"), batch_size=hp.pop("batch_size"), n_epochs=hp.pop("n_epochs"))
    if "lr" in hp:
        kw["learning_rate"] = sched(hp.pop("lr"))
    if "clip_range" in hp:
        kw["clip_range"] = sched(hp.pop("clip_range"))
    kw.update(hp)
    t0 = time.perf_counter()
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kw)
    cb = Stop()
    model.learn(max_steps, callback=cb)
    wall = time.perf_counter() - t0
    env.close()
    return {
        "solved": cb.solved,
        "env_steps": int(model.num_timesteps),
        "wall_seconds": wall,
        "sps": model.num_timesteps / wall,
        "final_mean_return": float(np.mean(cb.rets)) if cb.rets else None,
        "threads": torch.get_num_threads(),
    }


def child_fastvec(
    env_id: str,
    seed: int,
    overrides: list,
    threshold: float | None,
    venv_kind: str = "fastvec",
    total_steps: int | None = None,
    zoo: bool = False,
) -> dict:
    _warm_torch()
    from fastvec.train import PPOConfig, apply_overrides
    from fastvec.train.cli import run_training as train
    from fastvec.train.presets import env_factory, preset_for

    cfg = apply_overrides(PPOConfig(), preset_for(env_id, zoo=zoo))
    cfg.seed = seed
    if threshold is not None:
        cfg.stop_at_return = threshold
    if total_steps is not None:
        cfg.total_steps = total_steps
    apply_overrides(cfg, overrides)
    if venv_kind == "fastvec":
        return train(env_id, cfg, progress=False, tensorboard=False)
    # Other transports: the clock must include their start-up too.
    t0 = time.perf_counter()
    fns = [env_factory(env_id)] * cfg.num_envs
    if venv_kind == "sync":
        from gymnasium.vector import AutoresetMode, SyncVectorEnv

        venv = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    elif venv_kind == "subproc":
        venv = PipeSubprocVecEnv(fns, context="fork", terminal_observation=True)
    else:
        raise ValueError(venv_kind)
    startup = time.perf_counter() - t0
    try:
        res = train(None, cfg, venv=venv, progress=False, tensorboard=False)
    finally:
        venv.close()
    res["wall_seconds"] = res["wall_seconds"] + startup
    res["sps"] = res["env_steps"] / res["wall_seconds"]
    res["venv_startup_seconds"] = startup
    return res


def child_pong(num_envs: int, num_workers: int | None, steps: int, train_rollouts: int, overrides: list) -> dict:
    """Engine random-action steps/s vs the PPO loop's steps/s on the same envs/workers."""
    _warm_torch()
    import torch

    from fastvec.engine import IN_SLOT, Engine
    from fastvec.options import available_cores
    from fastvec.train import PPO, EngineStorage, PPOConfig, apply_overrides
    from fastvec.train.presets import env_factory, preset_for

    env_id = "ALE/Pong-v5"
    cfg = apply_overrides(PPOConfig(), preset_for(env_id))
    cfg.num_envs = num_envs
    cfg.num_workers = num_workers
    apply_overrides(cfg, overrides)
    workers = cfg.num_workers or min(num_envs, available_cores())
    fns = [env_factory(env_id)] * num_envs
    out = {"num_envs": num_envs, "num_workers": workers, "torch_threads": None}
    # 1. random actions through the engine (same slots layout as the trainer)
    T = cfg.n_steps
    with Engine(fns, num_workers=workers, num_slots=T + 1, context="fork") as eng:
        eng.reset(0, {i: {"seed": i} for i in range(num_envs)})
        rng = np.random.default_rng(0)
        n_act = eng.single_action_space.n
        acts = rng.integers(0, n_act, size=(T + 1, num_envs))
        a = eng.act_bufs[0]
        for t in range(20):
            a[t % T + 1] = acts[t % T + 1]
            eng.step_async(IN_SLOT, t % T + 1)
            eng.step_wait()
        t0 = time.perf_counter()
        n = 0
        while n < steps:
            for t in range(T):
                a[t + 1] = acts[t + 1]
                eng.step_async(IN_SLOT, t + 1)
                eng.step_wait()
            n += T * num_envs
        out["random_sps"] = n / (time.perf_counter() - t0)
    # 2. the training loop (collect + prepare + update), and collection alone
    backend = EngineStorage(
        Engine(
            fns,
            num_workers=workers,
            num_slots=T + 1,
            autoreset_mode="same_step",
            context=cfg.context,
            spin_us=cfg.spin_us,
        )
    )
    try:
        ppo = PPO(
            cfg,
            backend,
            torch.device(cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")),
        )
        out["torch_threads"] = [ppo.act_threads, ppo.learn_threads]
        out["device"] = str(ppo.device)
        backend.reset(0)
        ppo.collect()
        ppo.prepare()
        ppo.update()  # warm-up (allocator, cudnn autotune)
        ppo.t_act = ppo.t_env = ppo.t_prep = ppo.t_learn = 0.0
        t0 = time.perf_counter()
        for _ in range(train_rollouts):
            ppo.collect()
            ppo.prepare()
            ppo.update()
            ppo.rollout.obs[0].copy_(ppo.rollout.obs[T])
        wall = time.perf_counter() - t0
        out["train_sps"] = train_rollouts * T * num_envs / wall
        out["collect_sps"] = train_rollouts * T * num_envs / (ppo.t_act + ppo.t_env)
        out["time_breakdown"] = {"act": ppo.t_act, "env": ppo.t_env, "prepare": ppo.t_prep, "learn": ppo.t_learn}
    finally:
        backend.close()
    out["ratio_train_vs_random"] = out["train_sps"] / out["random_sps"]
    out["ratio_collect_vs_random"] = out["collect_sps"] / out["random_sps"]
    return out


# ========================================================= a classic one-Pipe-per-env SubprocVecEnv
def run_child(job: dict, timeout: float) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", json.dumps(job)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s", "job": job}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        err = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {proc.returncode}: {err}", "job": job}
    return json.loads(lines[-1])


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _fmt(x, nd=2):
    return "—" if x is None else f"{x:.{nd}f}"


def _load():
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def solve_section(name, env_id, threshold, seeds, sb3_hp, fv_overrides, max_steps, timeout, log, zoo=False):
    """``zoo``: also run fastvec's trainer with SB3's (RL Zoo's) hyperparameters, which
    separates the per-step overhead from the preset's sample efficiency."""
    rows = []
    cands = ("sb3", "fastvec", "fastvec_zoo") if zoo else ("sb3", "fastvec")
    for seed in range(seeds):
        for cand in cands:
            if cand == "sb3":
                job = {
                    "kind": "sb3",
                    "env_id": env_id,
                    "seed": seed,
                    "hp": sb3_hp,
                    "threshold": threshold,
                    "max_steps": max_steps,
                }
            else:
                job = {
                    "kind": "fastvec",
                    "env_id": env_id,
                    "seed": seed,
                    "overrides": fv_overrides,
                    "threshold": threshold,
                    "total_steps": max_steps,
                    "zoo": cand == "fastvec_zoo",
                }
            r = run_child(job, timeout)
            r.update(candidate=cand, seed=seed, load=_load())
            rows.append(r)
            log(
                f"  {name} seed {seed} {cand:11s} "
                + (
                    r.get("error")
                    or f"solved={r['solved']} steps={r['env_steps']} wall={r['wall_seconds']:.2f}s sps={r['sps']:.0f}"
                )
            )
    summary = {}
    for cand in cands:
        rs = [r for r in rows if r["candidate"] == cand and "error" not in r]
        summary[cand] = {
            "median_wall_seconds": _median([r["wall_seconds"] for r in rs]),
            "median_env_steps": _median([r["env_steps"] for r in rs]),
            "median_sps": _median([r["sps"] for r in rs]),
            "solved": sum(bool(r["solved"]) for r in rs),
            "runs": seeds,
        }
    s, f = summary["sb3"]["median_wall_seconds"], summary["fastvec"]["median_wall_seconds"]
    summary["ratio_fastvec_vs_sb3"] = (f / s) if (s and f) else None
    summary["goal"] = "fastvec median wall <= 0.5x SB3, all seeds solved"
    summary["met"] = (
        summary["ratio_fastvec_vs_sb3"] is not None
        and summary["ratio_fastvec_vs_sb3"] <= 0.5
        and summary["fastvec"]["solved"] == seeds
    )
    return {"runs": rows, "summary": summary}


THRESHOLDS = {"CartPole-v1": 475.0, "InvertedPendulum-v5": 950.0}


TRANSPORTS = ("sync", "subproc", "fastvec")


def transports_section(seeds, timeout, log, env_id="CartPole-v1", threshold=475.0, kinds=TRANSPORTS):
    rows = []
    for seed in range(seeds):
        for kind in kinds:
            job = {
                "kind": "fastvec",
                "env_id": env_id,
                "seed": seed,
                "overrides": [],
                "threshold": threshold,
                "venv_kind": kind,
                "total_steps": 300_000,
            }
            r = run_child(job, timeout)
            r.update(candidate=kind, seed=seed, load=_load())
            rows.append(r)
            log(
                f"  transports {env_id} seed {seed} {kind:8s} "
                + (
                    r.get("error")
                    or f"solved={r['solved']} steps={r['env_steps']} wall={r['wall_seconds']:.2f}s sps={r['sps']:.0f}"
                )
            )
    summary = {}
    for kind in kinds:
        rs = [r for r in rows if r["candidate"] == kind and "error" not in r]
        summary[kind] = {
            "median_wall_seconds": _median([r["wall_seconds"] for r in rs]),
            "median_sps": _median([r["sps"] for r in rs]),
            "median_env_steps": _median([r["env_steps"] for r in rs]),
            "solved": sum(bool(r["solved"]) for r in rs),
            "runs": seeds,
        }
    return {"env_id": env_id, "runs": rows, "summary": summary}


LEARNER_ENVS = (
    ("CartPole-v1", 475.0, 200_000),
    ("InvertedPendulum-v5", 950.0, 400_000),
    ("HalfCheetah-v5", None, 200_000),
)


def learners_section(seeds, timeout, log, envs=None):
    """The numpy learner against torch's autograd, seed by seed, in alternating order
    (``envs``: a subset of ``LEARNER_ENVS`` by id)."""
    rows = []
    chosen = [e for e in LEARNER_ENVS if envs is None or e[0] in envs]
    for env_id, threshold, steps in chosen:
        for seed in range(seeds):
            order = ("numpy", "torch") if seed % 2 == 0 else ("torch", "numpy")
            for learner in order:
                job = {
                    "kind": "fastvec",
                    "env_id": env_id,
                    "seed": seed,
                    "overrides": [f"learner={learner}"],
                    "threshold": threshold,
                    "total_steps": steps,
                }
                r = run_child(job, timeout)
                r.update(candidate=learner, seed=seed, env=env_id, load=_load())
                rows.append(r)
                log(
                    f"  learners {env_id} seed {seed} {learner:5s} "
                    + (
                        r.get("error")
                        or f"solved={r['solved']} steps={r['env_steps']} wall={r['wall_seconds']:.2f}s "
                        f"return={r['final_mean_return']} learn={r['time_breakdown']['learn']:.2f}s"
                    )
                )
    summary = {}
    for env_id, threshold, _steps in chosen:
        for learner in ("numpy", "torch"):
            rs = [r for r in rows if r["env"] == env_id and r["candidate"] == learner and "error" not in r]
            summary[f"{env_id} {learner}"] = {
                "median_wall_seconds": _median([r["wall_seconds"] for r in rs]),
                "median_env_steps": _median([r["env_steps"] for r in rs]),
                "median_learn_seconds": _median([r["time_breakdown"]["learn"] for r in rs]),
                "median_learner_sps": _median([r.get("learner_sps") for r in rs]),
                "median_final_return": _median([r["final_mean_return"] for r in rs]),
                "solved": sum(bool(r["solved"]) for r in rs) if threshold is not None else None,
                "runs": seeds,
                "learner_used": sorted({r.get("learner") for r in rs}),
            }
    return {"runs": rows, "summary": summary}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="cartpole,pendulum,pong,transports,learners")
    p.add_argument("--seeds", type=int, default=None, help="seeds per candidate (default 5 CartPole, 3 others)")
    p.add_argument("--out", default=None, help="directory for train.json and train.md")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        help="extra fastvec --set overrides for the cartpole/pendulum runs",
    )
    p.add_argument(
        "--transport-envs", default="CartPole-v1,InvertedPendulum-v5", help="envs for the transports section"
    )
    p.add_argument(
        "--transport-kinds",
        default=",".join(TRANSPORTS),
        help="vector envs for the transports section (some of sync,subproc,fastvec)",
    )
    p.add_argument("--learner-envs", default=",".join(e[0] for e in LEARNER_ENVS), help="envs for the learners section")
    p.add_argument("--pong-steps", type=int, default=8192)
    p.add_argument("--pong-rollouts", type=int, default=2)
    p.add_argument("--pong-envs", type=int, default=8)
    p.add_argument(
        "--pong-set",
        dest="pong_overrides",
        action="append",
        default=[],
        help="--set overrides for the Pong training loop (e.g. spin_us=0)",
    )
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    return p


def _child(spec: str) -> int:
    """Run one job in this (fresh) process and print its result as one JSON line."""
    job = json.loads(spec)
    kind = job.pop("kind")
    children = {"sb3": child_sb3, "fastvec": child_fastvec, "pong": child_pong}
    if kind not in children:
        raise SystemExit(f"unknown job kind {kind}")
    print(json.dumps(children[kind](**job)))
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args._child:
        return _child(args._child)

    parts = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = set(parts) - {"cartpole", "pendulum", "pong", "transports", "learners"}
    if bad:
        print(f"bench_train: unknown section(s) {sorted(bad)}", file=sys.stderr)
        return 2

    t_envs = [e.strip() for e in args.transport_envs.split(",") if e.strip()]
    if set(t_envs) - set(THRESHOLDS):
        print(f"bench_train: --transport-envs must be among {sorted(THRESHOLDS)}", file=sys.stderr)
        return 2
    t_kinds = [k.strip() for k in args.transport_kinds.split(",") if k.strip()]
    if not t_kinds or set(t_kinds) - set(TRANSPORTS):
        print(f"bench_train: --transport-kinds must be among {list(TRANSPORTS)}", file=sys.stderr)
        return 2
    l_envs = [e.strip() for e in args.learner_envs.split(",") if e.strip()]
    if not l_envs or set(l_envs) - {e[0] for e in LEARNER_ENVS}:
        print(f"bench_train: --learner-envs must be among {[e[0] for e in LEARNER_ENVS]}", file=sys.stderr)
        return 2

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    import fastvec

    results = {
        "machine": {
            "cores": os.cpu_count(),
            "load_start": _load(),
            "python": sys.version.split()[0],
            "fastvec_path": os.path.dirname(os.path.abspath(fastvec.__file__)),
        },
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if "cartpole" in parts:
        log("CartPole-v1: time to mean(last 20) >= 475")
        results["cartpole"] = solve_section(
            "cartpole",
            "CartPole-v1",
            475.0,
            args.seeds or 5,
            SB3_CARTPOLE,
            args.overrides,
            200_000,
            args.timeout,
            log,
            zoo=True,
        )
    if "pendulum" in parts:
        log("InvertedPendulum-v5: time to mean(last 20) >= 950")
        results["pendulum"] = solve_section(
            "pendulum",
            "InvertedPendulum-v5",
            950.0,
            args.seeds or 3,
            SB3_PENDULUM,
            args.overrides,
            400_000,
            args.timeout,
            log,
        )
    if "transports" in parts:
        log("Transports: the same trainer on SyncVectorEnv, a Pipe-per-env SubprocVecEnv and fastvec")
        results["transports"] = [
            transports_section(args.seeds or 3, args.timeout, log, env_id, THRESHOLDS[env_id], t_kinds)
            for env_id in t_envs
        ]
    if "learners" in parts:
        log("Learners: the numpy minibatch gradient against torch's autograd")
        results["learners"] = learners_section(args.seeds or 3, args.timeout, log, l_envs)
    if "pong" in parts:
        log("Pong: engine random-action steps/s vs training loop steps/s")
        job = {
            "kind": "pong",
            "num_envs": args.pong_envs,
            "num_workers": None,
            "steps": args.pong_steps,
            "train_rollouts": args.pong_rollouts,
            "overrides": args.pong_overrides,
        }
        r = run_child(job, args.timeout)
        log(
            "  "
            + (
                r.get("error")
                or json.dumps(
                    {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "time_breakdown"}
                )
            )
        )
        results["pong"] = r
    results["machine"]["load_end"] = _load()
    md = report(results)
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "train.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(args.out, "train.md"), "w") as f:
            f.write(md + "\n")
    return 0


def report(results) -> str:
    lines = [
        f"# PPO benchmarks ({results['started']}, {results['machine']['cores']} cores, "
        f"load {_fmt(results['machine']['load_start'])} -> {_fmt(results['machine'].get('load_end'))})",
        "",
    ]
    for key, title in (("cartpole", "CartPole-v1 to 475"), ("pendulum", "InvertedPendulum-v5 to 950")):
        if key not in results:
            continue
        s = results[key]["summary"]
        lines += [
            f"## {title}",
            "",
            "| candidate | median wall s | median env steps | median steps/s | solved |",
            "|---|---:|---:|---:|---:|",
        ]
        for cand in [c for c in ("sb3", "fastvec", "fastvec_zoo") if c in s]:
            c = s[cand]
            lines.append(
                f"| {cand} | {_fmt(c['median_wall_seconds'])} | {_fmt(c['median_env_steps'], 0)} | "
                f"{_fmt(c['median_sps'], 0)} | {c['solved']}/{c['runs']} |"
            )
        if "fastvec_zoo" in s:
            lines += [
                "",
                "`fastvec_zoo`: fastvec's trainer with SB3's (RL Zoo's) hyperparameters "
                "(8 envs, n_steps 32, batch 256, 20 epochs, linear lr 1e-3 and clip 0.2).",
            ]
        lines += [
            "",
            f"fastvec / SB3 median wall: **{_fmt(s['ratio_fastvec_vs_sb3'])}x** "
            f"(goal <= 0.5x, all seeds solved: {'met' if s['met'] else 'MISSED'})",
            "",
            "| seed | candidate | solved | env steps | wall s | load |",
            "|---:|---|---|---:|---:|---:|",
        ]
        for r in results[key]["runs"]:
            lines.append(
                f"| {r['seed']} | {r['candidate']} | {r.get('solved', r.get('error'))} | "
                f"{r.get('env_steps', '—')} | {_fmt(r.get('wall_seconds'))} | {_fmt(r.get('load'))} |"
            )
        lines.append("")
    for tr in results.get("transports", []):
        s = tr["summary"]
        lines += [
            f"## Same trainer and seeds, {len(s)} transports ({tr['env_id']} to {THRESHOLDS[tr['env_id']]:g})",
            "",
            "| transport | median wall s | median steps/s | median env steps | solved |",
            "|---|---:|---:|---:|---:|",
        ]
        for k, name in (
            ("sync", "gymnasium SyncVectorEnv"),
            ("subproc", "Pipe-per-env SubprocVecEnv"),
            ("fastvec", "fastvec engine"),
        ):
            if k not in s:  # not run (--transport-kinds)
                continue
            c = s[k]
            lines.append(
                f"| {name} | {_fmt(c['median_wall_seconds'])} | {_fmt(c['median_sps'], 0)} | "
                f"{_fmt(c['median_env_steps'], 0)} | {c['solved']}/{c['runs']} |"
            )
        lines.append("")
    if "learners" in results:
        lines += [
            "## The numpy learner against torch's autograd (same seeds, the engine)",
            "",
            "| env | learner | median wall s | median env steps | solved | median final return | "
            "median learn s | learner samples/s |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for key, c in results["learners"]["summary"].items():
            env_id, learner = key.rsplit(" ", 1)
            solved = "—" if c["solved"] is None else f"{c['solved']}/{c['runs']}"
            lines.append(
                f"| {env_id} | {learner} (ran: {', '.join(map(str, c['learner_used']))}) | "
                f"{_fmt(c['median_wall_seconds'])} | {_fmt(c['median_env_steps'], 0)} | {solved} | "
                f"{_fmt(c['median_final_return'], 1)} | {_fmt(c['median_learn_seconds'])} | "
                f"{_fmt(c['median_learner_sps'], 0)} |"
            )
        lines += [
            "",
            "| env | seed | learner | solved | env steps | wall s | final return | learn s |",
            "|---|---:|---|---|---:|---:|---:|---:|",
        ]
        for r in results["learners"]["runs"]:
            tb = r.get("time_breakdown") or {}
            lines.append(
                f"| {r['env']} | {r['seed']} | {r['candidate']} | {r.get('solved', r.get('error'))} | "
                f"{r.get('env_steps', '—')} | {_fmt(r.get('wall_seconds'))} | "
                f"{_fmt(r.get('final_mean_return'), 1)} | {_fmt(tb.get('learn'))} |"
            )
        lines.append("")
    if "pong" in results:
        r = results["pong"]
        lines += ["## Pong (ALE/Pong-v5, 8 envs)", ""]
        if "error" in r:
            lines.append(f"failed: {r['error']}")
        else:
            lines += [
                f"- engine, random actions: {r['random_sps']:.0f} steps/s ({r['num_workers']} workers)",
                f"- training loop (rollout + PPO update, device {r['device']}, threads {r['torch_threads']}): "
                f"{r['train_sps']:.0f} steps/s = **{r['ratio_train_vs_random']:.2f}x** random (goal >= 0.6x)",
                f"- rollout collection alone (CNN acting + env): {r['collect_sps']:.0f} steps/s = "
                f"{r['ratio_collect_vs_random']:.2f}x random",
                f"- time: {json.dumps({k: round(v, 2) for k, v in r['time_breakdown'].items()})}",
            ]
            tb = r["time_breakdown"]
            if tb.get("learn"):
                # The update alone bounds the loop: even with free env steps and free acting,
                # the loop cannot pass rollout steps / update time.
                bound = r["train_sps"] * sum(tb.values()) / tb["learn"]
                lines.append(
                    f"- upper bound from the update alone: {bound:.0f} steps/s = "
                    f"{bound / r['random_sps']:.2f}x random, on {r['device']}"
                )
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
