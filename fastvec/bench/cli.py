"""``fastvec bench``: env steps/s of fastvec against the usual vector envs, plus GAE.

    fastvec bench                         # full run (several minutes on 2 cores)
    fastvec bench --quick --out bench-out # seconds: CartPole 16 envs, tiny scaling and GAE
    fastvec bench --only cartpole16 pong8 --repeats 7 --no-peers sb3 envpool
    fastvec bench --only loops            # the real loops only (~15 min on 2 cores)

Writes ``OUT/results.md``, ``OUT/results.json``, ``OUT/ratios.png``, ``OUT/scaling.png``,
``OUT/latency.png`` and ``OUT/worker-output.log`` (what the envs' processes printed:
while measuring, stdout and stderr of this process and its children go there, and the
progress bar to the terminal).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import sys
import time

WORKLOADS = ("cartpole16", "cartpole64", "halfcheetah16", "pong8", "largeobs8")
# The real loops (fastvec.bench.loops): "loops" is all of them, "loop-gap" etc. one each.
LOOP_SECTIONS = ("loop-gap", "loop-policy", "loop-sb3", "loop-cleanrl", "loop-train")
SECTIONS = ("loops",) + LOOP_SECTIONS + WORKLOADS + ("scaling", "gae")
QUICK_DEFAULT = ("cartpole16", "scaling", "gae")

# Sizes of the parts, full and --quick.
FULL = dict(repeats=5, loop_repeats=3, scaling=dict(num_envs=(4, 8, 16, 32, 64), num_workers=(1, 2, 3, 4), repeats=3,
                                   env_steps=32000),
            gae=dict(T=2048, N=64, dtype="float32", repeats=7))
QUICK = dict(repeats=2, loop_repeats=1, steps=100, warmup=10,
             scaling=dict(num_envs=(4, 16), num_workers=(1, 2), repeats=1, env_steps=1600),
             gae=dict(T=256, N=16, dtype="float32", repeats=3))


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        raise UsageError(message)


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _nonneg(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    from .vecenv_bench import PEERS

    p = _Parser(
        prog="fastvec bench",
        description="Env steps/s of fastvec.AsyncVectorEnv / fastvec.SubprocVecEnv against gymnasium's "
                    "SyncVectorEnv and AsyncVectorEnv, SB3's SubprocVecEnv, the baselines one-Pipe-per-env "
                    "SubprocVecEnv and EnvPool, interleaved in rounds; plus a fastvec scaling sweep and the "
                    "GAE benchmark. Writes results.md, results.json and PNG charts.",
    )
    p.add_argument("--quick", action="store_true",
                   help="small run (seconds): CartPole 16 envs, 2 rounds of 100 steps, tiny scaling and GAE")
    p.add_argument("--out", default="bench-out", metavar="DIR", help="output directory (default: bench-out)")
    p.add_argument("--only", nargs="+", metavar="WORKLOAD",
                   help=f"run only these parts: {', '.join(SECTIONS)}")
    p.add_argument("--repeats", type=_positive, metavar="N",
                   help="rounds (each measures every candidate once; default 5, --quick 2); "
                        "also the scaling sweep's rounds when given")
    p.add_argument("--steps", type=_positive, metavar="N",
                   help="timed vector steps per measurement (default: per workload, 200-8000); the scaling "
                        "sweep then times about 16*N env steps per point")
    p.add_argument("--warmup", type=_nonneg, metavar="N", help="untimed steps before timing (default: ~10%% of steps)")
    p.add_argument("--no-peers", nargs="*", metavar="PEER", default=None,
                   help=f"skip these peers ({', '.join(PEERS)}); with no names, all of them "
                        "(SyncVectorEnv and fastvec always run)")
    p.add_argument("--fastvec-workers", type=_positive, metavar="N",
                   help="num_workers for fastvec (default: min(num_envs, cores))")
    p.add_argument("--seed", type=_nonneg, default=0, help="seed for env resets and actions (default 0)")
    p.add_argument("--train", action="store_true",
                   help="also run the PPO time-to-solve benchmark (needs fastvec[train])")
    p.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(name: str = "bench", argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = f"fastvec {name}"
    try:
        args = build_parser().parse_args(argv)
        plan = _plan(args)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return _run(args, plan, prog, argv)


def _plan(args) -> dict:
    from .vecenv_bench import PEERS

    if args.only:
        sections = []
        for s in args.only:
            key = s.lower()
            if key not in SECTIONS:
                raise UsageError(f"unknown workload {s!r} for --only (choose from {', '.join(SECTIONS)})")
            if key not in sections:
                sections.append(key)
    else:
        sections = list(QUICK_DEFAULT if args.quick else SECTIONS)
    if "loops" in sections:  # the group stands for its members
        at = sections.index("loops")
        sections[at:at + 1] = [s for s in LOOP_SECTIONS if s not in sections]
    if args.no_peers is None:
        skip = []
    elif not args.no_peers:
        skip = list(PEERS)
    else:
        skip = []
        for s in args.no_peers:
            if s.lower() not in PEERS:
                raise UsageError(f"unknown peer {s!r} for --no-peers (choose from {', '.join(PEERS)})")
            skip.append(s.lower())
    out = os.path.abspath(args.out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {args.out!r} exists and is not a directory")
    return {"sections": sections, "skip_peers": skip, "out": out}


@contextlib.contextmanager
def _capture_process_output(path: str):
    """Send fd 1 and 2 (so the envs' worker processes, which inherit them) to ``path``;
    yield a text stream on the original stderr for the progress bar."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        saved = (os.dup(1), os.dup(2))
    except OSError:  # no usable fds: leave output alone
        yield sys.stderr
        return
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    term = os.fdopen(os.dup(saved[1]), "w", buffering=1, errors="replace")
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield term
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)
        term.close()


class _Progress:
    """tqdm on the terminal's stderr; ``progress(desc, n)`` advances by n."""

    def __init__(self, total: int, stream, enabled: bool):
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, file=stream, unit="run", dynamic_ncols=True, leave=True,
                                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]")
            except ImportError:  # tqdm is optional: no bar
                self.bar = None

    def __call__(self, desc: str, n: int = 0) -> None:
        if self.bar is None:
            return
        if desc:
            self.bar.set_description_str(desc[:48], refresh=False)
        if n:
            self.bar.update(n)
        else:
            self.bar.refresh()

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist in ("fastvec", "numpy", "gymnasium", "stable-baselines3", "envpool", "ale-py", "mujoco", "torch"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _loadavg() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "n/a"


def _count(sections, cands, scfg) -> int:
    from .vecenv_bench import default_workloads

    wl = default_workloads()
    total = 0
    for s in sections:
        if s in wl:
            extra = [c for c in wl[s].extra_candidates if c not in cands]
            total += scfg["repeats_main"] * (len(cands) + len(extra))
    if "scaling" in sections:
        sc = scfg["scaling"]
        total += sc["repeats"] * sum(1 + sum(1 for k in sc["num_workers"] if k <= n) for n in sc["num_envs"])
    if "gae" in sections:
        total += 1
    if scfg["train"]:
        total += 1
    from .loops import CASES

    for s in sections:
        if s in LOOP_SECTIONS:
            total += scfg["repeats_loops"] * sum(len(c["cands"]) for c in CASES[s[len("loop-"):]])
    return total


def _run(args, plan, prog, argv) -> int:
    from . import report
    from .vecenv_bench import DEFAULT_CANDIDATES, CANDIDATES, default_workloads, run_scaling, run_vecenv_bench

    cfg = QUICK if args.quick else FULL
    repeats = args.repeats or cfg["repeats"]
    scaling_cfg = dict(cfg["scaling"])
    if args.repeats:
        scaling_cfg["repeats"] = args.repeats
    if args.steps:
        scaling_cfg["env_steps"] = 16 * args.steps
    steps = args.steps or cfg.get("steps")
    warmup = args.warmup if args.warmup is not None else (
        cfg.get("warmup") if args.steps is None else max(1, args.steps // 10))
    sections, out = plan["sections"], plan["out"]
    cands = [c for c in DEFAULT_CANDIDATES if CANDIDATES[c].peer not in plan["skip_peers"]]

    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        print(f"{prog}: error: cannot create --out {args.out!r}: {exc.strerror}", file=sys.stderr)
        return 2

    notes: list[str] = []
    if plan["skip_peers"]:
        notes.append("peers skipped by --no-peers: " + ", ".join(plan["skip_peers"]))
    results: dict = {
        "meta": {
            "command": " ".join([prog, shlex.join(argv)]).strip(),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "cores": _cores(), "cpu": _cpu_model(), "platform": platform.platform(),
            "loadavg_start": _loadavg(), "versions": _versions(), "quick": bool(args.quick),
            "repeats": repeats, "steps": steps, "warmup": warmup, "fastvec_workers": args.fastvec_workers,
            "seed": args.seed, "sections": sections, "candidates": cands,
        },
        "notes": notes,
    }
    t_start = time.perf_counter()
    loop_repeats = args.repeats or cfg["loop_repeats"]
    total = _count(sections, cands, {"repeats_main": repeats, "scaling": scaling_cfg, "train": args.train,
                                     "repeats_loops": loop_repeats})
    failed = False
    log_path = os.path.join(out, "worker-output.log")
    with open(log_path, "w"):
        pass
    interrupted = False
    with _capture_process_output(log_path) as term:
        bar = _Progress(total, term, not args.no_progress)
        try:
            loops = [s[len("loop-"):] for s in sections if s in LOOP_SECTIONS]
            if loops:
                from .loops import run_loops

                results["loops"] = run_loops(loops, repeats=loop_repeats, progress=bar, notes=notes)
                for case in results["loops"]:
                    for c in case["candidates"]:
                        if c["errors"] and c["candidate"] in ("sync", "dummy", "fastvec", "fastvec_sb3", "engine"):
                            failed = True
            wl = default_workloads()
            chosen = [wl[s] for s in sections if s in wl]
            if chosen:
                results["vecenv"] = run_vecenv_bench(
                    chosen, cands, repeats=repeats, steps=steps, warmup=warmup,
                    fastvec_workers=args.fastvec_workers, seed=args.seed, progress=bar, notes=notes)
                for w in results["vecenv"]:
                    for c in w["candidates"]:
                        if c["candidate"] in ("sync", "fastvec") and c["errors"]:
                            failed = True
            if "scaling" in sections:
                try:
                    results["scaling"] = run_scaling(seed=args.seed, progress=bar, **scaling_cfg)
                    for p in results["scaling"]["points"]:
                        for e in p["errors"]:
                            failed = True
                            notes.append(f"scaling {p['candidate']} num_envs={p['num_envs']} "
                                         f"num_workers={p['num_workers']}: {e}")
                except Exception as exc:
                    failed = True
                    notes.append(f"scaling sweep failed: {type(exc).__name__}: {exc}")
            if "gae" in sections:
                bar("gae", 0)
                try:
                    from .gae_bench import run_gae_bench

                    results["gae"] = run_gae_bench(progress=lambda msg: bar(f"gae: {msg}", 0), **cfg["gae"])
                except Exception as exc:
                    failed = True
                    results["gae"] = {"error": f"{type(exc).__name__}: {exc}"}
                    notes.append(f"GAE benchmark failed: {type(exc).__name__}: {exc}")
                bar("gae", 1)
            if args.train:
                bar("train", 0)
                results["train"] = _train(notes)
                bar("train", 1)
        except KeyboardInterrupt:
            interrupted = True
            notes.append("interrupted: partial results")
        finally:
            bar.close()

    results["meta"]["loadavg_end"] = _loadavg()
    results["meta"]["wall_s"] = time.perf_counter() - t_start
    charts = []
    if not args.no_charts:
        try:
            charts = report.render_charts(results, out)
        except Exception as exc:  # charts are a nicety; the tables are the result
            notes.append(f"charts failed: {type(exc).__name__}: {exc}")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=_json_default)
    md = report.render_markdown(results, charts)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(md)
    _print_summary(results, out, charts)
    if interrupted:
        return 130
    return 1 if failed else 0


def _train(notes: list) -> dict | None:
    """PPO time to solve CartPole with the trainer's presets (``fastvec train``); the
    side-by-side comparison with SB3 is benchmarks/bench_train.py."""
    try:
        from ..train.cli import time_to_solve
    except ImportError as exc:  # the trainer needs torch: pip install "fastvec[train]"
        notes.append(f"--train: skipped ({exc}); install fastvec[train]")
        return None
    try:
        return time_to_solve()
    except Exception as exc:
        notes.append(f"--train failed: {type(exc).__name__}: {exc}")
        return None


def _print_summary(results, out, charts) -> None:
    from .report import _table, summary_rows, target_rows, _ratio

    lines = []
    rows = summary_rows(results)
    if rows:
        lines += _table(["workload", "candidate", "median steps/s", "median ratio vs Sync", "spread"], rows, "llrrr")
    for t in target_rows(results):
        met = "—" if t["met"] is None else ("met" if t["met"] else "MISSED")
        lines.append(f"target {t['workload']}: {t['metric']} >= {t['target']:g}x: {_ratio(t['measured'])} ({met})")
    g = results.get("gae")
    if g and "speedup_vs_numpy" in g:
        extra = f", {g['speedup_vs_torch']:.1f}x the torch loop" if g.get("speedup_vs_torch") else ""
        lines.append(f"GAE T={g['T']} N={g['N']}: fastvec.gae {g['speedup_vs_numpy']:.1f}x the numpy loop{extra}")
    for n in results.get("notes", []):
        lines.append(f"note: {n}")
    lines.append(f"wrote {os.path.join(out, 'results.md')}, results.json" + (", " + ", ".join(charts) if charts else ""))
    print("\n".join(lines))


def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, tuple):
        return list(o)
    return str(o)


def _cores() -> int:
    from ..options import available_cores

    return available_cores()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main("bench", sys.argv[1:]))
