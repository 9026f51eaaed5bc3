#!/usr/bin/env python
"""Data-parallel training on this machine: N ranks against one, and the all-reduce's cost.

    python benchmarks/bench_ranks.py --out benchmarks/results/ranks

1. **Learning**: ``fastvec train HalfCheetah-v5 --total-steps 300000 --seed S`` as one
   rank of 8 envs and as ``--nproc 2`` (two ranks of 4 envs: the same run cut in two),
   seeds 1-3, each a fresh process as a user runs it (torch's defaults), the two
   alternating first from seed to seed. Per run: wall time, steps/s, the final mean
   return, and for the ranks each one's share of the wall time in collectives (the
   all-reduce itself and the wait for the other rank's envs and update).
2. **The all-reduce alone**: two gloo processes on 127.0.0.1 sum a float32 tensor of
   each preset policy's size (``fastvec train``'s flat gradient), of 5 floats, and of
   HalfCheetah's gradient with the 5 floats of a minibatch's statistics (what a rank sums
   per minibatch), both ready (a barrier first), median of 200 after 20 warm-ups. With
   the runs' counts of minibatches this compares the all-reduce alone with the time the
   ranks spent in collectives during the run.

Writes ``ranks.json`` and ``ranks.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import tempfile
import threading
import time

from harness.cli_runs import train_command
from harness.common import cpu_model, write_results
from harness.processes import child_env, last_json

# The presets' policies (fastvec train's "policy" field): parameters of the flat gradient.
MODEL_SIZES = {
    "CartPole-v1 (mlp 64x64)": 9_155,
    "HalfCheetah-v5 (mlp 64x64)": 11_085,
    "ALE/Pong-v5 (Nature CNN)": 1_687_719,
}


def train(seed: int, nproc: int, steps: int, tmp: str) -> dict:
    run = os.path.join(tmp, f"hc-{nproc}-{seed}")
    ranks = ["--nproc", str(nproc)] if nproc > 1 else []
    cmd = train_command("HalfCheetah-v5", seed, total_steps=steps, extra_args=ranks, logdir=run, checkpoint_every=0)
    t0 = time.perf_counter()
    # Popen, not run_train: the sampler reads the process tree's CPU while it runs
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp, env=child_env())
    cpu = CpuSampler(proc.pid, ranks_are_children=nproc > 1)
    cpu.start()
    out, err = proc.communicate()
    cpu.stop()
    res = last_json(out)
    if proc.returncode or res is None:
        raise SystemExit(f"run failed: {cmd[3:]}\n{err[-2000:]}")
    res["process_wall_s"] = time.perf_counter() - t0
    res["cpu"] = cpu.by_role()
    return res


# Thread names torch's gloo process group gives its threads (the TCP transport's event loop
# and the process group's work queue).
GLOO_THREADS = ("gloo_tcp_loop", "pt_gloo_runloop")


class CpuSampler(threading.Thread):
    """CPU seconds and voluntary context switches of every thread of a run's process tree,
    read from /proc every 0.1 s (each thread's last reading counts: a thread that ends
    between two readings loses at most 0.1 s), summed by role: the ranks' main threads,
    their gloo threads, their other threads, the env workers, the launcher."""

    def __init__(self, root: int, ranks_are_children: bool):
        super().__init__(daemon=True)
        self.root, self.ranks_are_children = root, ranks_are_children
        self.last: dict = {}
        self._done = threading.Event()
        self._hz = os.sysconf("SC_CLK_TCK")

    def run(self) -> None:
        while not self._done.wait(0.1):
            self._read()

    def stop(self) -> None:
        self._done.set()
        self.join()

    def _children(self, pid: int) -> list[int]:
        kids: list[int] = []
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids += [int(k) for k in f.read().split()]
        except OSError:
            pass
        return kids

    def _read(self) -> None:
        ranks = self._children(self.root) if self.ranks_are_children else [self.root]
        procs = [(pid, "rank") for pid in ranks] + [(w, "env workers") for r in ranks for w in self._children(r)]
        if self.ranks_are_children:
            procs.append((self.root, "launcher"))
        for pid, role in procs:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/stat") as f:
                        stat = f.read()
                    with open(f"/proc/{pid}/task/{tid}/status") as f:
                        status = f.read()
                except OSError:
                    continue
                name = stat[stat.index("(") + 1 : stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2 :].split()
                seconds = (int(fields[11]) + int(fields[12])) / self._hz
                switches = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
                self.last[(pid, tid)] = (self._role(role, pid, tid, name), seconds, switches)

    @staticmethod
    def _role(role: str, pid: int, tid: str, name: str) -> str:
        if role != "rank":
            return role
        if name in GLOO_THREADS:
            return "ranks' gloo threads"
        return "ranks' main threads" if str(pid) == tid else "ranks' other threads"

    def by_role(self) -> dict:
        out: dict = {}
        for role, seconds, switches in self.last.values():
            s, c = out.get(role, (0.0, 0))
            out[role] = (s + seconds, c + switches)
        return {role: {"cpu_s": round(s, 2), "switches": c} for role, (s, c) in sorted(out.items())}


def _allreduce_child(rank: int, port: int, sizes: list[int], reps: int, q) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out = {}
    for n in sizes:
        t = torch.ones(n)
        times = []
        for i in range(reps + 20):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if i >= 20:
                times.append(time.perf_counter() - t0)
        out[n] = statistics.median(times)
    dist.destroy_process_group()
    if rank == 0:
        q.put(out)


def allreduce_times(sizes: list[int], reps: int = 200) -> dict[int, float]:
    import multiprocessing as mp
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_allreduce_child, args=(r, port, sizes, reps, q)) for r in range(2)]
    for p in procs:
        p.start()
    out = q.get(timeout=600)
    for p in procs:
        p.join(60)
    return out


def med(xs):
    return statistics.median(xs), min(xs), max(xs)


def report(runs: dict, ar: dict, args, wall: float) -> str:
    cpu = cpu_model()
    lines = [
        f"# Data-parallel ranks on this machine ({wall:.0f} s)",
        "",
        f"`python benchmarks/bench_ranks.py --out {args.out}`; {cpu}, {os.cpu_count()} cores, "
        f"{platform.system()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. HalfCheetah-v5, "
        f"{args.steps:,} steps, seeds {', '.join(map(str, args.seeds))}, one fresh process per run, the "
        "two alternating first; medians over seeds, min-max in brackets.",
        "",
        "| run | wall s | steps/s | final return | collectives' share of wall (per rank) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, rs in runs.items():
        w, sps, ret = (med([r[k] for r in rs]) for k in ("wall_seconds", "sps", "final_mean_return"))
        share = (
            ""
            if "ranks" not in rs[0]
            else "{:.0%} ({:.0%}-{:.0%})".format(*med([s for r in rs for s in r["ranks"]["reduce_share"]]))
        )
        lines.append(
            f"| {name} | {w[0]:.1f} ({w[1]:.1f}-{w[2]:.1f}) | {sps[0]:,.0f} ({sps[1]:,.0f}-{sps[2]:,.0f}) | "
            f"{ret[0]:,.0f} ({ret[1]:,.0f}-{ret[2]:,.0f}) | {share} |"
        )
    one, two = (statistics.median(r["wall_seconds"] for r in rs) for rs in runs.values())
    lines += ["", f"Overhead of 2 ranks against 1 (median wall times): {two / one - 1:+.1%}.", ""]
    lines += ["| all-reduce, 2 gloo processes, both ready | float32 values | median us |", "|---|---:|---:|"]
    hc = MODEL_SIZES["HalfCheetah-v5 (mlp 64x64)"]
    for label, n in [*MODEL_SIZES.items(), ("5 floats", 5), ("HalfCheetah's gradient and 5 statistics", hc + 5)]:
        lines.append(f"| {label} | {n:,} | {ar[n] * 1e6:,.0f} |")
    r2 = runs["2 ranks x 4 envs"][0]
    per_update = r2["grad_steps"] / max(r2["updates"], 1)
    cost = r2["grad_steps"] * ar[MODEL_SIZES["HalfCheetah-v5 (mlp 64x64)"] + 5]
    in_run = statistics.median(
        s * r["wall_seconds"] for r in runs["2 ranks x 4 envs"] for s in r["ranks"]["reduce_share"]
    )
    lines += [
        "",
        f"A 2-rank run makes {r2['grad_steps']:,} minibatch steps ({per_update:.0f} an update), each one all-reduce "
        f"of the gradient and its statistics: {cost:.1f} s at the rate above (both ranks ready), against "
        f"{in_run:.1f} s each rank spent in collectives during the run and the {two - one:+.1f} s the 2-rank run "
        "took over the 1-rank one.",
    ]
    lines += ["", *cpu_table(runs, r2["grad_steps"])]
    return "\n".join(lines) + "\n"


def cpu_table(runs: dict, all_reduces: int) -> list[str]:
    """CPU seconds by role, summed over the run's processes (medians over seeds), and what
    the ranks' gloo threads cost per all-reduce."""
    roles = sorted({role for rs in runs.values() for r in rs for role in r["cpu"]})
    names = list(runs)
    lines = [
        "CPU seconds by role, all processes of a run (medians over seeds; voluntary context switches in brackets):",
        "",
        "| role | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for role in [*roles, "all"]:
        cells = []
        for rs in runs.values():
            got = [[x for x in (r["cpu"].values() if role == "all" else [r["cpu"].get(role)]) if x] for r in rs]
            s = statistics.median(sum(x["cpu_s"] for x in g) for g in got)
            c = statistics.median(sum(x["switches"] for x in g) for g in got)
            cells.append(f"{s:.1f} ({c:,.0f})" if any(got) else "")
        lines.append(f"| {role} | " + " | ".join(cells) + " |")
    gloo = [r["cpu"].get("ranks' gloo threads") for r in runs["2 ranks x 4 envs"]]
    s = statistics.median(g["cpu_s"] for g in gloo)
    c = statistics.median(g["switches"] for g in gloo)
    lines += [
        "",
        f"Per all-reduce, both ranks together: {s / all_reduces * 1e6:,.0f} us of CPU and {c / all_reduces:.1f} "
        "voluntary context switches in the gloo threads alone (each a sleeping thread woken), on a machine whose "
        "two cores the one-rank run already keeps busy.",
    ]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=300_000)
    args = ap.parse_args()
    t0 = time.perf_counter()
    runs: dict[str, list] = {"1 rank x 8 envs": [], "2 ranks x 4 envs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i, seed in enumerate(args.seeds):
            order = [1, 2] if i % 2 == 0 else [2, 1]
            for nproc in order:
                res = train(seed, nproc, args.steps, tmp)
                runs["1 rank x 8 envs" if nproc == 1 else "2 ranks x 4 envs"].append(res)
                print(
                    f"seed {seed} nproc {nproc}: {res['wall_seconds']:.1f} s, return {res['final_mean_return']}",
                    flush=True,
                )
    ar = allreduce_times([*MODEL_SIZES.values(), 5, MODEL_SIZES["HalfCheetah-v5 (mlp 64x64)"] + 5])
    wall = time.perf_counter() - t0
    data = {"runs": runs, "allreduce_s": {str(k): v for k, v in ar.items()}, "seeds": args.seeds}
    write_results(args.out, report(runs, ar, args, wall), data, stem="ranks")


if __name__ == "__main__":
    main()
