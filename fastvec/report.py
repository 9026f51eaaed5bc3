"""``fastvec report``: groups of finished runs compared, with intervals.

    fastvec report 'runs/cheetah-lockstep-*' async='runs/cheetah-async-*' --out report/

Each GROUP is a run directory or a glob of them (quoted, so that the shell does not
split it into groups of one), optionally named ``NAME=PATTERN`` (by default its last
path part). A run directory is what ``fastvec train --logdir DIR`` writes
(``fastvec.train.run.monitor``): ``result.json`` and ``metrics.jsonl``. Each run's score
is its ``final_mean_return`` (``result.json``), or with ``--at-steps N`` its mean return
at N env steps (``metrics.jsonl``, interpolated between logging points). The statistics
are ``fastvec.run_stats``'s: each group's mean, median and IQM with 95% bootstrap
intervals, and the probability that a run of one group beats a run of another. Printed
as a table; with ``--out DIR`` also ``report.md``, ``report.json`` (the same numbers and
the learning curves) and ``report.png`` (the curves against env steps and wall time:
each group's IQM with its 95% band). Bad input (a path that is no run, a pattern that
matches nothing, a missing score, two groups of one name, a group of one run): one line
each, exit status 2. Imports numpy, scipy and (for the plot) matplotlib; no torch.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from dataclasses import dataclass, field

from . import run_stats
from ._cli_util import OneLineParser

__all__ = [
    "ReportError",
    "Run",
    "build_parser",
    "load_groups",
    "main",
    "make_report",
    "plot",
    "read_run",
    "render_markdown",
    "render_table",
    "split_group",
]

RETURN = "charts/mean_return"  # the curve's value in metrics.jsonl
WALL = "time/wall_s"
CURVES = {"env_steps": "env_steps", "wall_seconds": WALL}  # report.json's curves: their x in metrics.jsonl


class ReportError(ValueError):
    """Bad input to a report: each line of its message is one problem."""


@dataclass
class Run:
    """A run directory as read: its ``result.json`` (None: none) and the rows of its
    ``metrics.jsonl`` (empty: none)."""

    path: str
    result: dict | None
    rows: list[dict] = field(default_factory=list)

    def curve(self, x_key: str) -> tuple[list[float], list[float]]:
        """The mean return against ``x_key`` (``env_steps`` or ``time/wall_s``) at each
        logging point that has both. The run's last row (written at its end) has no wall
        time of its own: ``result.json``'s ``wall_seconds`` stands for it."""
        xs: list[float] = []
        ys: list[float] = []
        for row in self.rows:
            x = row.get(x_key)
            if x is None and x_key == WALL and self.result and row.get("env_steps") == self.result.get("env_steps"):
                x = self.result.get("wall_seconds")
            if x is not None and row.get(RETURN) is not None and (not xs or x > xs[-1]):
                xs.append(float(x))
                ys.append(float(row[RETURN]))
        return xs, ys

    def score(self, at_steps: int | None) -> float:
        """The final mean return, or the curve's value at ``at_steps`` env steps."""
        if at_steps is None:
            if self.result is None:
                raise ReportError(f"{self.path} has no result.json (an unfinished run?): --at-steps N scores it")
            value = self.result.get("final_mean_return")
            if value is None:
                raise ReportError(f"{self.path}: result.json has no final_mean_return (no episode finished)")
            return float(value)
        xs, ys = self.curve("env_steps")
        if not xs:
            raise ReportError(f"{self.path}: metrics.jsonl has no mean return to score at --at-steps {at_steps}")
        if not xs[0] <= at_steps <= xs[-1]:
            raise ReportError(
                f"{self.path}: no mean return at {at_steps} env steps (its curve covers {xs[0]:g} to {xs[-1]:g})"
            )
        return run_stats.value_at(xs, ys, at_steps)


def read_run(path: str) -> Run:
    """The run in directory ``path``; ReportError if it is none."""
    result_path, metrics_path = os.path.join(path, "result.json"), os.path.join(path, "metrics.jsonl")
    if not os.path.isdir(path) or not (os.path.isfile(result_path) or os.path.isfile(metrics_path)):
        raise ReportError(f"{path} is not a run directory (no result.json or metrics.jsonl)")
    result = None
    if os.path.isfile(result_path):
        try:
            with open(result_path) as f:
                result = json.load(f)
        except (OSError, ValueError) as e:
            raise ReportError(f"{result_path} is not readable JSON: {e}") from None
        if not isinstance(result, dict):
            raise ReportError(f"{result_path} holds no JSON object")
    rows = []
    if os.path.isfile(metrics_path):
        with open(metrics_path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a kill (as the trainer's resume reads it)
                if isinstance(row, dict) and "env_steps" in row:
                    rows.append(row)
    return Run(path, result, rows)


# ------------------------------------------------------------------ groups
def split_group(text: str) -> tuple[str, str]:
    """``(name, pattern)`` of a GROUP argument: ``NAME=PATTERN``, or a pattern named by
    its last path part. Text that matches paths as it stands is a pattern, '=' or not."""
    if "=" in text and not glob.glob(text):
        name, pattern = text.split("=", 1)
        if name and "/" not in name and pattern:
            return name, pattern
    return os.path.basename(text.rstrip("/")) or text, text


def load_groups(groups: list[str]) -> dict[str, list[Run]]:
    """``{name: its runs}`` for GROUP arguments (see ``split_group``), in order; every
    problem found (not a run, a pattern matching nothing, a name taken twice) in one
    ReportError, one line each."""
    out: dict[str, list[Run]] = {}
    problems = []
    for text in groups:
        name, pattern = split_group(text)
        if name in out:
            problems.append(f"two groups are named {name!r}: name them, NAME=PATTERN")
            continue
        paths = sorted(glob.glob(pattern))
        if not paths:
            problems.append(f"{pattern!r} matches nothing")
        runs = []
        for path in paths:
            try:
                runs.append(read_run(path))
            except ReportError as e:
                problems.append(str(e))
        out[name] = runs
    if problems:
        raise ReportError("\n".join(problems))
    return out


def _scores(groups: dict[str, list[Run]], at_steps: int | None) -> dict[str, list[float]]:
    scores: dict[str, list[float]] = {}
    problems: list[str] = []
    for name, runs in groups.items():
        scores[name] = []
        for run in runs:
            try:
                scores[name].append(run.score(at_steps))
            except ReportError as e:
                problems.append(str(e))
        if len(runs) == 1:
            problems.append(
                f"group {name!r} has 1 run ({runs[0].path}): its interval is undefined; a group needs 2 or more "
                "(quote a glob, 'runs/a*', so that the shell does not make each run a group)"
            )
    if problems:
        raise ReportError("\n".join(problems))
    return scores


# ------------------------------------------------------------------ the report
def make_report(
    groups: dict[str, list[Run]],
    at_steps: int | None = None,
    *,
    resamples: int = run_stats.RESAMPLES,
    seed: int = 0,
    points: int = 100,
) -> dict:
    """The report of ``groups`` (``load_groups``) as a JSON-able dict: the score, each
    group's runs, scores and ``run_stats.aggregate``, P(row beats column) for every
    ordered pair of groups, and each group's IQM curve against env steps and wall time
    (None where its runs' curves share no range)."""
    scores = _scores(groups, at_steps)
    opts = {"resamples": resamples, "seed": seed}
    out: dict = {
        "score": "final_mean_return" if at_steps is None else f"mean return at {at_steps} env steps",
        "at_steps": at_steps,
        "confidence": run_stats.CONFIDENCE,
        "interval": "percentile bootstrap (scipy.stats.bootstrap), runs resampled within each group",
        **opts,
        "groups": {},
        "improvement": {},
    }
    for name, runs in groups.items():
        stats = run_stats.aggregate(scores[name], **opts)
        out["groups"][name] = {
            "n": len(runs),
            "runs": [r.path for r in runs],
            "scores": scores[name],
            **{k: list(v) for k, v in stats.items()},
            "curves": {name: _curve(runs, key, points, opts) for name, key in CURVES.items()},
        }
    for a in groups:
        out["improvement"][a] = {
            b: list(run_stats.probability_of_improvement(scores[a], scores[b], **opts)) for b in groups if b != a
        }
    return out


def _curve(runs: list[Run], key: str, points: int, opts: dict) -> dict | None:
    series = [run.curve(key) for run in runs]
    if any(not xs for xs, _ in series):
        return None
    try:
        c = run_stats.curves(series, points=points, **opts)
    except ValueError:  # no common range
        return None
    return {"x": c.x.tolist(), "iqm": c.point.tolist(), "low": c.low.tolist(), "high": c.high.tolist()}


def _cell(v) -> str:
    return f"{v[0]:.4g} [{v[1]:.4g}, {v[2]:.4g}]"


def _pcell(v) -> str:
    return f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]"


def render_markdown(report: dict) -> str:
    """``report.md``: the groups' table, the P(row beats column) matrix and the runs."""
    names = list(report["groups"])
    pct = round(100 * report["confidence"])
    lines = [
        f"# Report: {report['score']}",
        "",
        f"Point estimates with {pct}% {report['interval']} ({report['resamples']} resamples, seed "
        f"{report['seed']}). IQM: the mean of the middle 50% of the runs' scores.",
        "",
        "| group | runs | mean | median | IQM |",
        "|---|---|---|---|---|",
    ]
    for name, g in report["groups"].items():
        lines.append(f"| {name} | {g['n']} | {_cell(g['mean'])} | {_cell(g['median'])} | {_cell(g['iqm'])} |")
    lines += ["", "## P(row beats column)", ""]
    lines.append("P(a run of the row's group scores higher than a run of the column's), ties counted 1/2:")
    lines += ["", "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for a in names:
        cells = ["–" if a == b else _pcell(report["improvement"][a][b]) for b in names]
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    lines += ["", "## Runs", ""]
    for name, g in report["groups"].items():
        runs = ", ".join(f"`{path}` {score:.4g}" for path, score in zip(g["runs"], g["scores"]))
        lines.append(f"- {name}: {runs}")
    return "\n".join(lines) + "\n"


def render_table(report: dict) -> str:
    """The short table printed by the command."""
    pct = round(100 * report["confidence"])
    head = f"{'group':<20} {'runs':>4}  {'mean [' + str(pct) + '% CI]':<28} IQM [{pct}% CI]"
    lines = [f"score: {report['score']}", head]
    for name, g in report["groups"].items():
        lines.append(f"{name:<20} {g['n']:>4}  {_cell(g['mean']):<28} {_cell(g['iqm'])}")
    for a, row in report["improvement"].items():
        for b, p in row.items():
            lines.append(f"P({a} > {b}) = {_pcell(p)}")
    return "\n".join(lines)


def plot(report: dict, path: str) -> str:
    """``report.png``: each group's IQM curve and band against env steps and wall time."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
    for ax, key, label in zip(axes, CURVES, ("env steps", "wall time (s)")):
        for k, (name, g) in enumerate(report["groups"].items()):
            c = g["curves"][key]
            if c is None:
                continue
            colour = f"C{k % 10}"
            ax.plot(c["x"], c["iqm"], color=colour, label=f"{name} (n={g['n']})")
            ax.fill_between(c["x"], c["low"], c["high"], color=colour, alpha=0.25, linewidth=0)
        ax.set_xlabel(label)
        ax.set_ylabel("mean return: IQM over runs")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # (no group's runs logged a curve: nothing to name)
            ax.legend(loc="best", fontsize="small")
        else:
            ax.text(0.5, 0.5, "no learning curves logged", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(f"IQM with {round(100 * report['confidence'])}% bootstrap bands")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# ------------------------------------------------------------------ the command
def _steps(text: str) -> int:
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (value >= 1 and value == int(value)):
        raise argparse.ArgumentTypeError(f"expected a positive whole number of env steps (1e5 accepted), got {text!r}")
    return int(value)


def build_parser() -> OneLineParser:
    p = OneLineParser(
        prog="fastvec report",
        description="Compare groups of finished runs: each group's mean, median and IQM with 95% bootstrap "
        "intervals, and the probability that one group's run beats another's.",
    )
    p.add_argument("groups", nargs="+", metavar="GROUP", help="a run directory or a quoted glob, or NAME=PATTERN")
    p.add_argument(
        "--at-steps",
        type=_steps,
        metavar="N",
        help="score each run by its mean return at N env steps (metrics.jsonl) instead of its final one",
    )
    p.add_argument("--out", metavar="DIR", help="write report.md, report.json and report.png into DIR")
    p.add_argument(
        "--resamples",
        type=_steps,
        default=run_stats.RESAMPLES,
        metavar="B",
        help=f"bootstrap resamples (default {run_stats.RESAMPLES})",
    )
    p.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0)")
    return p


def main(name: str = "report", argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.seed < 0:
        p.error(f"--seed must be >= 0, got {args.seed}")
    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):
        p.error(f"--out {args.out} is a file, not a directory")
    try:
        groups = load_groups(args.groups)
        report = make_report(groups, args.at_steps, resamples=args.resamples, seed=args.seed)
    except ReportError as e:
        for line in str(e).splitlines():
            print(f"fastvec report: error: {line}", file=sys.stderr)
        return 2
    print(render_table(report))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "report.md"), "w") as f:
            f.write(render_markdown(report))
        with open(os.path.join(args.out, "report.json"), "w") as f:
            json.dump(report, f, indent=1)
        plot(report, os.path.join(args.out, "report.png"))
        print(f"wrote {os.path.join(args.out, 'report.md')}, report.json and report.png")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main("report", sys.argv[1:]))
