"""Real loops: fastvec where users train, against the serial vector env in the same run.

Back-to-back random steps (``vecenv_bench``) show the engine's ceiling; nobody trains
like that. Each loop here runs what a user runs, with the policy's (or a stand-in's)
compute between two steps, at torch's default thread count:

- ``gap``: the step time after the caller computed for 0-4 ms (fixed work, calibrated
  once per process on an idle core; the whole iteration is timed too, so a candidate
  that steals the caller's core shows it);
- ``policy``: a torch policy between steps (an MLP for HalfCheetah, the Nature CNN for
  Pong), env steps/s of the whole loop;
- ``sb3``: Stable-Baselines3 PPO end to end (``model.learn``) on DummyVecEnv, SB3's
  SubprocVecEnv and ``fastvec.SubprocVecEnv``;
- ``cleanrl``: a CleanRL-style PPO script (gymnasium vector env, torch) on
  SyncVectorEnv and ``fastvec.AsyncVectorEnv``;
- ``train``: ``fastvec train`` on its Sync backend (gymnasium's SyncVectorEnv) and on
  its engine.

Every measurement runs in a fresh process (``python -m harness.loop_children JSON``),
candidates interleaved over rounds in a rotating order, with the same seeds and the
same work; the report gives medians with ranges and each candidate's ratio to the
serial baseline of the same round. Two ablations show what each default buys:
``*_fixed`` is fastvec with the fixed spins that were the defaults before waits learned
the loop (``spin_us=200, main_spin_us=20``), ``*_torch`` fastvec with torch's threads
left alone (``torch_threads=None``; see ``fastvec.doors.threads``); for ``train``,
``engine_spin`` is the trainer spinning through its workers' step where it would sleep
(``fastvec.train.commands.cli.main_spin_for``), ``engine_lockstep`` Pong without its preset's
batch groups, ``*_autograd`` the trainer with torch's autograd
where its numpy learner applies (``PPOConfig.learner``; the ratios stay against the
default Sync run). For fastvec's candidates (not ``train``, whose
engine is inside the trainer) the report also counts what its waits did per step
(``Engine.wait_counts``): how often the parent slept until a worker rang, and how often
a worker napped towards its forecast or slept until the parent rang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from .processes import child_env, children_cpu_seconds, last_json

FIXED_SPINS = {"spin_us": 200.0, "main_spin_us": 20.0}
GAPS_MS = (0.0, 0.1, 0.4, 1.0, 4.0)

# (loop, case) -> what to run; ``base`` is the serial baseline the ratios are against.
CASES = {
    "gap": [
        dict(
            case="HalfCheetah-v5 x8",
            env="HalfCheetah-v5",
            num_envs=8,
            gaps=GAPS_MS,
            steps=300,
            cands=("sync", "fastvec", "fastvec_fixed"),
        ),
        dict(
            case="Pong x8",
            env="pong",
            num_envs=8,
            gaps=(0.0, 2.0),
            steps=150,
            cands=("sync", "fastvec", "fastvec_fixed"),
        ),
    ],
    "policy": [
        dict(
            case="HalfCheetah-v5 x8, MLP 64x64",
            env="HalfCheetah-v5",
            num_envs=8,
            steps=600,
            cands=("sync", "fastvec", "fastvec_fixed", "fastvec_torch"),
        ),
        dict(
            case="Pong x8, Nature CNN",
            env="pong",
            num_envs=8,
            steps=150,
            cands=("sync", "fastvec", "fastvec_fixed", "fastvec_torch"),
        ),
    ],
    "sb3": [
        dict(
            case="SB3 PPO HalfCheetah-v5 x16",
            env="HalfCheetah-v5",
            num_envs=16,
            steps=16384,
            cands=("dummy", "sb3_subproc", "fastvec_sb3", "fastvec_sb3_fixed", "fastvec_sb3_torch"),
        ),
        dict(
            case="SB3 PPO HalfCheetah-v5 x8",
            env="HalfCheetah-v5",
            num_envs=8,
            steps=16384,
            cands=("dummy", "sb3_subproc", "fastvec_sb3", "fastvec_sb3_fixed", "fastvec_sb3_torch"),
        ),
    ],
    "cleanrl": [
        dict(
            case="CleanRL-style PPO Acrobot-v1 x8",
            env="Acrobot-v1",
            num_envs=8,
            steps=16384,
            cands=("sync", "fastvec", "fastvec_fixed", "fastvec_torch"),
        ),
        dict(
            case="CleanRL-style PPO CartPole-v1 x8",
            env="CartPole-v1",
            num_envs=8,
            steps=16384,
            cands=("sync", "fastvec", "fastvec_fixed", "fastvec_torch"),
        ),
    ],
    "train": [
        dict(case="fastvec train CartPole-v1", env="CartPole-v1", steps=50_000, cands=("sync", "engine")),
        dict(
            case="fastvec train InvertedPendulum-v5",
            env="InvertedPendulum-v5",
            steps=50_000,
            cands=("sync", "engine", "engine_spin"),
        ),
        dict(
            case="fastvec train HalfCheetah-v5 (100k steps)",
            env="HalfCheetah-v5",
            steps=102_400,
            cands=("sync", "engine", "engine_spin", "sync_autograd", "engine_autograd"),
        ),
        dict(case="fastvec train Acrobot-v1", env="Acrobot-v1", steps=65_536, cands=("sync", "engine")),
        dict(
            case="fastvec train Pong (16k steps)",
            env="ALE/Pong-v5",
            steps=16_384,
            cands=("sync", "engine", "engine_lockstep"),
        ),
    ],
}
LOOPS = tuple(CASES)
BASELINE = {"gap": "sync", "policy": "sync", "sb3": "dummy", "cleanrl": "sync", "train": "sync"}
LABELS = {
    "sync": "gymnasium SyncVectorEnv",
    "fastvec": "fastvec.AsyncVectorEnv",
    "fastvec_fixed": "fastvec.AsyncVectorEnv, fixed spins 200/20 us",
    "dummy": "SB3 DummyVecEnv",
    "sb3_subproc": "SB3 SubprocVecEnv",
    "fastvec_sb3": "fastvec.SubprocVecEnv",
    "fastvec_sb3_fixed": "fastvec.SubprocVecEnv, fixed spins 200/20 us",
    "engine": "fastvec engine",
    "engine_spin": "fastvec engine, spinning through the step",
    "engine_lockstep": "fastvec engine, lock-step (env_groups=1)",
    "sync_autograd": "gymnasium SyncVectorEnv, autograd learner",
    "engine_autograd": "fastvec engine, autograd learner",
    "fastvec_torch": "fastvec.AsyncVectorEnv, torch_threads=None",
    "fastvec_sb3_torch": "fastvec.SubprocVecEnv, torch_threads=None",
}


# ------------------------------------------------------------------ in the parent
def _cpu_ticks():
    """(steal, total) ticks of all CPUs since boot, from Linux's /proc/stat; None elsewhere.
    Steal is the time the hypervisor ran other guests while this VM wanted the CPU: a
    multi-process candidate loses more to it than a serial one, so each run records it."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (ticks[7] if len(ticks) > 7 else 0), sum(ticks[:8])


def run_child(spec: dict, timeout: float, fastvec_root: str | None = None) -> dict:
    """One measurement in a fresh process importing the fastvec in ``fastvec_root``
    (default: this process's); its JSON result, or ``{"error": ...}``."""
    cmd = [sys.executable, "-m", "harness.loop_children", json.dumps(spec)]
    t0 = _cpu_ticks()
    cpu0, wall0 = children_cpu_seconds(), time.perf_counter()
    try:
        env = child_env(fastvec_root)
        with tempfile.TemporaryDirectory(prefix="fastvec-loop-") as cwd:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None, text=True, cwd=cwd, env=env)
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                pids = _dump_stacks(proc.pid)
                # The child alone: its workers exit when it is gone, and its resource
                # tracker then frees the segment it left.
                proc.kill()
                proc.communicate()
                return {
                    "error": f"timed out after {timeout:g} s (Python stacks of processes {pids} "
                    f"in the run's worker-output.log)"
                }
    except OSError as exc:
        return {"error": f"could not start: {exc}"}
    res = last_json(out)
    if proc.returncode != 0 or res is None:
        return {"error": f"exit code {proc.returncode}"}
    res["cpu_s"] = children_cpu_seconds() - cpu0  # the child's and its waited-for descendants' CPU time
    res["process_wall_s"] = time.perf_counter() - wall0
    t1 = _cpu_ticks()
    if t0 and t1 and t1[1] > t0[1]:
        res["steal"] = (t1[0] - t0[0]) / (t1[1] - t0[1])
    return res


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (Linux's /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def _signal(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _dump_stacks(pid: int) -> list[int]:
    """A child that ran past its time: have it and its workers (forked: they keep its
    ``faulthandler`` registration) print their Python stacks to stderr, so that a hang
    says where it was. Returns the pids."""
    if not hasattr(signal, "SIGUSR1"):
        return [pid]
    # Only the child and its forks: another process below it (multiprocessing's
    # resource tracker, which frees the segment once the child is gone) would die of
    # the signal. One at a time, so that the stacks do not interleave.
    pids = [p for p in _descendants(pid) if _cmdline(p) == _cmdline(pid)]
    for p in pids:
        _signal(p, signal.SIGUSR1)
        time.sleep(0.5)
    return pids


def _cmdline(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def _lost_wakeups(res: dict) -> int:
    """The sleeps of a child's run that no doorbell ended (its waits, or the trainer's)."""
    waits = [res.get("waits")] + [g.get("waits") for g in (res.get("gaps") or {}).values()]
    return int(res.get("lost_wakeups") or 0) + sum(int(w.get("lost", 0)) for w in waits if w)


def _metric(loop: str, res: dict) -> dict:
    """Higher is better for every figure kept: steps/s, or 1e6/us for step times."""
    if loop == "gap":
        return {f"{ms} ms": 1e6 / v["step_us"] for ms, v in res["gaps"].items()} | {
            f"{ms} ms iter": 1e6 / v["iter_us"] for ms, v in res["gaps"].items()
        }
    return {"sps": res["sps"]}


def spec_for(loop: str, case: dict, cand: str, round_: int = 0) -> dict:
    """What one child runs: the case's settings, the loop, the candidate, the round."""
    spec = {k: v for k, v in case.items() if k not in ("cands", "case")}
    spec.update(loop=loop, cand=cand, round=round_)
    return spec


def selected(loops, cases=()) -> list[tuple[str, dict]]:
    """(loop, case) of ``loops``, only the cases whose name contains one of ``cases``."""
    return [
        (loop, case) for loop in loops for case in CASES[loop] if not cases or any(w in case["case"] for w in cases)
    ]


def run_loops(
    loops=LOOPS, repeats: int = 3, progress=None, notes: list | None = None, timeout: float = 900.0, cases=()
) -> list[dict]:
    """Every case of ``loops`` (or those ``cases`` select), candidates interleaved over
    ``repeats`` rounds."""
    notes = notes if notes is not None else []
    say = progress or (lambda desc, n: None)
    out = []
    for loop, case in selected(loops, cases):
        cands = list(case["cands"])
        runs = {c: [] for c in cands}
        for r in range(repeats):
            for c in cands[r % len(cands) :] + cands[: r % len(cands)]:
                say(f"{loop}: {case['case']} {c}", 0)
                res = run_child(spec_for(loop, case, c, r), timeout)
                runs[c].append(res)
                if "error" in res:
                    notes.append(f"{loop} / {case['case']} / {c} round {r}: {res['error']}")
                elif _lost_wakeups(res):
                    notes.append(
                        f"{loop} / {case['case']} / {c} round {r}: {_lost_wakeups(res)} sleeps "
                        f"ended by the 100 ms look at the flags, not by a doorbell (lost wake-ups)"
                    )
                say("", 1)
        out.append(summarize(loop, case, runs))
    return out


def summarize(loop: str, case: dict, runs: dict) -> dict:
    base = BASELINE[loop]
    rows = []
    for c, results in runs.items():
        per = {}
        for r, res in enumerate(results):
            if "error" in res:
                continue
            b = runs[base][r] if r < len(runs[base]) else {"error": "missing"}
            mine = _metric(loop, res)
            theirs = _metric(loop, b) if "error" not in b else {}
            for key, v in mine.items():
                per.setdefault(key, {"values": [], "ratios": []})["values"].append(v)
                if key in theirs:
                    per[key]["ratios"].append(v / theirs[key])
        stats = {}
        for key, d in per.items():
            vals, rats = np.asarray(d["values"]), np.asarray(d["ratios"])
            stats[key] = {
                "median": float(np.median(vals)),
                "min": float(vals.min()),
                "max": float(vals.max()),
                "ratio": float(np.median(rats)) if rats.size else None,
                "ratio_min": float(rats.min()) if rats.size else None,
                "ratio_max": float(rats.max()) if rats.size else None,
            }
        rows.append(
            {
                "candidate": c,
                "label": LABELS[c],
                "runs": results,
                "stats": stats,
                "errors": [res["error"] for res in results if "error" in res],
                "waits": _median_waits(loop, results),
            }
        )
    return {"loop": loop, "case": case["case"], "baseline": base, "candidates": rows}


def _steal_line(case: dict) -> str:
    """The CPU steal over the case's runs: its median, and its largest, with whose run."""
    seen = [
        (res["steal"], row["label"], r)
        for row in case["candidates"]
        for r, res in enumerate(row["runs"])
        if res.get("steal") is not None
    ]
    if not seen:
        return ""
    top = max(seen)
    return (
        f"\nCPU steal during the runs (the hypervisor's time for other guests): median "
        f"{100 * float(np.median([s for s, _, _ in seen])):.1f}%, at most {100 * top[0]:.1f}% "
        f"({top[1]}, round {top[2] + 1})."
    )


WAIT_KEYS = ("parent_naps", "parent_sleeps", "worker_naps", "worker_sleeps")


def _median_waits(loop: str, results: list):
    """The median over rounds of fastvec's waits per step (``_waits_per_step``); for the
    gap loop per gap; None for candidates that are not fastvec."""
    ok = [res for res in results if "error" not in res]

    def med(ws):
        ws = [w for w in ws if w]
        return {k: float(np.median([w[k] for w in ws])) for k in WAIT_KEYS} if ws else None

    if loop == "gap":
        gaps = {g: med([res["gaps"][g].get("waits") for res in ok]) for g in (ok[0]["gaps"] if ok else {})}
        return gaps if any(gaps.values()) else None
    return med([res.get("waits") for res in ok])


def _waits_cell(w) -> str:
    """parent sleeps; worker naps, sleeps (per step)."""
    if not w:
        return ""
    return f"{w['parent_sleeps']:.2f}; {w['worker_naps']:.2f}, {w['worker_sleeps']:.2f}"


def render_markdown(cases: list[dict]) -> str:
    """The real-loop tables: one row per candidate, ratios against the round's baseline."""
    lines = []
    for case in cases:
        lines += ["", f"#### {case['case']} ({case['loop']})", ""]
        keys = [k for k in case["candidates"][0]["stats"]] if case["candidates"][0]["stats"] else []
        if case["loop"] == "gap":
            gaps = [k for k in keys if not k.endswith("iter")]
            lines.append(
                "| candidate | "
                + " | ".join(f"step after {k} gap (us)" for k in gaps)
                + " | whole iteration at the longest gap (us) |"
            )
            lines.append("|---|" + "---:|" * (len(gaps) + 1))
            for row in case["candidates"]:
                s = row["stats"]
                cells = [_gap_cell(s.get(k)) for k in gaps] + [_gap_cell(s.get(gaps[-1] + " iter")) if gaps else ""]
                lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
            for row in case["candidates"]:
                if row.get("waits"):
                    per = "; ".join(f"after {g} ms ({_waits_cell(w)})" for g, w in row["waits"].items() if w)
                    lines.append(f"\nWaits per step of {row['label']} (parent sleeps; worker naps, sleeps): {per}.")
        else:
            unit = "env steps/s"
            waits = any(row.get("waits") for row in case["candidates"])
            head = " waits per step: parent sleeps; worker naps, sleeps |" if waits else ""
            lines.append(f"| candidate | {unit} (median, range) | ratio to {LABELS[case['baseline']]} (range) |{head}")
            lines.append("|---|---:|---:|" + ("---:|" if waits else ""))
            for row in case["candidates"]:
                s = row["stats"].get("sps")
                tail = f" {_waits_cell(row.get('waits'))} |" if waits else ""
                if s is None:
                    lines.append(f"| {row['label']} | failed: {'; '.join(row['errors'])} | |{tail}")
                    continue
                lines.append(
                    f"| {row['label']} | {s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f}) | {_ratio(s)} |{tail}"
                )
        if steal := _steal_line(case):
            lines.append(steal)
    return "\n".join(lines) + "\n"


def _ratio(s: dict) -> str:
    if s.get("ratio") is None:
        return "n/a"
    return f"**{s['ratio']:.2f}x** ({s['ratio_min']:.2f}-{s['ratio_max']:.2f})"


def _gap_cell(s) -> str:
    if s is None:
        return "failed"
    us = 1e6 / s["median"]
    return f"{us:,.0f} ({_ratio(s)})"


def render_chart(cases: list, path: str) -> bool:
    """``path``: one bar per (case, candidate), the median ratio to the round's serial
    baseline; False when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    labels, med, lo, hi = [], [], [], []
    for case in cases:
        for c in case["candidates"]:
            if c["candidate"] == case["baseline"]:
                continue
            for key, s in c["stats"].items():
                if key.endswith("iter") or s.get("ratio") is None:
                    continue
                name = case["case"] + ("" if key == "sps" else f", step after {key}")
                labels.append(f"{name}: {c['label']}")
                med.append(s["ratio"])
                lo.append(s["ratio"] - s["ratio_min"])
                hi.append(s["ratio_max"] - s["ratio"])
    if not labels:
        return False
    fig, ax = plt.subplots(figsize=(10, 1 + 0.28 * len(labels)))
    y = np.arange(len(labels))[::-1]
    ax.barh(y, med, xerr=[lo, hi], color=["tab:green" if m >= 1 else "tab:red" for m in med], capsize=2)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xlabel("ratio to the serial vector env in the same round (median, min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
