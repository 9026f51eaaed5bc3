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
    (``tests/test_train_numpy_learner.py``), so they should learn alike; this checks it.
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
import json
import os
import statistics
import subprocess
import sys
import time

from harness.common import write_results
from harness.processes import last_json
from harness.train_children import CHILDREN
from harness.train_report import THRESHOLDS, report

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
SECTIONS = ("cartpole", "pendulum", "pong", "transports", "learners")
TRANSPORTS = ("sync", "subproc", "fastvec")
LEARNER_ENVS = (
    ("CartPole-v1", 475.0, 200_000),
    ("InvertedPendulum-v5", 950.0, 400_000),
    ("HalfCheetah-v5", None, 200_000),
)


# =============================================================================== running children
def run_child(job: dict, timeout: float) -> dict:
    """One job of ``harness/train_children.py`` in a fresh process; its JSON result, or
    ``{"error": ..., "job": job}``."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", json.dumps(job)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s", "job": job}
    res = last_json(proc.stdout)
    if proc.returncode != 0 or res is None:
        err = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {proc.returncode}: {err}", "job": job}
    return res


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _load():
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def _log(msg):
    print(msg, file=sys.stderr, flush=True)


def _run_line(r: dict) -> str:
    """A run's log line: its error, or what it reached."""
    return r.get("error") or (
        f"solved={r['solved']} steps={r['env_steps']} wall={r['wall_seconds']:.2f}s sps={r['sps']:.0f}"
    )


# =============================================================================== sections
def _solve_job(cand, env_id, seed, threshold, sb3_hp, fv_overrides, max_steps) -> dict:
    if cand == "sb3":
        return {
            "kind": "sb3",
            "env_id": env_id,
            "seed": seed,
            "hp": sb3_hp,
            "threshold": threshold,
            "max_steps": max_steps,
        }
    return {
        "kind": "fastvec",
        "env_id": env_id,
        "seed": seed,
        "overrides": fv_overrides,
        "threshold": threshold,
        "total_steps": max_steps,
        "zoo": cand == "fastvec_zoo",
    }


def solve_section(name, env_id, threshold, seeds, sb3_hp, fv_overrides, max_steps, timeout, log, zoo=False):
    """``zoo``: also run fastvec's trainer with SB3's (RL Zoo's) hyperparameters, which
    separates the per-step overhead from the preset's sample efficiency."""
    rows = []
    cands = ("sb3", "fastvec", "fastvec_zoo") if zoo else ("sb3", "fastvec")
    for seed in range(seeds):
        for cand in cands:
            r = run_child(_solve_job(cand, env_id, seed, threshold, sb3_hp, fv_overrides, max_steps), timeout)
            r.update(candidate=cand, seed=seed, load=_load())
            rows.append(r)
            log(f"  {name} seed {seed} {cand:11s} " + _run_line(r))
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
            log(f"  transports {env_id} seed {seed} {kind:8s} " + _run_line(r))
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


def _learners_summary(rows, chosen, seeds) -> dict:
    """Medians per (env, learner) over the runs without an error."""
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
    return summary


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
    return {"runs": rows, "summary": _learners_summary(rows, chosen, seeds)}


def pong_section(args, log) -> dict:
    """Pong's training loop against the engine's random actions, in one child."""
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
    return r


# =============================================================================== command line
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(SECTIONS))
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
    if kind not in CHILDREN:
        raise SystemExit(f"unknown job kind {kind}")
    print(json.dumps(CHILDREN[kind](**job)))
    return 0


def _split(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def _check_lists(args) -> str | None:
    """The first problem with the comma-separated options, or None."""
    if set(_split(args.only)) - set(SECTIONS):
        return f"unknown section(s) {sorted(set(_split(args.only)) - set(SECTIONS))}"
    if set(_split(args.transport_envs)) - set(THRESHOLDS):
        return f"--transport-envs must be among {sorted(THRESHOLDS)}"
    t_kinds = _split(args.transport_kinds)
    if not t_kinds or set(t_kinds) - set(TRANSPORTS):
        return f"--transport-kinds must be among {list(TRANSPORTS)}"
    l_envs = _split(args.learner_envs)
    if not l_envs or set(l_envs) - {e[0] for e in LEARNER_ENVS}:
        return f"--learner-envs must be among {[e[0] for e in LEARNER_ENVS]}"
    return None


def _machine() -> dict:
    import fastvec

    return {
        "cores": os.cpu_count(),
        "load_start": _load(),
        "python": sys.version.split()[0],
        "fastvec_path": os.path.dirname(os.path.abspath(fastvec.__file__)),
    }


def run_sections(args, results: dict) -> None:
    """Every section ``--only`` names, in a fixed order, into ``results``."""
    parts = _split(args.only)
    if "cartpole" in parts:
        _log("CartPole-v1: time to mean(last 20) >= 475")
        results["cartpole"] = solve_section(
            "cartpole",
            "CartPole-v1",
            475.0,
            args.seeds or 5,
            SB3_CARTPOLE,
            args.overrides,
            200_000,
            args.timeout,
            _log,
            zoo=True,
        )
    if "pendulum" in parts:
        _log("InvertedPendulum-v5: time to mean(last 20) >= 950")
        results["pendulum"] = solve_section(
            "pendulum",
            "InvertedPendulum-v5",
            950.0,
            args.seeds or 3,
            SB3_PENDULUM,
            args.overrides,
            400_000,
            args.timeout,
            _log,
        )
    if "transports" in parts:
        _log("Transports: the same trainer on SyncVectorEnv, a Pipe-per-env SubprocVecEnv and fastvec")
        kinds = _split(args.transport_kinds)
        results["transports"] = [
            transports_section(args.seeds or 3, args.timeout, _log, env_id, THRESHOLDS[env_id], kinds)
            for env_id in _split(args.transport_envs)
        ]
    if "learners" in parts:
        _log("Learners: the numpy minibatch gradient against torch's autograd")
        results["learners"] = learners_section(args.seeds or 3, args.timeout, _log, _split(args.learner_envs))
    if "pong" in parts:
        _log("Pong: engine random-action steps/s vs training loop steps/s")
        results["pong"] = pong_section(args, _log)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args._child:
        return _child(args._child)
    problem = _check_lists(args)
    if problem:
        print(f"bench_train: {problem}", file=sys.stderr)
        return 2
    results = {"machine": _machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    run_sections(args, results)
    results["machine"]["load_end"] = _load()
    write_results(args.out, report(results), results, stem="train")
    return 0


if __name__ == "__main__":
    sys.exit(main())
