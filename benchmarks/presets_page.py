#!/usr/bin/env python
"""The docs' results page from ``bench_presets.py``'s runs: per task, every candidate's
seeds (return against wall time and against env steps, a chart and a table) beside the
published PPO figures of RL Zoo, CleanRL and Sample Factory.

    python benchmarks/presets_page.py benchmarks/results/presets --out docs/results.md

The charts go beside the page (``results/<name>.png`` under the page's folder, named as the
JSON files).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

from bench_presets import SB3, anchor_lines

# Published figures, newest known to us; (source, what and where, env steps, return).
_ZOO = "RL Zoo (SB3 PPO, tuned), deterministic evaluation of one run, `benchmark.md`"
_CLEANRL = "CleanRL `ppo_continuous_action.py` (tag pr-424), training return, mean +- std over seeds"
_SF = "Sample Factory 2.0 APPO, model card on Hugging Face (`edbeeching/mujoco_*_1111`)"
PUBLISHED = {
    "HalfCheetah-v5": [
        (_ZOO, "HalfCheetah-v3", "1M", "5,819 +- 664"),
        (_CLEANRL, "HalfCheetah-v4", "1M", "1,443 +- 46"),
        (_SF, "HalfCheetah-v4", "not stated", "7,390 +- 61"),
    ],
    "Hopper-v5": [
        (_ZOO, "Hopper-v3", "1M", "2,410 +- 10"),
        (_CLEANRL, "Hopper-v4", "1M", "2,383 +- 272"),
        (_SF, "Hopper-v4", "not stated", "1,483 +- 541"),
    ],
    "Walker2d-v5": [
        (_ZOO, "Walker2d-v3", "1M", "3,479 +- 822"),
        (_CLEANRL, "Walker2d-v4", "1M", "2,288 +- 572"),
        (_SF, "Walker2d-v4", "not stated", "4,429 +- 1,070"),
    ],
    "Ant-v5": [(_ZOO, "Ant-v3", "1M", "1,327 +- 452")],
}
MINUTES = (1, 2, 5, 10)


def return_at(curve: list, wall_s: float) -> float | None:
    """The training return of a curve's last point at or before ``wall_s`` (None: the run
    ended sooner, or no episode had ended)."""
    if not curve or curve[-1][1] < wall_s:
        return None
    before = [ret for _, wall, ret in curve if wall <= wall_s and ret is not None]
    return before[-1] if before else None


def _num(v) -> str:
    """A return for a table: thousands separated; "-" for none (or a score of no episode)."""
    return "-" if v is None or v == float("-inf") else f"{v:,.0f}"


def task_section(res: dict, chart: str, sb3: dict | None = None) -> list[str]:
    env_id, steps, max_time = res["env_id"], res["steps"], res.get("max_time")
    budget = f"{steps:,} env steps" if max_time is None else f"{max_time / 60:g} minutes of training"
    if res.get("sb3_steps") not in (None, steps):
        budget += f" (SB3: {res['sb3_steps']:,})"
    lines = [
        f"## {env_id}, {budget}",
        "",
        f"`python benchmarks/bench_presets.py {res['command']}`",
        "",
    ]
    if res.get("note"):  # said of the run after it ran (an older preset, say)
        lines += [res["note"], ""]
    if env_id in PUBLISHED:
        lines += ["| published | env | env steps | return |", "|---|---|---|---:|"]
        lines += [f"| {src} | {env} | {n} | {ret} |" for src, env, n, ret in PUBLISHED[env_id]]
        lines.append("")
    lines += [f"![{env_id}: return against wall time and env steps]({chart})", ""]
    head = " | ".join(f"at {m} min" for m in MINUTES)
    lines += [
        f"| candidate | seed | wall s | training return | {head} | deterministic eval |",
        "|---|---:|---:|---:|" + "---:|" * len(MINUTES) + "---:|",
    ]
    for name, runs in res["runs"].items():
        for seed, r in sorted(runs.items(), key=lambda kv: int(kv[0])):
            at = " | ".join(_num(return_at(r["curve"], 60 * m)) for m in MINUTES)
            lines.append(
                f"| {name} | {seed} | {r['wall_seconds']:.0f} | {_num(r['train_return'])} | {at} "
                f"| {_num(r['eval_mean'])} +- {_num(r['eval_std'])} |"
            )
    by, seeds = res["runs"], sorted(next(iter(res["runs"].values())))
    if sb3 is not None and SB3 not in by and set(seeds) <= set(sb3):  # the anchor of another run
        by = {**by, SB3: sb3}
    lines += anchor_lines(by, seeds)
    lines += ["", "Settings (`--set` over the env's preset):", ""]
    lines += [f"- {name}: " + (" ".join(f"`{s}`" for s in next(iter(runs.values()))["sets"]) or "the preset")
              for name, runs in res["runs"].items()]  # fmt: skip
    return lines + [""]


def draw(res: dict, path: str) -> None:
    """Two panels, return against wall time and against env steps: a line per seed, a
    colour per candidate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, (name, runs) in enumerate(res["runs"].items()):
        for j, r in enumerate(runs.values()):
            pts = [p for p in r["curve"] if p[2] is not None]
            for ax, x in zip(axes, (1, 0)):
                ax.plot([p[x] for p in pts], [p[2] for p in pts], color=f"C{i}", lw=1, label=name if j == 0 else None)
    axes[0].set_xlabel("wall time (s)")
    axes[1].set_xlabel("env steps")
    for ax in axes:
        ax.set_ylabel("training return (last 20 episodes)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(res["env_id"])
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def page(sections: list[tuple[dict, str]]) -> str:
    lines = [
        "# Results",
        "",
        "What `fastvec train` reaches, per task and seed, on this project's machine (2-core x86_64",
        "KVM VM, no GPU), beside the published PPO figures. Every run is a fresh `fastvec train`",
        "(lock-step, deterministic per seed) and `fastvec eval` of its last checkpoint (10",
        "deterministic episodes, as RL Zoo's benchmark); the training return is the mean of the",
        "last 20 training episodes (sampled actions, as CleanRL reports). The published figures",
        "are for older env versions (v3, v4) and other machines: they set the level, not a race.",
        "Regenerate with `python benchmarks/presets_page.py benchmarks/results/presets --out docs/results.md`.",
        "",
    ]
    sb3 = {res["env_id"]: res["runs"][SB3] for res, _ in sections if SB3 in res["runs"]}
    for res, chart in sections:
        lines += task_section(res, chart, sb3.get(res["env_id"]))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", help="bench_presets.py's --out folder")
    p.add_argument("--out", required=True, help="the page to write (markdown)")
    args = p.parse_args(argv)
    files = sorted(glob.glob(os.path.join(args.folder, "*.json")))
    if not files:
        p.error(f"no bench_presets.py results (*.json) in {args.folder}")
    img_dir = os.path.join(os.path.dirname(os.path.abspath(args.out)), "results")
    os.makedirs(img_dir, exist_ok=True)
    sections = []
    for path in files:
        res = json.load(open(path))
        chart = os.path.basename(path)[: -len(".json")] + ".png"
        draw(res, os.path.join(img_dir, chart))
        sections.append((res, f"results/{chart}"))
    sections.sort(key=lambda rc: (rc[0]["env_id"], -rc[0]["steps"]))
    with open(args.out, "w") as f:
        f.write(page(sections))
    print(f"wrote {args.out} and {len(sections)} charts in {img_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
