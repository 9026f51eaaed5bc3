#!/usr/bin/env python
"""Candidate presets for a task, judged as users judge them: every seed trained in a fresh
``fastvec train`` process, then ``fastvec eval`` (deterministic episodes, as RL Zoo's
benchmark) of its last checkpoint.

    python benchmarks/bench_presets.py Hopper-v5 --steps 1000000 --seeds 1 2 3 \\
        --candidate cleanrl: --candidate long_horizon:gamma=0.999,gae_lambda=0.99 \\
        --out benchmarks/results/presets

A candidate is ``name:key=value,key=value`` (``--set`` pairs over the env's preset; an
empty list: the preset as it is). Seeds run in turn, the candidates' order alternating
by seed. Reported per candidate: wall time, the training return at the end (the last 20
episodes, sampled actions) and the deterministic evaluation's mean, as the median over
seeds with the range, and the **worst seed's** evaluation (what the next user may get).
Every run's learning curve is kept in the JSON (``presets_page.py`` draws them).

``--sb3`` adds the anchor: SB3's PPO with RL Zoo's hyperparameters for the task, trained
(for ``--sb3-steps``, default ``--steps``) and evaluated the same way, and each
candidate's wall time to SB3's final training return. The question is time, so the
candidates may run longer than SB3 (``--steps 1000000 --sb3-steps 200000``): a candidate
stopped at SB3's step count may not have reached SB3's return yet.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

from harness.cli_runs import return_rows, run_fastvec, run_train
from harness.common import span
from harness.processes import child_json

HERE = os.path.dirname(os.path.abspath(__file__))
SB3 = "sb3_zoo"  # the SB3 anchor's candidate name


def parse_candidate(text: str) -> tuple[str, list[str]]:
    name, sep, pairs = text.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"a candidate is name:key=value,... (got {text!r})")
    sets: list[str] = []
    for part in (p for p in pairs.split(",") if p):
        if "=" in part:
            sets.append(part)
        elif sets:  # a list value's next item: hidden=256,256
            sets[-1] += "," + part
        else:
            raise argparse.ArgumentTypeError(f"candidate {name}: expected key=value, got {part!r}")
    return name, sets


def run(env_id: str, steps: int, seed: int, sets: list[str], episodes: int, max_time: float | None = None) -> dict:
    stop = [] if max_time is None else ["--max-time", str(max_time)]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        trained = run_train(
            env_id, seed, total_steps=steps, sets=sets, extra_args=stop, logdir=run_dir, checkpoint_every=0
        )
        ev = run_fastvec(["eval", run_dir, "--episodes", str(episodes)]) if episodes else {}
        curve = learning_curve(run_dir)
        curve.append([trained["env_steps"], trained["wall_seconds"], trained["final_mean_return"]])
    return {
        "wall_seconds": trained["wall_seconds"],
        "env_steps": trained["env_steps"],
        "train_return": trained["final_mean_return"],
        "eval_mean": ev.get("mean_return"),  # None with episodes=0: no evaluation
        "eval_std": ev.get("std_return"),
        "curve": curve,
    }


# RL Zoo's tuned PPO for the MuJoCo tasks (rl-baselines3-zoo hyperparams/ppo.yml, its
# -v3 entries; SB3's keyword names), all with normalize: true and one env: the SB3 anchor.
_ZOO_NET = dict(log_std_init=-2, ortho_init=False, activation_fn="relu", net_arch=dict(pi=[256, 256], vf=[256, 256]))
ZOO_SB3 = {
    "HalfCheetah-v5": dict(
        n_steps=512, batch_size=64, gamma=0.98, learning_rate=2.0633e-05, ent_coef=0.000401762, clip_range=0.1,
        n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096, policy_kwargs=_ZOO_NET,
    ),
    "Hopper-v5": dict(
        n_steps=512, batch_size=32, gamma=0.999, learning_rate=9.80828e-05, ent_coef=0.00229519, clip_range=0.2,
        n_epochs=5, gae_lambda=0.99, max_grad_norm=0.7, vf_coef=0.835671, policy_kwargs=_ZOO_NET,
    ),
    "Walker2d-v5": dict(
        n_steps=512, batch_size=32, gamma=0.99, learning_rate=5.05041e-05, ent_coef=0.000585045, clip_range=0.1,
        n_epochs=20, gae_lambda=0.95, max_grad_norm=1, vf_coef=0.871923,
    ),
}  # fmt: skip


def run_sb3(env_id: str, steps: int, seed: int, episodes: int) -> dict:
    """SB3's PPO with RL Zoo's hyperparameters for ``env_id`` (VecNormalize on observations
    and rewards, discounted with the run's gamma, as Zoo does), then ``episodes``
    deterministic episodes with the normaliser's statistics frozen. Run in a fresh process
    (``--_sb3``)."""
    import numpy as np
    import stable_baselines3
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    hp = {k: (dict(v) if isinstance(v, dict) else v) for k, v in ZOO_SB3[env_id].items()}
    if "policy_kwargs" in hp:
        hp["policy_kwargs"]["activation_fn"] = torch.nn.ReLU
    rets: list[float] = []
    curve: list[list[float]] = []
    w = torch.nn.Parameter(torch.zeros(4))  # torch's first-use imports (seconds) stay out of the
    w.sum().backward()  # clock, as fastvec's warm-up keeps them out of its wall time; torch's
    torch.optim.Adam([w]).step()  # default threads, as a user runs SB3
    t0 = time.perf_counter()

    class Curve(BaseCallback):
        def _on_step(self) -> bool:
            rets.extend(i["episode"]["r"] for i in self.locals["infos"] if "episode" in i)
            return True

        def _on_rollout_end(self) -> None:
            if rets:
                wall = round(time.perf_counter() - t0, 2)
                curve.append([self.num_timesteps, wall, round(float(np.mean(rets[-20:])), 1)])

    env = VecNormalize(make_vec_env(env_id, n_envs=1, seed=seed), gamma=hp["gamma"])
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **hp)
    model.learn(steps, callback=Curve())
    wall = time.perf_counter() - t0
    ev = VecNormalize(make_vec_env(env_id, n_envs=1, seed=seed + 10_000), training=False, norm_reward=False)
    ev.obs_rms = env.obs_rms
    done: list[float] = []
    obs = ev.reset()
    while len(done) < episodes:
        obs, _, _, infos = ev.step(model.predict(obs, deterministic=True)[0])
        done.extend(i["episode"]["r"] for i in infos if "episode" in i)
    ev.close()
    env.close()
    curve.append([int(model.num_timesteps), round(wall, 2), round(float(np.mean(rets[-20:])), 1)])
    return {
        "wall_seconds": wall,
        "env_steps": int(model.num_timesteps),
        "train_return": float(np.mean(rets[-20:])),
        "eval_mean": float(np.mean(done)),
        "eval_std": float(np.std(done)),
        "curve": curve,
        "sets": [f"RL Zoo's {env_id} hyperparameters, stable-baselines3 {stable_baselines3.__version__}"],
    }


def _sb3_child(env_id: str, steps: int, seed: int, episodes: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--_sb3", env_id, str(steps), str(seed), str(episodes)]
    return child_json(cmd, "SB3's run", timeout=None)


def learning_curve(run_dir: str, points: int = 200) -> list[list[float]]:
    """[env steps, wall s, mean training return] from a run's metrics log, at most
    ``points`` rows (evenly thinned, the last kept): the results page's curves."""
    rows = [
        [m["env_steps"], round(m["time/wall_s"], 2), round(m["charts/mean_return"], 1)]
        for m in return_rows(run_dir)
        if "time/wall_s" in m
    ]
    if len(rows) > points:
        keep = sorted({round(i * (len(rows) - 1) / (points - 1)) for i in range(points)})
        rows = [rows[i] for i in keep]
    return rows


def _num(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def report(
    env_id: str, steps: int, episodes: int, by: dict, command: str, took: float, max_time=None, sb3_steps=None
) -> str:
    seeds = sorted(next(iter(by.values())))
    budget = f"{steps:,} env steps" if max_time is None else f"{max_time:g} s of training (at most {steps:,} env steps)"
    if SB3 in by and sb3_steps not in (None, steps):
        budget += f", SB3 {sb3_steps:,}"
    lines = [
        f"# Candidate presets: {env_id}, {budget}, {len(seeds)} seeds ({took:.0f} s)",
        "",
        f"`python benchmarks/bench_presets.py {command}` on {platform.platform()}, {os.cpu_count()} cores. "
        f"Each seed a fresh `fastvec train`, then `fastvec eval` of its checkpoint ({episodes} deterministic "
        "episodes). Medians over seeds (min-max); worst: the lowest seed's evaluation.",
        "",
        "| candidate | --set | wall s | training return | eval mean | eval, worst seed |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, runs in by.items():
        rs = [runs[s] for s in seeds]
        sets = " ".join(f"`{s}`" for s in rs[0]["sets"]) or "(the preset)"
        lines.append(
            f"| {name} | {sets} | {span([r['wall_seconds'] for r in rs], '{:.1f}')} "
            f"| {span([r['train_return'] for r in rs], '{:.1f}')} | {span([r['eval_mean'] for r in rs], '{:.1f}')} "
            f"| {min(r['eval_mean'] for r in rs):.1f} |"
        )
    lines += anchor_lines(by, seeds)
    lines += ["", "Per seed (wall s, training return, eval mean +- std):", ""]
    for s in seeds:
        cells = "; ".join(
            f"{n} {by[n][s]['wall_seconds']:.0f} s, {_num(by[n][s]['train_return'])}, "
            f"{by[n][s]['eval_mean']:.0f} +- {by[n][s]['eval_std']:.0f}"
            for n in by
        )
        lines.append(f"- seed {s}: {cells}")
    return "\n".join(lines) + "\n"


def time_to(curve: list, target: float) -> float | None:
    """The wall time of a learning curve's first point at or above ``target`` (None: never)."""
    return next((wall for _, wall, ret in curve if ret is not None and ret >= target), None)


def anchor_lines(by: dict, seeds: list) -> list[str]:
    """With the SB3 anchor in the run: each candidate's wall time to SB3's median final
    training return, against SB3's median wall time."""
    if SB3 not in by:
        return []
    target = statistics.median(by[SB3][s]["train_return"] for s in seeds)
    sb3_wall = statistics.median(by[SB3][s]["wall_seconds"] for s in seeds)
    lines = [
        "",
        f"SB3 anchor: the training return SB3 ends at (median {target:.1f}, in a median {sb3_wall:.1f} s); "
        "each candidate's wall time to reach it (its training return, the same 20-episode mean):",
        "",
    ]
    for name in by:
        if name == SB3:
            continue
        times = [time_to(by[name][s]["curve"], target) for s in seeds]
        got = [t for t in times if t is not None]
        ratio = (
            f"{statistics.median(got) / sb3_wall:.2f}x SB3's time" if len(got) == len(times) else "not on every seed"
        )
        lines.append(f"- {name}: reached on {len(got)}/{len(times)} seeds, {span(got, '{:.1f}')} s: {ratio}")
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_sb3"]:
        env_id, steps, seed, episodes = argv[1], *map(int, argv[2:5])
        print(json.dumps(run_sb3(env_id, steps, seed, episodes)))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("env_id")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--candidate", type=parse_candidate, action="append", required=True)
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--max-time", type=float, default=None, help="stop each fastvec run after this many seconds")
    p.add_argument("--out", default=None, help="folder for <name>.md and <name>.json")
    p.add_argument("--name", default=None, help="the files' name (default: the env id)")
    p.add_argument("--sb3", action="store_true", help="add SB3's PPO with RL Zoo's hyperparameters (sb3_zoo)")
    p.add_argument("--sb3-steps", type=int, default=None, help="SB3's env steps (default: --steps)")
    args = p.parse_args(argv)
    if any(n == SB3 for n, _ in args.candidate):
        p.error(f"{SB3} is --sb3's candidate; name yours otherwise")
    if args.sb3:
        if args.env_id not in ZOO_SB3:
            p.error(f"--sb3: RL Zoo's hyperparameters are here for {sorted(ZOO_SB3)}, not {args.env_id}")
        args.candidate.append((SB3, []))
    names = [n for n, _ in args.candidate]
    if len(set(names)) != len(names):
        p.error(f"candidate names must differ: {names}")
    sb3_steps = args.steps if args.sb3_steps is None else args.sb3_steps
    if min(args.steps, sb3_steps, args.episodes) < 1 or (args.max_time is not None and not args.max_time > 0):
        p.error("--steps, --sb3-steps, --episodes and --max-time must be positive")
    if args.max_time is not None and args.sb3:
        p.error("--sb3 runs SB3 for --steps: not with --max-time")
    if args.sb3_steps is not None and not args.sb3:
        p.error("--sb3-steps needs --sb3")
    t0 = time.time()
    by: dict = {n: {} for n in names}
    for r, seed in enumerate(args.seeds):
        order = args.candidate if r % 2 == 0 else args.candidate[::-1]
        for name, sets in order:
            if name == SB3:
                res = _sb3_child(args.env_id, sb3_steps, seed, args.episodes)
            else:
                res = {**run(args.env_id, args.steps, seed, sets, args.episodes, args.max_time), "sets": sets}
            by[name][seed] = res
            print(f"{name} seed {seed}: {res}", flush=True)
    command = " ".join(argv)
    md = report(args.env_id, args.steps, args.episodes, by, command, time.time() - t0, args.max_time, sb3_steps)
    print(md, end="")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, (args.name or args.env_id).replace("/", "_"))
        open(stem + ".md", "w").write(md)
        json.dump(
            {
                "env_id": args.env_id,
                "steps": args.steps,
                "sb3_steps": sb3_steps if args.sb3 else None,
                "max_time": args.max_time,
                "runs": by,
                "command": command,
            },
            open(stem + ".json", "w"),
            indent=1,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
