#!/usr/bin/env python
"""Soak benchmark: long runs of fastvec leak nothing.

Two parts, each sampled every ``--interval`` seconds (wall clock):

* ``engine``: ``--engine-steps`` env steps (default 10M) of CartPole-v1 through
  ``fastvec.AsyncVectorEnv`` with ``--num-envs`` envs (default 16) and random actions
  drawn before the loop and cycled, so the loop itself allocates nothing per step.
* ``train``: ``python -m fastvec train CartPole-v1 --total-steps --train-steps`` as a
  subprocess (default 2M env steps); env steps read from the run's ``metrics.jsonl``.

Each sample records the RSS and open fds of the main process (this script, or the
trainer) and of its worker processes (summed), plus the files in ``/dev/shm``: all of
them, and those mapped by the processes of the run. The analysis drops a warm-up
(the first 10% of env steps or the first 2 samples, whichever drops more), fits
RSS against env steps by least squares and checks fds and shared-memory segments for
growth; after the vector env is closed / the trainer exits, no segment of the run may
remain and ``/dev/shm`` must hold no more files than before.

    python benchmarks/soak.py --out benchmarks/results/soak
    python benchmarks/soak.py --engine-steps 2e5 --train-steps 1e5 --out /tmp/soak-small

Writes ``soak.md``, ``soak.json`` and ``soak_rss.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil
from harness.cli_runs import train_command
from harness.processes import child_env, last_json
from harness.soak_report import MIB, analyse, machine_info, plot, write_markdown

SHM_DIR = "/dev/shm"
FIELDS = (
    "env_steps",
    "t",
    "parent_rss",
    "workers_rss_sum",
    "parent_fds",
    "worker_fds_sum",
    "shm_files",
    "shm_bytes",
    "run_shm_files",
    "num_workers",
)


# ----------------------------------------------------------------------- sampling
def _steps_arg(text: str) -> int:
    try:
        value = float(str(text).replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of steps: {text!r}") from None
    if value < 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"steps must be a non-negative whole number, got {text!r}")
    return int(value)


def shm_listing() -> dict[str, int]:
    """Every file in /dev/shm with its size in bytes."""
    out = {}
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return out
    for name in names:
        try:
            st = os.stat(os.path.join(SHM_DIR, name))
        except OSError:  # unlinked between listdir and stat
            continue
        out[name] = st.st_size
    return out


def mapped_shm(pid: int) -> set[str]:
    """Names of the /dev/shm files that process ``pid`` has mapped or open."""
    names = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                i = line.find(SHM_DIR + "/")
                if i >= 0:
                    names.add(line[i + len(SHM_DIR) + 1 :].split()[0])
    except OSError:
        pass
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(SHM_DIR + "/"):
                names.add(target[len(SHM_DIR) + 1 :].split()[0])
    except OSError:
        pass
    return names


def _is_helper(proc: psutil.Process) -> bool:
    """multiprocessing's resource tracker (or forkserver): not an env worker."""
    try:
        cmd = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return "resource_tracker" in cmd or "forkserver" in cmd


class Sampler:
    """Samples one process tree: ``main`` and its descendants (workers; helpers such as
    the resource tracker are listed apart and left out of the worker sums)."""

    def __init__(self, main_pid: int):
        self.main = psutil.Process(main_pid)
        self.t0 = time.perf_counter()
        self.samples: list[dict] = []
        self.seen_shm: set[str] = set()
        self.seen_workers: set[int] = set()
        self.seen_helpers: set[int] = set()
        self._helper_cache: dict[int, bool] = {}

    def _classify(self, proc: psutil.Process) -> bool:
        key = proc.pid
        if key not in self._helper_cache:
            self._helper_cache[key] = _is_helper(proc)
        return self._helper_cache[key]

    def sample(self, env_steps: int) -> dict | None:
        try:
            parent_rss = self.main.memory_info().rss
            parent_fds = self.main.num_fds()
            kids = self.main.children(recursive=True)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return None
        shm_names = mapped_shm(self.main.pid)
        w_rss = w_fds = n_workers = 0
        for kid in kids:
            try:
                helper = self._classify(kid)
                if not helper:
                    rss, fds = kid.memory_info().rss, kid.num_fds()
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
            shm_names |= mapped_shm(kid.pid)
            if helper:
                self.seen_helpers.add(kid.pid)
                continue
            self.seen_workers.add(kid.pid)
            w_rss += rss
            w_fds += fds
            n_workers += 1
        listing = shm_listing()
        run_shm = {n for n in shm_names if n in listing} if shm_names else set()
        self.seen_shm |= shm_names
        row = {
            "env_steps": int(env_steps),
            "t": round(time.perf_counter() - self.t0, 3),
            "parent_rss": int(parent_rss),
            "workers_rss_sum": int(w_rss),
            "parent_fds": int(parent_fds),
            "worker_fds_sum": int(w_fds),
            "shm_files": len(listing),
            "shm_bytes": int(sum(listing.values())),
            "run_shm_files": len(run_shm),
            "num_workers": n_workers,
        }
        self.samples.append(row)
        return row


def pids_alive(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def shm_holders(names) -> dict[str, list[str]]:
    """For each /dev/shm file name, the live processes that map or hold it open
    ("pid: command"): on a shared machine other programs use /dev/shm too."""
    names = set(names)
    found: dict[str, list[str]] = {n: [] for n in names}
    if not names:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        held = mapped_shm(int(entry)) & names
        if not held:
            continue
        try:
            cmd = " ".join(" ".join(psutil.Process(int(entry)).cmdline()).split())[:120]
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            cmd = "?"
        for n in held:
            found[n].append(f"{entry}: {cmd}")
    return found


def end_state(before: dict[str, int], seen_shm: set[str], pids, wait_s: float = 0.0) -> dict:
    """/dev/shm and the run's processes after the run: the files new since before it,
    split into the run's own segments, files other live processes hold (not the run's:
    another program on the machine), and files nobody holds that the run never mapped
    (can't be attributed, so they count against the run)."""
    if wait_s:
        time.sleep(wait_s)
    after = shm_listing()
    new = sorted(set(after) - set(before))
    holders = shm_holders(n for n in new if n not in seen_shm)
    me = f"{os.getpid()}: "
    foreign = {n: h for n, h in holders.items() if h and not any(x.startswith(me) for x in h)}
    return {
        "new_shm_files_of_others": foreign,
        "new_shm_files_unattributed": sorted(n for n in new if n not in seen_shm and n not in foreign),
        "shm_files_before": len(before),
        "shm_files_after": len(after),
        "shm_bytes_before": int(sum(before.values())),
        "shm_bytes_after": int(sum(after.values())),
        "new_shm_files": sorted(set(after) - set(before)),
        "run_segments_seen": sorted(seen_shm),
        "run_segments_left": sorted(n for n in seen_shm if n in after),
        "processes_left": pids_alive(pids),
    }


# ----------------------------------------------------------------------- parts
def run_engine(total_steps: int, num_envs: int, interval: float, seed: int = 0) -> dict:
    import gymnasium

    import fastvec

    shm_before = shm_listing()
    t_build = time.perf_counter()
    venv = fastvec.AsyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * num_envs)
    sampler = Sampler(os.getpid())
    worker_pids = list(venv.engine.worker_pids)
    num_calls = -(-total_steps // num_envs)
    block = np.random.default_rng(seed).integers(0, 2, size=(10_000, num_envs), dtype=np.int64)
    check_every = 256
    closed = False
    try:
        venv.reset(seed=seed)
        build_s = time.perf_counter() - t_build
        sampler.sample(0)
        t_start = time.perf_counter()
        next_sample = t_start + interval
        nb = len(block)
        step = venv.step
        print(
            f"[engine] {num_calls:,} step() calls x {num_envs} envs, "
            f"{venv.engine.num_workers} workers (pids {worker_pids})",
            flush=True,
        )
        for i in range(num_calls):
            step(block[i % nb])
            if i % check_every == 0:
                now = time.perf_counter()
                if now >= next_sample:
                    row = sampler.sample((i + 1) * num_envs)
                    next_sample = now + interval
                    if len(sampler.samples) % 15 == 0:
                        _progress("engine", row, total_steps)
        wall = time.perf_counter() - t_start
        sampler.sample(num_calls * num_envs)
        _progress("engine", sampler.samples[-1], total_steps)
        venv.close()
        closed = True
    finally:
        if not closed:
            venv.close()
    end = end_state(shm_before, sampler.seen_shm, sampler.seen_workers | set(worker_pids))
    later = end_state(shm_before, sampler.seen_shm, sampler.seen_workers | set(worker_pids), wait_s=2.0)
    return {
        "part": "engine",
        "total_steps": num_calls * num_envs,
        "num_envs": num_envs,
        "num_workers": len(worker_pids),
        "wall_s": round(wall, 2),
        "build_s": round(build_s, 2),
        "env_steps_per_s": round(num_calls * num_envs / wall, 1),
        "samples": sampler.samples,
        "helpers": sorted(sampler.seen_helpers),
        "end": end,
        "end_after_2s": later,
        "command": None,
    }


def _last_env_steps(path: str) -> int | None:
    """``env_steps`` of the last complete line of a growing metrics.jsonl."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        line = line.strip()
        if not line:
            continue
        try:
            return int(json.loads(line)["env_steps"])
        except (ValueError, KeyError, TypeError):
            continue  # a partial line being written, or the cut first line
    return None


def _sample_trainer(proc, sampler: Sampler, metrics: str, total_steps: int, interval: float, t_start: float) -> None:
    """Sample the trainer every ``interval`` s until it exits. Env steps come from its
    metrics.jsonl; between its lines (or before the first) they are estimated from the
    last rate seen, and such samples are marked ``steps_estimated``."""
    estimated = 0
    last_known = (0.0, 0)  # (t, env_steps) of the last metrics line
    rate = None
    while proc.poll() is None:
        now = time.perf_counter() - t_start
        steps = _last_env_steps(metrics)
        if steps is not None:
            if steps > last_known[1] and last_known[1] > 0:
                rate = (steps - last_known[1]) / max(1e-9, now - last_known[0])
            if steps != last_known[1]:
                last_known = (now, steps)
            env_steps, estimated = steps, 0
        elif rate is not None:  # absent: estimate from time
            env_steps, estimated = int(last_known[1] + rate * (now - last_known[0])), 1
        else:
            env_steps, estimated = 0, 1
        row = sampler.sample(env_steps)
        if row is not None:
            row["steps_estimated"] = estimated
            if len(sampler.samples) % 15 == 0:
                _progress("train", row, total_steps)
        deadline = time.perf_counter() + interval
        while proc.poll() is None and time.perf_counter() < deadline:
            time.sleep(0.05)


def run_train(total_steps: int, interval: float) -> dict:
    shm_before = shm_listing()
    logdir = tempfile.mkdtemp(prefix="fastvec-soak-train-")
    cmd = train_command("CartPole-v1", total_steps=total_steps, logdir=logdir)
    metrics = os.path.join(logdir, "metrics.jsonl")
    log_path = os.path.join(logdir, "trainer-output.log")
    print(f"[train] {shlex.join(cmd)}", flush=True)
    t_start = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=logdir, env=child_env())
        sampler = Sampler(proc.pid)
        try:
            _sample_trainer(proc, sampler, metrics, total_steps, interval, t_start)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    rc = proc.wait()
    wall = time.perf_counter() - t_start
    end = end_state(shm_before, sampler.seen_shm, sampler.seen_workers)
    later = end_state(shm_before, sampler.seen_shm, sampler.seen_workers, wait_s=2.0)
    with open(log_path, "rb") as f:
        output = f.read().decode("utf-8", "replace")
    summary = last_json(output)
    final_steps = summary.get("env_steps") if isinstance(summary, dict) else _last_env_steps(metrics)
    shutil.rmtree(logdir, ignore_errors=True)
    print(f"[train] exit {rc} after {wall:.1f} s; summary {summary}", flush=True)
    if rc != 0:
        print(output[-4000:], file=sys.stderr)
    return {
        "part": "train",
        "total_steps": int(final_steps or total_steps),
        "requested_steps": total_steps,
        "wall_s": round(wall, 2),
        "env_steps_per_s": round((final_steps or 0) / wall, 1) if wall else None,
        "returncode": rc,
        "trainer_summary": summary,
        "trainer_output_tail": output[-2000:],
        "samples": sampler.samples,
        "num_workers": max((s["num_workers"] for s in sampler.samples), default=0),
        "helpers": sorted(sampler.seen_helpers),
        "end": end,
        "end_after_2s": later,
        "command": shlex.join(["python", *cmd[1:-2]]) + " --logdir <tmpdir>",
    }


def _progress(part: str, row: dict | None, total: int) -> None:
    if row is None:
        return
    print(
        f"[{part}] {row['env_steps']:>11,} / {total:,} steps  t={row['t']:7.1f}s  "
        f"rss parent {row['parent_rss'] / MIB:7.1f} MB  workers {row['workers_rss_sum'] / MIB:7.1f} MB  "
        f"fds {row['parent_fds']}/{row['worker_fds_sum']}  shm {row['shm_files']} ({row['run_shm_files']} ours)",
        flush=True,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--engine-steps", type=_steps_arg, default=10_000_000, help="env steps of the engine part (1e7 accepted)"
    )
    ap.add_argument("--train-steps", type=_steps_arg, default=2_000_000, help="env steps of the train part")
    ap.add_argument("--num-envs", type=int, default=16, help="envs of the engine part")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between samples")
    ap.add_argument("--out", default=os.path.join("benchmarks", "results", "soak"))
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--skip-train", action="store_true")
    args = ap.parse_args(argv)
    if args.num_envs < 1:
        ap.error("--num-envs must be >= 1")
    if args.interval <= 0:
        ap.error("--interval must be > 0")
    if args.skip_engine and args.skip_train:
        ap.error("nothing to do: both parts skipped")

    command = shlex.join(["python", "benchmarks/soak.py", *(sys.argv[1:] if argv is None else argv)])
    started = _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    info = machine_info()
    parts = []
    if not args.skip_engine:
        parts.append(run_engine(args.engine_steps, args.num_envs, args.interval))
    if not args.skip_train:
        parts.append(run_train(args.train_steps, args.interval))
    wall = time.perf_counter() - t0
    load1 = os.getloadavg()[0]
    results = [r for part in parts for r in analyse(part)]

    with open(os.path.join(args.out, "soak.json"), "w") as f:
        json.dump(
            {
                "started": started,
                "command": command,
                "wall_s": round(wall, 1),
                "load_average": [load0, load1],
                "machine": info,
                "fields": FIELDS,
                "results": results,
                "parts": parts,
            },
            f,
            indent=1,
        )
    write_markdown(os.path.join(args.out, "soak.md"), info, parts, results, command, started, wall, (load0, load1))
    plot(parts, os.path.join(args.out, "soak_rss.png"))

    width = max(len(r["metric"]) for r in results)
    print()
    for r in results:
        print(
            f"{r['result']:<4}  {r['part']:<6} {r['process']:<14} {r['metric']:<{width}}  "
            f"{r['value']}  (goal {r['goal']})  {r['detail']}"
        )
    print(f"\nwall {wall:.0f} s; wrote {args.out}/soak.md, soak.json, soak_rss.png")
    return 0 if all(r["pass"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
