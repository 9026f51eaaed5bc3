"""Turns the results dict of ``bench_vecenv.py`` into ``results.md`` and PNG charts."""

from __future__ import annotations

import os

import numpy as np


# ---------------------------------------------------------------------------- formatting
def _sps(x) -> str:
    return "—" if x is None else f"{x:,.0f}"


def _ratio(x) -> str:
    return "—" if x is None else f"{x:.2f}x"


def _spread(s: dict) -> str:
    if not s or s.get("min") is None:
        return "—"
    return f"{s['min']:.2f}–{s['max']:.2f}x"


def _ms(x) -> str:
    if x is None:
        return "—"
    return f"{x:.3f}" if x < 1 else f"{x:.2f}"


def _lat(d: dict) -> str:
    return " / ".join(_ms(d.get(k)) for k in ("p50", "p90", "p99"))


def _table(header: list[str], rows: list[list[str]], align: str | None = None) -> list[str]:
    align = align or "l" * len(header)
    sep = ["---:" if a == "r" else "---" for a in align]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return out


def summary_rows(results: dict) -> list[list[str]]:
    """Rows of the summary table: workload, candidate, median sps, median ratio, spread."""
    rows = []
    for w in results.get("vecenv", []):
        for c in w["candidates"]:
            rows.append(
                [w["title"], c["label"], _sps(c["median_sps"]), _ratio(c["ratio"]["median"]), _spread(c["ratio"])]
            )
    return rows


def target_rows(results: dict) -> list[dict]:
    out = []
    for w in results.get("vecenv", []):
        fv = next((c for c in w["candidates"] if c["candidate"] == "fastvec"), None)
        if w.get("target") is not None:
            med = fv["ratio"]["median"] if fv else None
            out.append(
                {
                    "workload": w["title"],
                    "metric": "fastvec.AsyncVectorEnv / SyncVectorEnv",
                    "target": w["target"],
                    "measured": med,
                    "spread": fv["ratio"] if fv else None,
                    "met": None if med is None else bool(med >= w["target"]),
                }
            )
        if w.get("target_vs_baselines") is not None:
            s = w.get("fastvec_vs_baselines") or {}
            med = s.get("median")
            out.append(
                {
                    "workload": w["title"],
                    "metric": "fastvec.AsyncVectorEnv / baselines SubprocVecEnv",
                    "target": w["target_vs_baselines"],
                    "measured": med,
                    "spread": s,
                    "met": None if med is None else bool(med >= w["target_vs_baselines"]),
                }
            )
    return out


# ---------------------------------------------------------------------------- markdown
def render_markdown(results: dict, charts: list[str]) -> str:
    L = _header(results["meta"]) + _targets(results) + _workloads(results) + _scaling(results.get("scaling"))
    if results.get("notes"):
        L += ["## Notes", ""] + [f"- {n}" for n in results["notes"]] + [""]
    if charts:
        L += ["## Charts", ""] + [f"![{os.path.splitext(c)[0]}]({c})" for c in charts] + [""]
    return "\n".join(L)


def _header(meta: dict) -> list[str]:
    """The run's command, machine, load and method."""
    L = ["# fastvec benchmark results", ""]
    L += [
        f"- Command: `{meta['command']}`",
        f"- Date: {meta['date']}; wall time {meta.get('wall_s', 0):.0f} s",
        f"- Machine: {meta['cores']} usable cores ({meta['cpu']}), {meta['platform']}",
        f"- Load average (1 min) before / after the run: {meta['loadavg_start']} / {meta['loadavg_end']} "
        "(after includes this run's own processes)",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        f"- Mode: {'quick' if meta['quick'] else 'full'}; rounds: {meta['repeats']}; "
        f"fastvec num_workers: {meta['fastvec_workers'] or 'default (min(num_envs, cores))'}; seed {meta['seed']}",
        "",
    ]
    try:
        # The end value includes this run's own processes; the start value is the others'.
        busy = float(meta["loadavg_start"]) > 0.5 * meta["cores"]
    except (TypeError, ValueError, KeyError):
        busy = False
    if busy:
        L += [
            f"> **Busy machine**: load average {meta['loadavg_start']} before the run on "
            f"{meta['cores']} cores. Other processes took cores away from the multiprocess candidates, "
            "so their ratios are lower and their spreads wider than on an idle machine.",
            "",
        ]
    L += [
        "Ratios divide a candidate's env steps/s by gymnasium SyncVectorEnv's measured in the same "
        "round (candidates interleaved, order rotated each round); the table gives the median over "
        "rounds and the min–max spread. Latency: p50 / p90 / p99 of single `step()` calls, in ms, "
        "pooled over rounds. Actions are random, drawn before timing.",
        "",
    ]
    return L


def _targets(results: dict) -> list[str]:
    """The issue's speed targets, met or missed."""
    targets = target_rows(results)
    if not targets:
        return []
    L = ["## Targets", ""]
    rows = []
    for t in targets:
        met = "—" if t["met"] is None else ("met" if t["met"] else "MISSED")
        rows.append(
            [t["workload"], t["metric"], f">= {t['target']:g}x", _ratio(t["measured"]), _spread(t["spread"]), met]
        )
    L += _table(["workload", "ratio", "target", "median", "min–max", ""], rows, "lllrrl") + [""]
    return L


def _workloads(results: dict) -> list[str]:
    """The summary table and one table per workload."""
    if not results.get("vecenv"):
        return []
    L = ["## Summary", ""]
    L += _table(
        ["workload", "candidate", "median steps/s", "median ratio vs SyncVectorEnv", "spread (min–max)"],
        summary_rows(results),
        "llrrr",
    ) + [""]
    L += ["## Per workload", ""]
    for w in results["vecenv"]:
        L += [
            f"### {w['title']}",
            "",
            f"{w['steps']} timed steps (+{w['warmup']} warm-up) per measurement, {w['repeats']} rounds.",
            "",
        ]
        rows = []
        for c in w["candidates"]:
            rows.append(
                [
                    c["label"],
                    _sps(c["median_sps"]),
                    _ratio(c["ratio"]["median"]),
                    _spread(c["ratio"]),
                    _lat(c["latency_ms"]),
                    "—" if c["startup_s"] is None else f"{c['startup_s']:.2f}",
                    c["settings"] or "—",
                ]
            )
        L += _table(
            [
                "candidate",
                "median steps/s",
                "ratio vs Sync",
                "spread",
                "latency p50/p90/p99 ms",
                "startup s",
                "settings",
            ],
            rows,
            "lrrrrrl",
        ) + [""]
        fb = w.get("fastvec_vs_baselines") or {}
        if fb.get("median") is not None:
            L += [f"fastvec.AsyncVectorEnv / baselines SubprocVecEnv: {_ratio(fb['median'])} ({_spread(fb)}).", ""]
    return L


def _scaling(sc: dict | None) -> list[str]:
    """The scaling sweep: steps/s and ratio per num_envs x num_workers, then latencies."""
    if not sc:
        return []
    L = [
        f"## Scaling: fastvec.AsyncVectorEnv on {sc['env_id']}",
        "",
        f"About {sc['env_steps']:,} env steps per point, {sc['repeats']} rounds, {sc['cores']} cores. "
        "Cells: median steps/s (ratio vs SyncVectorEnv with the same num_envs, same round).",
        "",
    ]
    pts = {(p["candidate"], p["num_envs"], p["num_workers"]): p for p in sc["points"]}
    header = ["num_envs", "SyncVectorEnv"] + [f"fastvec, {k} worker{'s' if k > 1 else ''}" for k in sc["num_workers"]]
    rows = []
    for n in sc["num_envs"]:
        row = [str(n), _sps((pts.get(("sync", n, None)) or {}).get("median_sps"))]
        for k in sc["num_workers"]:
            p = pts.get(("fastvec", n, k))
            row.append(
                "—"
                if p is None or p["median_sps"] is None
                else f"{_sps(p['median_sps'])} ({_ratio(p['ratio']['median'])})"
            )
        rows.append(row)
    L += _table(header, rows, "r" * len(header)) + [""]
    rows = []
    for n in sc["num_envs"]:
        for k in [None] + list(sc["num_workers"]):
            p = pts.get(("sync" if k is None else "fastvec", n, k))
            if p and p["median_sps"] is not None:
                rows.append(
                    [
                        str(n),
                        "SyncVectorEnv" if k is None else f"fastvec, {k} worker{'s' if k > 1 else ''}",
                        _lat(p["latency_ms"]),
                    ]
                )
    L += ["Step latency (ms, p50 / p90 / p99):", ""]
    L += _table(["num_envs", "candidate", "latency p50/p90/p99 ms"], rows, "rlr") + [""]
    return L


# ---------------------------------------------------------------------------- charts
def render_charts(results: dict, out_dir: str) -> list[str]:
    """Write ratios.png, scaling.png and latency.png (those with data); return file names."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    written = []
    vec = [w for w in results.get("vecenv", []) if w["candidates"]]
    if vec:
        _ratios_chart(plt, vec, os.path.join(out_dir, "ratios.png"))
        written.append("ratios.png")
    sc = results.get("scaling")
    if sc and sc["points"]:
        _scaling_chart(plt, sc, os.path.join(out_dir, "scaling.png"))
        written.append("scaling.png")
    if vec:
        _latency_chart(plt, vec, os.path.join(out_dir, "latency.png"))
        written.append("latency.png")
    return written


def _ratios_chart(plt, vec: list, path: str) -> None:
    """One panel per workload: each candidate's median ratio to SyncVectorEnv, min-max whiskers."""
    fig, axes = plt.subplots(
        len(vec),
        1,
        figsize=(8, 1.2 + 0.45 * sum(len(w["candidates"]) for w in vec) + 0.6 * len(vec)),
        squeeze=False,
        gridspec_kw={"height_ratios": [max(1, len(w["candidates"])) for w in vec]},
    )
    for ax, w in zip(axes[:, 0], vec):
        cs = [c for c in w["candidates"]][::-1]
        med = np.array([c["ratio"]["median"] or 0.0 for c in cs])
        lo = np.array([(c["ratio"]["median"] or 0.0) - (c["ratio"]["min"] or 0.0) for c in cs])
        hi = np.array([(c["ratio"]["max"] or 0.0) - (c["ratio"]["median"] or 0.0) for c in cs])
        colors = [
            "tab:orange"
            if c["candidate"].startswith("fastvec")
            else ("tab:gray" if c["candidate"] == "sync" else "tab:blue")
            for c in cs
        ]
        y = np.arange(len(cs))
        ax.barh(y, med, xerr=[lo, hi], color=colors, capsize=3)
        ax.set_yticks(y, [c["label"] for c in cs], fontsize=8)
        ax.axvline(1.0, color="k", lw=0.8)
        if w.get("target"):
            ax.axvline(w["target"], color="tab:red", ls="--", lw=1, label=f"target {w['target']:g}x")
            ax.legend(loc="lower right", fontsize=7)
        for yi, m, h in zip(y, med, hi):
            ax.text(m + h, yi, f"  {m:.2f}x", va="center", fontsize=7)
        ax.set_title(w["title"], fontsize=9)
        ax.set_xlabel("env steps/s relative to SyncVectorEnv (median, min–max over rounds)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _scaling_chart(plt, sc: dict, path: str) -> None:
    """fastvec's steps/s and ratio over num_envs, one line per num_workers."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    pts = sc["points"]
    sync = sorted((p["num_envs"], p["median_sps"]) for p in pts if p["candidate"] == "sync" and p["median_sps"])
    if sync:
        a1.plot(*zip(*sync), "k--o", label="SyncVectorEnv")
    for k in sc["num_workers"]:
        line = sorted(
            (p["num_envs"], p["median_sps"], p["ratio"]["median"])
            for p in pts
            if p["candidate"] == "fastvec" and p["num_workers"] == k and p["median_sps"]
        )
        if line:
            xs, ys, rs = zip(*line)
            a1.plot(xs, ys, "-o", label=f"fastvec, {k} worker{'s' if k > 1 else ''}")
            a2.plot(xs, [r or 0 for r in rs], "-o", label=f"fastvec, {k} worker{'s' if k > 1 else ''}")
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sc["num_envs"], [str(n) for n in sc["num_envs"]])
        ax.set_xlabel("num_envs")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    a1.set_ylabel("env steps/s (median)")
    a1.set_title(f"{sc['env_id']}: throughput ({sc['cores']} cores)", fontsize=10)
    a2.axhline(1.0, color="k", lw=0.8)
    a2.set_ylabel("ratio vs SyncVectorEnv (median)")
    a2.set_title("relative to SyncVectorEnv, same num_envs", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _latency_chart(plt, vec: list, path: str) -> None:
    """p50 / p90 / p99 of single step() calls per candidate, one panel per workload."""
    fig, axes = plt.subplots(1, len(vec), figsize=(3.2 * len(vec) + 1, 4.2), squeeze=False)
    for ax, w in zip(axes[0], vec):
        cs = [c for c in w["candidates"] if c["latency_ms"]["p50"] is not None]
        x = np.arange(len(cs))
        p50 = [c["latency_ms"]["p50"] for c in cs]
        p90 = [c["latency_ms"]["p90"] for c in cs]
        p99 = [c["latency_ms"]["p99"] for c in cs]
        colors = [
            "tab:orange"
            if c["candidate"].startswith("fastvec")
            else ("tab:gray" if c["candidate"] == "sync" else "tab:blue")
            for c in cs
        ]
        ax.bar(x, p50, color=colors, label="p50")
        ax.scatter(x, p90, marker="_", s=200, color="k", label="p90", zorder=3)
        ax.scatter(x, p99, marker="v", s=20, color="tab:red", label="p99", zorder=3)
        ax.set_yscale("log")
        ax.set_xticks(x, [c["label"] for c in cs], rotation=60, ha="right", fontsize=7)
        ax.set_title(w.get("short") or w["title"], fontsize=9)
        ax.set_ylabel("ms per step() call")
        ax.grid(alpha=0.3, axis="y")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=110)
    plt.close(fig)
