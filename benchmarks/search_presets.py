#!/usr/bin/env python
"""Search a task's preset for the return reached in a fixed wall time on the worst of
several seeds (Optuna's TPE over a grid of ``--set`` values).

    python benchmarks/search_presets.py HalfCheetah-v5 --max-time 120 --seeds 1 2 3 \\
        --trials 12 --baseline preset: --out benchmarks/results/search

Each trial is a set of ``--set`` values drawn from the space (``SPACES``, narrowed or
widened with ``--param key=v1|v2|...``); each seed of a trial is a fresh ``fastvec train``
process stopped by ``--max-time`` (its schedules follow ``lr_horizon``, not the time, and
``--total-steps`` is set far beyond what the time allows). A trial's score is its **worst
seed's** training return at the end (the mean of the last 20 episodes), so a candidate
is only as good as the next user's unlucky seed. Seeds run in turn; once a seed ends at or
below the best score so far the trial cannot win (the minimum only falls) and its other
seeds are skipped ("pruned"). Baselines (``--baseline name:key=value,...``, the preset as
it is with nothing after the colon) run first and set the bar. The JSON is
written after every run, and ``--resume`` continues a search from it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

from bench_presets import parse_candidate, run
from harness.common import span
from presets_page import _num

# The search spaces: each key's values (``--set`` text). "none" is the config's none.
SPACES = {
    "mujoco": {
        "lr": ["1e-4", "2e-4", "3e-4", "5e-4", "1e-3"],
        "lr_horizon": ["1000000", "2000000", "4000000", "none"],
        "num_envs": ["8", "16"],
        "n_steps": ["64", "128", "256", "512"],
        "n_epochs": ["5", "10", "20"],
        "minibatch_size": ["64", "128", "256", "512"],
        "gamma": ["0.98", "0.99", "0.995"],
        "gae_lambda": ["0.9", "0.95", "0.98"],
        "clip_coef": ["0.1", "0.2", "0.3"],
        "log_std_init": ["-2", "-1", "-0.5", "0"],
        "hidden": ["64,64", "128,128", "256,256"],
        "activation": ["tanh", "relu"],
        "max_grad_norm": ["0.5", "1.0"],
    },
    "classic": {
        "lr": ["1e-3", "3e-3", "5e-3"],
        "n_epochs": ["3", "5", "10"],
        "gamma": ["0.98", "0.99"],
    },
}

_STATES: dict = {}  # a trial's state here -> Optuna's (filled once Optuna is imported)
LONG = 10**9  # --total-steps of a run stopped by time: no schedule may end inside it


def parse_param(text: str) -> tuple[str, list[str]]:
    key, sep, values = text.partition("=")
    choices = [v for v in values.split("|") if v]
    if not sep or not key or not choices:
        raise argparse.ArgumentTypeError(f"a param is key=value1|value2|... (got {text!r})")
    return key, choices


def score(returns: list) -> float:
    """A trial's score: its worst seed's return (a run with no finished episode: -inf)."""
    return min(float("-inf") if r is None else r for r in returns)


def run_seed(env_id: str, seed: int, sets: list[str], max_time: float) -> dict:
    """One fresh ``fastvec train`` stopped by ``max_time`` (``bench_presets.run``, no
    evaluation): its final training return, steps, wall time and learning curve."""
    r = run(env_id, LONG, seed, sets, episodes=0, max_time=max_time)
    return {"seed": seed, **{k: r[k] for k in ("train_return", "env_steps", "wall_seconds", "curve")}}


def run_trial(name: str, sets: list[str], seeds: list[int], bar: float, runner, max_time: float) -> dict:
    """Every seed in turn, stopping (pruned) once one ends at or below ``bar``; a run that
    fails (settings the trainer refuses, say) ends the trial as failed, with its error."""
    runs = []
    for seed in seeds:
        try:
            r = runner(seed, sets, max_time)
        except SystemExit as exc:  # _fastvec's: the child's stderr
            print(f"{name} seed {seed} failed: {exc}", flush=True)
            return {"name": name, "sets": sets, "runs": runs, "state": "failed", "error": str(exc)[-500:]}
        runs.append(r)
        print(f"{name} seed {seed}: {r['train_return']} at {r['env_steps']:,} steps", flush=True)
        if score([x["train_return"] for x in runs]) <= bar and len(runs) < len(seeds):
            return {"name": name, "sets": sets, "runs": runs, "state": "pruned"}
    return {"name": name, "sets": sets, "runs": runs, "state": "complete"}


def best_score(trials: list[dict]) -> float:
    done = [score([r["train_return"] for r in t["runs"]]) for t in trials if t["state"] == "complete"]
    return max(done, default=float("-inf"))


def search(args, space: dict, runner, save) -> list[dict]:
    """The baselines, then ``args.trials`` trials drawn by TPE; ``save(trials)`` after each."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st = optuna.trial.TrialState
    _STATES.update(complete=st.COMPLETE, pruned=st.PRUNED, failed=st.FAIL)
    dists = {k: optuna.distributions.CategoricalDistribution(v) for k, v in space.items()}
    study = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.TPESampler(seed=args.sampler_seed, multivariate=True)
    )
    trials = list(args.previous)
    for t in trials:  # a resumed search: what the sampler already knows
        if t["name"].startswith("trial") and set(t["params"]) == set(space):
            state = _STATES[t["state"]]
            value = score([r["train_return"] for r in t["runs"]]) if t["state"] == "complete" else None
            study.add_trial(
                optuna.trial.create_trial(params=t["params"], distributions=dists, value=value, state=state)
            )
    done = {t["name"] for t in trials}
    for name, sets in args.baseline:
        if name not in done:
            trials.append(
                {**run_trial(name, sets, args.seeds, best_score(trials), runner, args.max_time), "params": {}}
            )
            save(trials)
    start = sum(t["name"].startswith("trial") for t in trials)
    for i in range(start, start + args.trials):
        trial = study.ask(dists)
        sets = [f"{k}={v}" for k, v in trial.params.items()]
        t = run_trial(f"trial{i}", sets, args.seeds, best_score(trials), runner, args.max_time)
        t["params"] = dict(trial.params)
        if t["state"] == "complete":
            study.tell(trial, score([r["train_return"] for r in t["runs"]]))
        else:
            study.tell(trial, state=_STATES[t["state"]])
        trials.append(t)
        save(trials)
    return trials


def report(env_id: str, max_time: float, seeds: list[int], trials: list[dict], command: str, took: float) -> str:
    ranked = sorted(
        trials,
        key=lambda t: (t["state"] == "complete", score([r["train_return"] for r in t["runs"]])),
        reverse=True,
    )
    lines = [
        f"# Preset search: {env_id}, {max_time:g} s a run, worst of {len(seeds)} seeds ({took / 60:.0f} min)",
        "",
        f"`python benchmarks/search_presets.py {command}` on {platform.platform()}, {os.cpu_count()} cores. "
        "Each seed a fresh `fastvec train` stopped by `--max-time`; score: the worst seed's training return "
        "(the last 20 episodes) at the end. Pruned: a seed ended at or below the best score so far, so the "
        "trial could not win and its other seeds were skipped. Best first.",
        "",
        "| candidate | state | worst seed | median | per seed | env steps (median) | --set |",
        "|---|---|---:|---:|---|---:|---|",
    ]
    for t in ranked:
        rets = [r["train_return"] for r in t["runs"]] or [None]
        per = ", ".join(f"{r['seed']}: {_num(r['train_return'])}" for r in t["runs"])
        steps = statistics.median([r["env_steps"] for r in t["runs"]] or [0])
        sets = " ".join(f"`{s}`" for s in t["sets"]) or "(the preset)"
        median = statistics.median(r for r in rets if r is not None) if any(r is not None for r in rets) else None
        lines.append(
            f"| {t['name']} | {t['state']} | {_num(score(rets))} | {_num(median)} | {per} | {steps:,.0f} | {sets} |"
        )
    walls = [r["wall_seconds"] for t in trials for r in t["runs"]]
    lines += ["", f"Runs: {len(walls)}, wall time each {span(walls, '{:.0f}')} s."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("env_id")
    p.add_argument("--max-time", type=float, required=True, help="seconds of training per run")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--trials", type=int, default=10, help="trials drawn by the sampler (after the baselines)")
    p.add_argument("--space", choices=sorted(SPACES), default="mujoco")
    p.add_argument("--param", type=parse_param, action="append", default=[], help="key=v1|v2|... (replaces or adds)")
    p.add_argument("--baseline", type=parse_candidate, action="append", default=[], help="name:key=value,...")
    p.add_argument("--sampler-seed", type=int, default=0)
    p.add_argument("--out", default=None, help="folder for <name>.md and <name>.json")
    p.add_argument("--name", default=None, help="the files' name (default: the env id)")
    p.add_argument("--resume", action="store_true", help="continue the search in --out's JSON")
    args = p.parse_args(argv)
    if args.max_time <= 0 or args.trials < 0 or not args.seeds:
        p.error("--max-time must be positive, --trials non-negative and --seeds not empty")
    names = [n for n, _ in args.baseline]
    if len(set(names)) != len(names) or any(n.startswith("trial") for n in names):
        p.error(f"baseline names must differ and not start with 'trial': {names}")
    space = {**SPACES[args.space], **dict(args.param)}
    stem = os.path.join(args.out, (args.name or args.env_id).replace("/", "_")) if args.out else None
    args.previous = []
    if args.resume:
        if stem is None or not os.path.exists(stem + ".json"):
            p.error("--resume needs the JSON of a search in --out")
        prev = json.load(open(stem + ".json"))
        if prev["env_id"] != args.env_id or prev["max_time"] != args.max_time or prev["seeds"] != args.seeds:
            p.error("--resume: the search in --out has another env id, --max-time or --seeds")
        args.previous = prev["trials"]
    command = " ".join(argv)
    t0 = time.time() - (prev.get("seconds", 0.0) if args.resume else 0.0)

    def save(trials):
        if stem is None:
            return
        os.makedirs(args.out, exist_ok=True)
        doc = {"env_id": args.env_id, "max_time": args.max_time, "seeds": args.seeds, "space": space}
        doc.update(trials=trials, command=command, seconds=time.time() - t0)
        with open(stem + ".json", "w") as f:
            json.dump(doc, f, indent=1)
        with open(stem + ".md", "w") as f:
            f.write(report(args.env_id, args.max_time, args.seeds, trials, command, time.time() - t0))

    def runner(seed, sets, max_time):
        return run_seed(args.env_id, seed, sets, max_time)

    trials = search(args, space, runner, save)
    save(trials)
    print(report(args.env_id, args.max_time, args.seeds, trials, command, time.time() - t0), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
