"""Turns the results dict of ``bench_train.py`` into ``train.md``: one section per part
that ran (time to solve against SB3, transports, learners, Pong)."""

from __future__ import annotations

import json

# The return each env must reach (mean of the last 20 episodes) to count as solved.
THRESHOLDS = {"CartPole-v1": 475.0, "InvertedPendulum-v5": 950.0}


def _fmt(x, nd=2):
    return "—" if x is None else f"{x:.{nd}f}"


def _solve_md(part: dict, title: str) -> list[str]:
    """Time to solve, SB3 against fastvec: the medians, the goal, every run."""
    s = part["summary"]
    lines = [
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
    for r in part["runs"]:
        lines.append(
            f"| {r['seed']} | {r['candidate']} | {r.get('solved', r.get('error'))} | "
            f"{r.get('env_steps', '—')} | {_fmt(r.get('wall_seconds'))} | {_fmt(r.get('load'))} |"
        )
    lines.append("")
    return lines


def _transports_md(tr: dict) -> list[str]:
    """One env's transports: the same trainer on each vector env that ran."""
    s = tr["summary"]
    lines = [
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
    return lines


def _learners_md(part: dict) -> list[str]:
    """The numpy learner against torch's autograd: medians per env and learner, every run."""
    lines = [
        "## The numpy learner against torch's autograd (same seeds, the engine)",
        "",
        "| env | learner | median wall s | median env steps | solved | median final return | "
        "median learn s | learner samples/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, c in part["summary"].items():
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
    for r in part["runs"]:
        tb = r.get("time_breakdown") or {}
        lines.append(
            f"| {r['env']} | {r['seed']} | {r['candidate']} | {r.get('solved', r.get('error'))} | "
            f"{r.get('env_steps', '—')} | {_fmt(r.get('wall_seconds'))} | "
            f"{_fmt(r.get('final_mean_return'), 1)} | {_fmt(tb.get('learn'))} |"
        )
    lines.append("")
    return lines


def _pong_md(r: dict) -> list[str]:
    """Pong's training loop and rollout collection against the engine's random actions."""
    lines = ["## Pong (ALE/Pong-v5, 8 envs)", ""]
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
    return lines


def report(results: dict) -> str:
    """The markdown of ``train.md`` (without its final newline) from the dict that
    ``bench_train.py`` writes to ``train.json``: one section per part present."""
    m = results["machine"]
    lines = [
        f"# PPO benchmarks ({results['started']}, {m['cores']} cores, "
        f"load {_fmt(m['load_start'])} -> {_fmt(m.get('load_end'))})",
        "",
    ]
    for key, title in (("cartpole", "CartPole-v1 to 475"), ("pendulum", "InvertedPendulum-v5 to 950")):
        if key in results:
            lines += _solve_md(results[key], title)
    for tr in results.get("transports", []):
        lines += _transports_md(tr)
    if "learners" in results:
        lines += _learners_md(results["learners"])
    if "pong" in results:
        lines += _pong_md(results["pong"])
    return "\n".join(lines)
