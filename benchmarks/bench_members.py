#!/usr/bin/env python
"""Members (``fastvec train --seeds K [--sweep ...]``) against the same runs one by one.

    python benchmarks/bench_members.py cartpole --rounds 3 --out benchmarks/results/members
    python benchmarks/bench_members.py halfcheetah --steps 300000 --out benchmarks/results/members
    python benchmarks/bench_members.py sweep --steps 300000 --out benchmarks/results/members
    python benchmarks/bench_members.py learner --out benchmarks/results/members

Each workload runs, in fresh ``fastvec train`` processes as a user runs them, one
population (all its members in one process) and the same runs alone one after another
(``--seed S`` and, in a sweep, ``--set KEY=V``), the candidates' order alternating by
round. Reported: the process wall time (start-up included) of the population and of the
runs alone in sequence, and for CartPole one run alone's; each member's and each run's
final mean return; where the population's time went (acting, envs, targets, learning).

- ``cartpole``: 8 seeds to a mean return of 475 each (``--stop-at-return 475``).
- ``halfcheetah``: 8 seeds of the HalfCheetah-v5 preset, ``--steps`` env steps each.
- ``sweep``: HalfCheetah-v5, ``lr`` 1e-4, 3e-4, 1e-3 times 4 seeds; the population's
  ``report.md`` (IQM and intervals per setting) and the same report over the runs alone
  (``fastvec report``), and whether the two rank the settings alike.
- ``learner``: one update step's gradient for K members of a small MLP, three ways: K
  numpy learners one after another, the stacked numpy pass the population uses
  (``fastvec.train.algo.stacked``), and ``torch.func.vmap(grad(...))`` over
  ``stack_module_state``'s parameters; medians of repeated timings.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

from harness.cli_runs import FASTVEC, run_fastvec, train_command
from harness.common import machine, rotated, span, write_results

WORKLOADS = ("cartpole", "halfcheetah", "sweep", "learner")


def _timed(args: list[str]) -> tuple[dict, float]:
    t0 = time.perf_counter()
    out = run_fastvec(args)
    return out, time.perf_counter() - t0


def _population(env_id, seeds: int, steps, extra, d: str) -> dict:
    cmd = train_command(env_id, 1, total_steps=steps, extra_args=["--seeds", str(seeds), *extra], logdir=d)
    out, wall = _timed(cmd[len(FASTVEC) :])
    return {
        "process_wall": wall,
        "wall_seconds": out["wall_seconds"],
        "time_breakdown": out["time_breakdown"],
        "returns": [r["final_mean_return"] for r in out["results"]],
        "labels": out["labels"],
        "solved": [r["solved"] for r in out["results"]],
        "learned_at_once": out["learned_at_once"],
    }


def _alone(env_id, seeds, steps, extra, d: str, settings=((),)) -> dict:
    runs, wall = [], 0.0
    for sets in settings:
        for s in seeds:
            name = ",".join([*sets, f"seed-{s}"])
            cmd = train_command(env_id, s, total_steps=steps, sets=sets, extra_args=extra, logdir=os.path.join(d, name))
            out, w = _timed(cmd[len(FASTVEC) :])
            wall += w
            runs.append(
                {
                    "label": name,
                    "process_wall": w,
                    "return": out["final_mean_return"],
                    "solved": out["solved"],
                    "time_breakdown": out["time_breakdown"],
                }
            )
    return {"process_wall": wall, "runs": runs}


def run_round(args, i: int, tmp: str) -> dict:
    env_id = "CartPole-v1" if args.workload == "cartpole" else "HalfCheetah-v5"
    extra = ["--stop-at-return", "475"] if args.workload == "cartpole" else []
    steps = None if args.workload == "cartpole" else args.steps
    seeds = list(range(1, 1 + args.seeds))
    sweep = args.workload == "sweep"
    settings = [(f"lr={v}",) for v in args.lrs] if sweep else [()]
    pop_extra = [*extra, "--sweep", "lr=" + ",".join(args.lrs)] if sweep else extra
    out = {}
    for cand in rotated(["population", "alone"], i):
        d = os.path.join(tmp, f"r{i}-{cand}")
        if cand == "population":
            out[cand] = _population(env_id, args.seeds, steps, pop_extra, d)
        else:
            out[cand] = _alone(env_id, seeds, steps, extra, d, settings)
            if args.workload == "cartpole":  # one run alone, for the "2x one run" goal
                out["one"] = {"process_wall": out[cand]["runs"][0]["process_wall"]}
        if sweep:
            out[cand]["report"] = _report(d, cand, args.lrs)
    return out


def _report(d: str, cand: str, lrs) -> dict:
    """The settings compared by ``fastvec report``, over the population's members or the runs alone."""
    # (a member's directory names its setting as the config prints it, a run alone's as given)
    groups = [
        f"lr={v}=" + os.path.join(d, f"lr={_g(v)},seed-*" if cand == "population" else f"lr={v},seed-*") for v in lrs
    ]
    with tempfile.TemporaryDirectory() as out_dir:
        subprocess.run([*FASTVEC, "report", *groups, "--out", out_dir], check=True, capture_output=True, text=True)
        with open(os.path.join(out_dir, "report.json")) as f:
            rep = json.load(f)
    return {name: {"iqm": g["iqm"], "mean": g["mean"], "scores": g["scores"]} for name, g in rep["groups"].items()}


def _g(v: str) -> str:
    return f"{float(v):g}"


def _ways(obs_space, act_space, mb: int, K: int) -> dict:
    """The three ways to K members' minibatch gradients, each a function of no arguments."""
    import numpy as np
    import torch
    from torch.func import functional_call, grad, stack_module_state, vmap

    from fastvec.train.algo.minibatch import NumpyLearner
    from fastvec.train.algo.optim import flatten_parameters
    from fastvec.train.algo.stacked import StackedLearner
    from fastvec.train.model.actor_critic import make_policy

    pols = [make_policy(obs_space, act_space, hidden=(64, 64)) for _ in range(K)]
    flats = [flatten_parameters(p) for p in pols]
    alone = [NumpyLearner(p, fg, 0.0, 0.5, None) for p, (_fp, fg) in zip(pols, flats)]
    P = flats[0][0].numel()
    rows_p, rows_g = np.stack([f[0].detach().numpy() for f in flats]), np.zeros((K, P), np.float32)
    stacked = StackedLearner(pols[0], flats[0][0], rows_p, rows_g)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((K, mb, obs_space.shape[0]), dtype=np.float32)
    discrete = act_space.shape == ()
    a = (
        rng.integers(0, act_space.n, (K, mb))
        if discrete
        else rng.standard_normal((K, mb, act_space.shape[0]), dtype=np.float32)
    )
    cols = [rng.standard_normal((K, mb), dtype=np.float32) for _ in range(4)]
    co = {
        "clip": np.full(K, 0.2, np.float32),
        "ent_coef": np.zeros(K, np.float32),
        "vf_coef": np.full(K, 0.5, np.float32),
        "clip_vf": None,
    }

    class Loss(torch.nn.Module):
        def __init__(self, pol):
            super().__init__()
            self.pol = pol

        def forward(self, o, act, olp, adv, ret):
            prm, v = self.pol.params_and_value(o)
            logp, _ent = self.pol.dist.log_prob_entropy(prm, act, need_entropy=False)
            ratio = (logp - olp).exp()
            return -torch.min(adv * ratio, adv * ratio.clamp(0.8, 1.2)).mean() + 0.25 * (v - ret).square().mean()

    wrapped = Loss(make_policy(obs_space, act_space, hidden=(64, 64)))
    params, buffers = stack_module_state(pols)
    pp = {"pol." + k: v for k, v in params.items()}
    bb = {"pol." + k: v for k, v in buffers.items()}
    g = vmap(grad(lambda p, b, *xs: functional_call(wrapped, (p, b), xs)))
    tx, ta, tc = torch.from_numpy(x), torch.from_numpy(np.asarray(a)), [torch.from_numpy(c) for c in cols]

    def one_by_one():
        for k, learner in enumerate(alone):
            learner.minibatch(x[k], a[k], *(c[k] for c in cols), clip=0.2, want_stats=False, target_kl=None, stats={})

    return {
        "one by one (numpy)": one_by_one,
        "at once (stacked numpy)": lambda: stacked.minibatch(x, a, *cols, co=co),
        "torch.func vmap(grad)": lambda: g(pp, bb, tx, ta, *tc[:3]),
    }


def learner_timings(args) -> dict:
    """Milliseconds per minibatch gradient for K members, three ways (see the module's docstring)."""
    import gymnasium as gym
    import numpy as np
    import torch

    torch.set_num_threads(1)
    shapes = {
        "CartPole (4 obs, 2 actions, minibatch 64)": (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), 64),
        "HalfCheetah (17 obs, 6 actions, minibatch 256)": (
            gym.spaces.Box(-np.inf, np.inf, (17,)),
            gym.spaces.Box(-1, 1, (6,)),
            256,
        ),
    }
    from threadpoolctl import threadpool_limits

    rows = {}
    with threadpool_limits(1, "blas"):  # (as the trainer learns: NumpyLearner.one_blas_thread)
        return _time_ways(shapes, args, rows)


def _time_ways(shapes: dict, args, rows: dict) -> dict:
    for name, (obs_space, act_space, mb) in shapes.items():
        fns = _ways(obs_space, act_space, mb, args.seeds)
        times: dict = {label: [] for label in fns}
        for fn in fns.values():
            fn()
        for r in range(args.repeats):
            for label in rotated(list(fns), r):
                t0 = time.perf_counter()
                for _ in range(20):
                    fns[label]()
                times[label].append((time.perf_counter() - t0) / 20 * 1e3)
        rows[name] = times
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("workload", choices=WORKLOADS)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--seeds", type=int, default=None, help="members (default: 8; 4 per setting in a sweep)")
    p.add_argument("--steps", type=int, default=300_000)
    p.add_argument("--lrs", nargs="+", default=["1e-4", "3e-4", "1e-3"])
    p.add_argument("--repeats", type=int, default=15, help="learner: timings per way")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.seeds = args.seeds or (4 if args.workload == "sweep" else 8)
    command = "python benchmarks/bench_members.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    info = machine(command)
    if args.workload == "learner":
        rows = learner_timings(args)
        lines = [
            f"# Members' gradients, {args.seeds} members: ms per minibatch",
            "",
            f"`{command}`; {info['cpu']}, {info['cores']} cores, torch on 1 thread.",
            "",
            "| network | " + " | ".join(next(iter(rows.values()))) + " |",
            "|---|" + "---|" * 3,
        ]
        for name, times in rows.items():
            lines.append(f"| {name} | " + " | ".join(span(t) for t in times.values()) + " |")
        write_results(args.out, "\n".join(lines), {"machine": info, "ms_per_minibatch": rows}, "learner")
        return 0
    rounds = []
    with tempfile.TemporaryDirectory(prefix="fastvec-members-") as tmp:
        for i in range(args.rounds):
            rounds.append(run_round(args, i, tmp))
            print(json.dumps({"round": i, **{k: v["process_wall"] for k, v in rounds[-1].items()}}), flush=True)
    write_results(args.out, _markdown(args, info, rounds), {"machine": info, "rounds": rounds}, args.workload)
    return 0


def _markdown(args, info, rounds) -> str:
    pop, alone = [r["population"] for r in rounds], [r["alone"] for r in rounds]
    ratio = [p["process_wall"] / a["process_wall"] for p, a in zip(pop, alone)]
    lines = [
        f"# Members: {args.workload}, {args.seeds} seeds"
        + (f" x lr {', '.join(args.lrs)}" if args.workload == "sweep" else ""),
        "",
        f"`{info['command']}`; {info['cpu']}, {info['cores']} cores; {len(rounds)} round(s), medians (min-max).",
        "",
        "| | process wall s | final mean returns |",
        "|---|---|---|",
        f"| one population (`--seeds`) | {span([p['process_wall'] for p in pop], '{:.1f}')} | {span([x for p in pop for x in p['returns']], '{:.0f}')} |",
        f"| the runs alone, one after another | {span([a['process_wall'] for a in alone], '{:.1f}')} | {span([x['return'] for a in alone for x in a['runs']], '{:.0f}')} |",
    ]
    if "one" in rounds[0]:
        one = [r["one"]["process_wall"] for r in rounds]
        lines.append(f"| one run alone | {span(one, '{:.1f}')} | |")
        lines += ["", f"Population / one run alone: {span([p['process_wall'] / o for p, o in zip(pop, one)])}x."]
    lines += [
        "",
        f"Population / runs alone in sequence: {span(ratio)}x. Members learned at once: {pop[0]['learned_at_once']}.",
        "",
        "Where the population's time went (s, summed over members; env: the shared wait): "
        + ", ".join(
            f"{k} {span([p['time_breakdown'][k] for p in pop], '{:.1f}')}" for k in ("act", "env", "prepare", "learn")
        ),
        "Where the runs alone's went (s, summed over runs): "
        + ", ".join(
            f"{k} {span([sum(x['time_breakdown'][k] for x in a['runs']) for a in alone], '{:.1f}')}"
            for k in ("act", "env", "prepare", "learn")
        ),
    ]
    if args.workload == "sweep":
        lines += ["", "| setting | population IQM [95% CI] | runs alone IQM [95% CI] |", "|---|---|---|"]
        rp, ra = pop[0]["report"], alone[0]["report"]
        for name in rp:
            fmt = lambda g: f"{g['iqm'][0]:.0f} [{g['iqm'][1]:.0f}, {g['iqm'][2]:.0f}]"  # noqa: E731
            lines.append(f"| {name} | {fmt(rp[name])} | {fmt(ra[name])} |")
        rank = lambda rep: sorted(rep, key=lambda n: -rep[n]["iqm"][0])  # noqa: E731
        lines += [
            "",
            f"Ranking by IQM: population {' > '.join(rank(rp))}; runs alone {' > '.join(rank(ra))} "
            f"({'the same' if rank(rp) == rank(ra) else 'different'}).",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
