"""Kill -9 and resume, against the uninterrupted run: what an interruption costs.

For each seed: `fastvec train ENV --stop-at-return R` once uninterrupted, and once
killed with SIGKILL at random moments (``--kills`` times, each a uniform 0.5-3 s after the
(re)started run logged its first rows) and continued with ``--resume`` until it ends.
Both runs alternate seed by seed, in fresh processes. Reported per seed: whether each
reached R, the env steps its final JSON line counts, the difference in rollouts, the env
steps the killed run executed (a lower bound: each killed segment counts up to its last
logged row or checkpoint), and the wall times.

    python benchmarks/bench_resume.py [--env CartPole-v1] [--seeds 0 1 2] [--kills 2]
                                      [--out benchmarks/results/resume]

``--flaky``: instead, a flaky CartPole-v1 (its ``step`` raises in 1 of 20,000 calls)
trained for 200k env steps with ``fastvec train``'s CartPole preset, per seed: the run
must complete, report its restarts and reach a mean return of 475 as healthy runs do
(``flaky.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import tempfile
import time

from harness.cli_runs import metrics_rows, train_command
from harness.processes import child_env, last_json

from fastvec.train import resume_checkpoint


def _wait_rows(p, run, n, timeout=120.0) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if p.poll() is not None:
            return False
        if len(metrics_rows(run)) >= n:
            return True
        time.sleep(0.02)
    return p.poll() is None


def run_one(first: list[str], run: str, kills: int, rng) -> dict:
    """``first`` (a ``fastvec train`` logging to ``run``) to its end, killed ``kills``
    times on the way and continued each time with ``--resume``."""
    resume = train_command(None, extra_args=["--resume", run])
    t0 = time.perf_counter()
    executed = start = 0
    killed = 0
    cmd = first
    while True:
        p = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=os.path.dirname(run), env=child_env()
        )
        if killed < kills and _wait_rows(p, run, len(metrics_rows(run)) + 1):
            time.sleep(rng.uniform(0.5, 3.0))
            if p.poll() is None:
                p.kill()
                p.communicate()
                # this segment ran from `start` to at least its last logged row and its
                # last checkpoint; the next one starts from the checkpoint a resume takes
                rows = metrics_rows(run)
                try:
                    kept = resume_checkpoint(run)[1]["train_state"]["env_steps"]
                except ValueError:
                    kept = 0
                executed += max(rows[-1]["env_steps"] if rows else 0, kept) - start
                start = kept
                killed += 1
                cmd = resume
                continue
        out, err = p.communicate()
        res = last_json(out)
        if p.returncode != 0 or res is None:
            raise RuntimeError(f"run failed ({p.returncode}): {err.strip().splitlines()[-1:]}")
        executed += res["env_steps"] - start
        res["kills"] = killed
        res["executed_env_steps"] = executed
        res["total_wall_s"] = round(time.perf_counter() - t0, 2)
        return res


class _FlakyCartPole:
    """CartPole-v1 whose ``step`` raises with probability ``p`` (its own RNG)."""

    def __new__(cls, p=1 / 20_000):
        import gymnasium as gym
        import numpy as np

        class Flaky(gym.Wrapper):
            def __init__(self):
                super().__init__(gym.make("CartPole-v1"))
                self.rng = np.random.default_rng([os.getpid(), id(self)])

            def step(self, action):
                if self.rng.random() < p:
                    raise RuntimeError("flaky env: injected step failure")
                return self.env.step(action)

        return Flaky()


def flaky(seeds, steps, out) -> None:
    import warnings

    import gymnasium as gym

    from fastvec.train import PPOConfig, apply_overrides, preset_for, run_training

    gym.register("FlakyCartPole-v0", entry_point=_FlakyCartPole)
    lines = [
        "# A flaky env trained through its failures (CartPole-v1, `step` raises in 1 of 20,000)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; {time.strftime('%Y-%m-%d')}. Command: "
        f"`python benchmarks/bench_resume.py --flaky --seeds {' '.join(map(str, seeds))}`; "
        f"{steps:,} env steps, the CartPole-v1 preset.",
        "",
        "| seed | completed | env steps | restarts | best mean return (last 20 episodes) | final mean return | wall |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for seed in seeds:
        cfg = apply_overrides(PPOConfig(), preset_for("CartPole-v1"))
        apply_overrides(cfg, {"seed": seed, "total_steps": steps, "log_every_s": 0.1, "device": "cpu"})
        run = tempfile.mkdtemp(prefix="fastvec-flaky-")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                res = run_training("FlakyCartPole-v0", cfg, run_dir=run, progress=False, tensorboard=False)
            best = max((r.get("charts/mean_return") or 0) for r in metrics_rows(run))
        finally:
            shutil.rmtree(run, ignore_errors=True)
        lines.append(
            f"| {seed} | {not res['interrupted']} | {res['env_steps']:,} | {res['restarts']} | "
            f"{best:.1f} | {res['final_mean_return']} | {res['wall_seconds']:.1f} s |"
        )
        print(lines[-1], flush=True)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "flaky.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def _first(args, seed: int, run: str) -> list[str]:
    """The first command of a run: to the target, checkpointing as ``--checkpoint-every`` says."""
    stop = ["--stop-at-return", str(args.target), "--checkpoint-every", args.checkpoint_every]
    return train_command(args.env, seed, total_steps=500_000, extra_args=stop, logdir=run)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--target", type=float, default=475.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--checkpoint-every", default="4096")
    ap.add_argument("--out", default="benchmarks/results/resume")
    ap.add_argument("--flaky", action="store_true", help="the flaky-env run instead")
    ap.add_argument("--flaky-steps", type=int, default=200_000)
    args = ap.parse_args(argv)
    if args.flaky:
        return flaky(args.seeds, args.flaky_steps, args.out)
    rng = random.Random(1234)
    rows = []
    tmp = tempfile.mkdtemp(prefix="fastvec-resume-")
    try:
        for seed in args.seeds:
            runs = {name: os.path.join(tmp, f"{name}{seed}") for name in ("plain", "kill")}
            plain = run_one(_first(args, seed, runs["plain"]), runs["plain"], 0, rng)
            kill = run_one(_first(args, seed, runs["kill"]), runs["kill"], args.kills, rng)
            rows.append({"seed": seed, "plain": plain, "killed": kill})
            print(
                json.dumps(
                    {
                        "seed": seed,
                        "plain_steps": plain["env_steps"],
                        "killed_steps": kill["env_steps"],
                        "kills": kill["kills"],
                    }
                ),
                flush=True,
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    rollout = None
    lines = [
        f"# kill -9 and --resume against the uninterrupted run ({args.env} to {args.target:g})",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"{time.strftime('%Y-%m-%d')}. Command: `python benchmarks/bench_resume.py --env {args.env} "
        f"--seeds {' '.join(map(str, args.seeds))} --kills {args.kills}`.",
        "",
        "| seed | uninterrupted: solved, env steps, wall | killed + resumed: kills, solved, env steps "
        "counted, executed, wall | difference (rollouts) |",
        "|---|---|---|---|",
    ]
    for r in rows:
        p, k = r["plain"], r["killed"]
        rollout = p["env_steps"] // max(p["updates"] + 1, 1)
        diff = (k["env_steps"] - p["env_steps"]) / rollout
        lines.append(
            f"| {r['seed']} | {p['solved']}, {p['env_steps']:,}, {p['total_wall_s']} s | "
            f"{k['kills']}, {k['solved']}, {k['env_steps']:,}, {k['executed_env_steps']:,}, "
            f"{k['total_wall_s']} s | {diff:+.1f} |"
        )
    lines += [
        "",
        f"One rollout = {rollout} env steps. A resumed run resets its envs (their state is not "
        "in the checkpoint), so from the first kill on it sees other episodes than the "
        "uninterrupted run: the env steps to reach the target differ by the spread between "
        "seeds' runs, not by one rollout; the steps since the last checkpoint are redone "
        '("executed" minus "counted").',
    ]
    with open(os.path.join(args.out, "resume.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "resume.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
