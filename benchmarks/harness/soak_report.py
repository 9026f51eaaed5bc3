"""The soak test's analysis and report (``benchmarks/soak.py``): RSS slopes and growth
after the warm-up, the machine, the PASS/FAIL table and the RSS chart."""

from __future__ import annotations

import importlib.metadata
import os
import platform

import numpy as np
import psutil

MIB = float(1 << 20)
RSS_SLOPE_GOAL_MB = 1.0  # MB (MiB) per million env steps


def after_warmup(samples: list[dict], total_steps: int) -> list[dict]:
    """Drop the first 10% of env steps or the first 2 samples, whichever drops more."""
    cut = 0.1 * total_steps
    return [s for i, s in enumerate(samples) if i >= 2 and s["env_steps"] >= cut]


def running(part: dict) -> list[dict]:
    """The samples taken while the part was stepping. Train: the trainer's start-up
    before its workers exist and its shutdown (envs closed, final checkpoint, learning
    curve drawn: no longer the training loop) are left out, i.e. only the samples with
    the full set of workers alive and fewer env steps than the run's final count."""
    s = part["samples"]
    if part["part"] != "train":
        return s
    return [r for r in s if r["num_workers"] == part["num_workers"] and r["env_steps"] < part["total_steps"]]


def analysed(part: dict) -> list[dict]:
    """The samples the analysis uses: the running ones after the warm-up."""
    return after_warmup(running(part), part["total_steps"])


def rss_slope(rows: list[dict], key: str) -> float | None:
    """Least-squares slope of RSS in MB (MiB) per million env steps."""
    x = np.array([r["env_steps"] for r in rows], dtype=np.float64) / 1e6
    y = np.array([r[key] for r in rows], dtype=np.float64) / MIB
    if len(x) < 3 or np.ptp(x) == 0:
        return None
    return float(np.polyfit(x, y, 1)[0])


def growth(rows: list[dict], key: str) -> dict:
    """Min/max after warm-up; growth = the largest value of the last half above the
    largest of the first half (a value that comes and goes is not growth)."""
    v = [r[key] for r in rows]
    if not v:
        return {"min": None, "max": None, "first": None, "last": None, "growth": None}
    half = max(1, len(v) // 2)
    return {
        "min": min(v),
        "max": max(v),
        "first": v[0],
        "last": v[-1],
        "growth": max(0, max(v[half:] or v) - max(v[:half])),
    }


def _row(part: str, process, metric, value, goal, ok, detail="", result=None) -> dict:
    """One row of the PASS/FAIL table."""
    return {
        "part": part,
        "process": process,
        "metric": metric,
        "value": value,
        "goal": goal,
        "pass": bool(ok),
        "result": result or ("PASS" if ok else "FAIL"),
        "detail": detail,
    }


def _rss_rows(name: str, rows: list[dict], enough: bool) -> list[dict]:
    """RSS slope after the warm-up, of the main process and of the workers together."""
    out = []
    for process, key in (
        ("parent" if name == "engine" else "trainer", "parent_rss"),
        ("workers (sum)", "workers_rss_sum"),
    ):
        slope = rss_slope(rows, key)
        span = ""
        if rows:
            span = (
                f"{rows[0][key] / MIB:.1f} -> {rows[-1][key] / MIB:.1f} MB "
                f"(min {min(r[key] for r in rows) / MIB:.1f}, max {max(r[key] for r in rows) / MIB:.1f})"
            )
        out.append(
            _row(
                name,
                process,
                "RSS slope, MB per 1M env steps",
                None if slope is None else round(slope, 3),
                f"< {RSS_SLOPE_GOAL_MB:g}",
                enough and slope is not None and slope < RSS_SLOPE_GOAL_MB,
                span,
            )
        )
    return out


def _fd_rows(name: str, rows: list[dict], enough: bool) -> list[dict]:
    """Growth of the open fds, of the main process and of the workers together."""
    out = []
    for process, key in (
        ("parent" if name == "engine" else "trainer", "parent_fds"),
        ("workers (sum)", "worker_fds_sum"),
    ):
        g = growth(rows, key)
        out.append(
            _row(
                name,
                process,
                "open fds, min-max",
                f"{g['min']}-{g['max']}",
                "no growth",
                enough and g["growth"] == 0,
                f"first {g['first']}, last {g['last']}",
            )
        )
    return out


def _shm_rows(name: str, rows: list[dict], enough: bool) -> list[dict]:
    """Growth of the run's /dev/shm segments, and of every file in /dev/shm (INFO, not
    FAIL, when only other programs' files grew)."""
    g = growth(rows, "run_shm_files")
    run_ok = enough and g["growth"] == 0
    out = [
        _row(
            name,
            "all",
            "/dev/shm segments of the run, min-max",
            f"{g['min']}-{g['max']}",
            "no growth",
            run_ok,
            f"first {g['first']}, last {g['last']}",
        )
    ]
    g = growth(rows, "shm_files")
    detail = f"first {g['first']}, last {g['last']}"
    metric, value = "/dev/shm files (all), min-max", f"{g['min']}-{g['max']}"
    if enough and g["growth"] and run_ok:  # the extra files are other programs' (tests on this machine)
        detail += "; the excess are other programs' files (the run's own segments did not grow)"
        out.append(_row(name, "all", metric, value, "no growth", True, detail, result="INFO"))
    else:
        out.append(_row(name, "all", metric, value, "no growth", enough and g["growth"] == 0, detail))
    return out


def _end_rows(part: dict) -> list[dict]:
    """What the run left behind once closed / exited: new /dev/shm files (other live
    processes' not counted), the run's segments and its processes; the trainer's exit."""
    name, end = part["part"], part["end"]
    others = end["new_shm_files_of_others"]
    mine = [n for n in end["new_shm_files"] if n not in others]
    detail = []
    if others:
        detail.append(
            f"{len(others)} new file(s) held by other processes, not counted: "
            + "; ".join(f"{n} ({', '.join(h)})" for n, h in others.items())
        )
    if mine:
        detail.append(f"not the others': {mine}")
    out = [
        _row(
            name,
            "all",
            "/dev/shm files before -> after close" if name == "engine" else "/dev/shm files before -> after exit",
            f"{end['shm_files_before']} -> {end['shm_files_after']}"
            + (f" ({end['shm_files_after'] - len(others)} without others')" if others else ""),
            "after <= before",
            end["shm_files_after"] - len(others) <= end["shm_files_before"] and not mine,
            "; ".join(detail),
        ),
        _row(
            name,
            "all",
            "segments of the run left / worker processes left",
            f"{len(end['run_segments_left'])} / {len(end['processes_left'])}",
            "0 / 0",
            not end["run_segments_left"] and not end["processes_left"],
            f"segments seen: {len(end['run_segments_seen'])}",
        ),
    ]
    if name == "train":
        out.append(_row(name, "trainer", "exit status", part["returncode"], "0", part["returncode"] == 0))
    return out


def analyse(part: dict) -> list[dict]:
    """The PASS/FAIL rows of one part (``engine`` or ``train``) from its samples after
    the warm-up; fewer than 3 such samples fail every growth row."""
    name = part["part"]
    rows = analysed(part)
    enough = len(rows) >= 3
    results = _rss_rows(name, rows, enough) + _fd_rows(name, rows, enough) + _shm_rows(name, rows, enough)
    results += _end_rows(part)
    if not enough:
        for r in results[:6]:
            r["detail"] = (r["detail"] + "; " if r["detail"] else "") + f"only {len(rows)} samples after warm-up"
    return results


# ----------------------------------------------------------------------- output
def machine_info() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass

    def ver(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": ver("torch"),
        "gymnasium": ver("gymnasium"),
        "fastvec": ver("fastvec"),
        "psutil": psutil.__version__,
    }


def plot(parts: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(parts), figsize=(6.5 * len(parts), 4.2), squeeze=False)
    for ax, part in zip(axes[0], parts):
        s = part["samples"]
        x = np.array([r["env_steps"] for r in s], dtype=np.float64) / 1e6
        main = "parent" if part["part"] == "engine" else "trainer"
        ax.plot(x, [r["parent_rss"] / MIB for r in s], marker=".", label=f"{main} RSS")
        ax.plot(
            x,
            [r["workers_rss_sum"] / MIB if r["num_workers"] else np.nan for r in s],
            marker=".",
            label=f"workers RSS (sum of {part['num_workers']})",
        )
        kept = analysed(part)
        if kept:
            ax.axvspan(0, kept[0]["env_steps"] / 1e6, color="0.9", label="not analysed (warm-up, shutdown)")
            if part["part"] == "train":  # the trainer's shutdown, after its last kept sample
                ax.axvspan(kept[-1]["env_steps"] / 1e6, max(x.max(), kept[-1]["env_steps"] / 1e6), color="0.9")
        ax.set_title(f"{part['part']}: {part['total_steps']:,} env steps")
        ax.set_xlabel("env steps (millions)")
        ax.set_ylabel("RSS (MB)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_markdown(
    path: str, info: dict, parts: list[dict], results: list[dict], command: str, started: str, wall: float, loads: tuple
) -> None:
    lines = [
        f"# Soak benchmark ({started})",
        "",
        f"- machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, {info['platform']}",
        f"- python {info['python']}, numpy {info['numpy']}, torch {info['torch']}, "
        f"gymnasium {info['gymnasium']}, fastvec {info['fastvec']}, psutil {info['psutil']}",
        f"- load average (1 min) at start {loads[0]:.2f}, at end {loads[1]:.2f}; total wall time {wall:.0f} s",
        "",
        "Reproduce:",
        "",
        "```bash",
        command,
        "```",
        "",
    ]
    for part in parts:
        if part["part"] == "engine":
            lines.append(
                f"- **engine**: {part['total_steps']:,} env steps of CartPole-v1, `fastvec.AsyncVectorEnv` "
                f"with {part['num_envs']} envs on {part['num_workers']} workers, random actions (a pre-drawn "
                f"block of 10,000 x {part['num_envs']}, cycled); {part['wall_s']:.0f} s, "
                f"{part['env_steps_per_s']:,.0f} env steps/s, {len(part['samples'])} samples ({len(analysed(part))} analysed)."
            )
        else:
            lines.append(
                f"- **train**: `{part['command']}`: {part['total_steps']:,} env steps, {part['wall_s']:.0f} s, "
                f"{part['env_steps_per_s'] or 0:,.0f} env steps/s, exit {part['returncode']}, "
                f"{part['num_workers']} worker process(es), {len(part['samples'])} samples ({len(analysed(part))} analysed)."
            )
    lines += [
        "",
        "Warm-up dropped: the first 10% of env steps or the first 2 samples, whichever is more; "
        "train also drops the trainer's shutdown (samples once its workers are gone or its env steps "
        "reached the final count: final checkpoint, learning-curve plot). "
        "RSS slope: least-squares line of RSS (MB = 2^20 bytes) against env steps over the kept samples. "
        "fds / segments: *growth* means the largest value of the second half of the kept samples exceeds "
        'the largest of the first half. "Segments of the run" are the /dev/shm files mapped or open in '
        'the run\'s processes; "all" counts every file in /dev/shm (other programs included: INFO, not FAIL, '
        "when only those grew). Before -> after: files new since the part started that another live "
        "process maps or holds open are other programs' and not counted; any other new file fails. "
        "Workers: every descendant process except multiprocessing's resource tracker.",
        "",
        "| part | process | metric | value | goal | result | detail |",
        "|---|---|---|---:|---|---|---|",
    ]
    for r in results:
        value = "n/a" if r["value"] is None else r["value"]
        lines.append(
            f"| {r['part']} | {r['process']} | {r['metric']} | {value} | {r['goal']} | "
            f"{r['result'] if r['pass'] else '**FAIL**'} | {r['detail'].replace('|', '/')} |"
        )
    counts = {k: sum(r["result"] == k for r in results) for k in ("PASS", "INFO", "FAIL")}
    lines += [
        "",
        "**" + ", ".join(f"{v} {k}" for k, v in counts.items() if v) + f"** of {len(results)} rows",
        "",
        "![RSS against env steps](soak_rss.png)",
        "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines))
