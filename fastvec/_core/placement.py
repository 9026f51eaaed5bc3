"""Which envs each worker runs: contiguous runs by default, or balanced by cost.

A *placement* is one sorted int array of env indices per worker. Env ``i``'s results
are always at row ``i`` of the segment, whichever worker steps it, so a placement
changes who does the work, never where the results are or what they are.

In lock-step a step lasts as long as the slowest worker's share. ``balance`` spreads
the envs' measured (or given) costs over the workers: longest processing time first,
each env to the least loaded worker. It keeps contiguous runs (what batches need, and
the default) unless spreading beats the best contiguous split by ``GAIN``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Spreading envs over workers must beat the best contiguous split by this much to be
# chosen: below it the two are alike within the noise of a probe (equal costs measured
# here 2-8% apart, partly by which core a worker got: HalfCheetah x8, CartPole x8), and
# contiguous runs keep batches and the default's layout.
GAIN = 1.10

PLACEMENT_MODES = ("contiguous", "balanced")


def contiguous(num_envs: int, num_workers: int) -> list[np.ndarray]:
    """Contiguous runs whose sizes differ by at most one (the default placement)."""
    base, extra = divmod(num_envs, num_workers)
    out, start = [], 0
    for w in range(num_workers):
        stop = start + base + (1 if w < extra else 0)
        out.append(np.arange(start, stop, dtype=np.intc))
        start = stop
    return out


def as_ranges(placement: list[np.ndarray]) -> list[tuple[int, int]] | None:
    """``[(start, stop), ...]`` when every worker runs a contiguous run of envs, in
    worker order; None otherwise."""
    ranges, start = [], 0
    for envs in placement:
        stop = start + len(envs)
        if not np.array_equal(envs, np.arange(start, stop)):
            return None
        ranges.append((start, stop))
        start = stop
    return ranges


def envs_text(envs) -> str:
    """``0..3`` for a run (``2..2`` for one env), ``0, 2, 5`` otherwise: how messages
    name a worker's envs."""
    envs = [int(i) for i in envs]
    if envs and envs == list(range(envs[0], envs[-1] + 1)):
        return f"{envs[0]}..{envs[-1]}"
    return ", ".join(map(str, envs))


def whole_workers(placement: list[np.ndarray], a: int, b: int) -> np.ndarray:
    """The workers (``placement[w]``: their envs) that run envs ``[a, b)`` and no others."""
    ws = [w for w, envs in enumerate(placement) if envs.size and a <= envs[0] and envs[-1] < b]
    if sum(placement[w].size for w in ws) != b - a:
        runs = "; ".join(envs_text(envs) for envs in placement)
        raise ValueError(f"envs [{a}, {b}) are not whole workers' envs (workers run {runs})")
    return np.asarray(ws, dtype=np.intc)


def check_placement(placement, num_envs: int) -> list[np.ndarray]:
    """A user's placement (one sequence of env indices per worker) as sorted arrays,
    or a one-line ValueError: every env exactly once, no worker without envs."""
    if isinstance(placement, (str, bytes)) or not isinstance(placement, (Sequence, np.ndarray)) or len(placement) == 0:
        raise ValueError(
            f"placement must be one of {list(PLACEMENT_MODES)} or a non-empty list of env index lists "
            f"(one per worker), got {placement!r}"
        )
    out, seen = [], {}
    for w, envs in enumerate(placement):
        if isinstance(envs, (str, bytes)) or not isinstance(envs, (Sequence, np.ndarray)) or len(envs) == 0:
            raise ValueError(f"placement[{w}] must be a non-empty list of env indices, got {envs!r}")
        for i in envs:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                raise ValueError(f"placement[{w}] holds {i!r}: env indices are ints")
            if not 0 <= i < num_envs:
                raise ValueError(f"placement[{w}] names env {i}, but there are {num_envs} envs (0..{num_envs - 1})")
            if int(i) in seen:
                raise ValueError(f"env {i} is placed twice (workers {seen[int(i)]} and {w})")
            seen[int(i)] = w
        out.append(np.array(sorted(int(i) for i in envs), dtype=np.intc))
    missing = sorted(set(range(num_envs)) - seen.keys())
    if missing:
        raise ValueError(f"placement leaves env {missing[0]} out ({len(missing)} of {num_envs} envs unplaced)")
    return out


def check_costs(costs, num_envs: int) -> np.ndarray:
    """``env_costs``: one positive, finite number per env (any unit: only ratios count)."""
    if isinstance(costs, (str, bytes)) or not isinstance(costs, (Sequence, np.ndarray)):
        raise ValueError(f"env_costs must be a sequence of {num_envs} positive numbers, got {costs!r}")
    if len(costs) != num_envs:
        raise ValueError(f"env_costs has {len(costs)} entries for {num_envs} envs: give one per env")
    try:
        arr = np.asarray(costs, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"env_costs must be numbers, got {costs!r}") from None
    bad = np.flatnonzero(~(np.isfinite(arr) & (arr > 0)))
    if bad.size:
        raise ValueError(f"env_costs[{bad[0]}] = {costs[bad[0]]!r}: each cost must be a positive, finite number")
    return arr


def check_placement_args(placement, env_costs, num_envs: int, num_workers) -> tuple:
    """An engine's ``placement`` and ``env_costs`` checked (one-line ValueErrors):
    ``(mode, worker_envs or None, costs or None, num_workers)``, the worker count taken
    from an explicit placement (which must agree with one given)."""
    given = None
    if isinstance(placement, str):
        if placement not in PLACEMENT_MODES:
            raise ValueError(
                f"placement must be one of {list(PLACEMENT_MODES)} or a list of env index lists, got {placement!r}"
            )
    else:
        given = check_placement(placement, num_envs)
        if num_workers is not None and num_workers != len(given):
            raise ValueError(f"num_workers={num_workers} conflicts with a placement of {len(given)} workers")
        num_workers = len(given)
    costs = None
    if env_costs is not None:
        if not (isinstance(placement, str) and placement == "balanced"):
            raise ValueError(f"env_costs are for placement='balanced', got placement={placement!r}")
        costs = check_costs(env_costs, num_envs)
    return ("given" if given is not None else placement), given, costs, num_workers


def _best_contiguous(costs: np.ndarray, num_workers: int) -> tuple[float, list[np.ndarray]]:
    """The contiguous split (each worker >= 1 env) with the smallest largest share:
    binary search on the share, greedy fill (a few dozen passes over the envs)."""
    n = len(costs)

    def split(limit: float) -> list[np.ndarray] | None:
        runs, start, load = [], 0, 0.0
        for i, c in enumerate(costs):
            left_workers = num_workers - len(runs) - 1  # after the run being filled
            if i > start and (load + c > limit or n - i <= left_workers):
                runs.append(np.arange(start, i, dtype=np.intc))
                start, load = i, 0.0
            load += c
        runs.append(np.arange(start, n, dtype=np.intc))
        if len(runs) > num_workers or any(costs[r].sum() > limit * (1 + 1e-12) for r in runs):
            return None
        while len(runs) < num_workers:  # split the longest run: every worker gets an env
            k = max(range(len(runs)), key=lambda r: len(runs[r]))
            run = runs.pop(k)
            runs[k:k] = [run[:1], run[1:]]
        return runs

    lo, hi = float(costs.max()), float(costs.sum())
    best = split(hi)
    assert best is not None  # one run per worker always fits under the total
    for _ in range(48):
        mid = (lo + hi) / 2
        runs = split(mid)
        if runs is None:
            lo = mid
        else:
            best, hi = runs, mid
    return max(float(costs[r].sum()) for r in best), best


def _spread(costs: np.ndarray, num_workers: int) -> tuple[float, list[np.ndarray]]:
    """Longest processing time first: each env, costliest first, to the worker with the
    least cost so far (fewest envs on a tie, then the lowest index)."""
    loads = [0.0] * num_workers
    members: list[list[int]] = [[] for _ in range(num_workers)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        w = min(range(num_workers), key=lambda w: (loads[w], len(members[w]), w))
        loads[w] += float(costs[i])
        members[w].append(i)
    return max(loads), [np.array(sorted(m), dtype=np.intc) for m in members]


def balance(costs: np.ndarray, num_workers: int) -> list[np.ndarray]:
    """A placement whose largest share of ``costs`` is about the smallest possible. Each
    step away from the default must pay ``GAIN``: the default's runs of equal size,
    unless the best contiguous split beats them by that, unless spreading the envs beats
    that in turn."""
    if num_workers > len(costs):
        raise ValueError(f"num_workers={num_workers} exceeds num_envs={len(costs)}")
    default = contiguous(len(costs), num_workers)
    default_max = max(float(costs[r].sum()) for r in default)
    run_max, runs = _best_contiguous(costs, num_workers)
    spread_max, spread = _spread(costs, num_workers)
    if default_max <= GAIN * min(run_max, spread_max):
        return default
    return spread if run_max > GAIN * spread_max else runs


@dataclass(frozen=True)
class PlacementReport:
    """Where the envs run and what they cost (``envs.placement``).

    workers : one tuple of env indices per worker
    env_us : mean wall time per step of each env so far, in microseconds (step, and the
        reset when its episode ended; NaN before its first step), measured in the
        workers' step loop
    share_us : per worker, the sum of its envs' ``env_us``: what a lock-step step waits for
    mode : "contiguous", "balanced" (placed by ``probe_us`` or ``env_costs``) or "given"
    probe_us : the costs the placement was chosen from (probed or given), per env; None
        when it was not chosen by cost
    """

    workers: tuple[tuple[int, ...], ...]
    env_us: tuple[float, ...]
    share_us: tuple[float, ...]
    mode: str
    probe_us: tuple[float, ...] | None

    @property
    def balance(self) -> float:
        """Mean worker share over the largest one (1.0: perfectly even)."""
        shares = np.asarray(self.share_us)
        return float(shares.mean() / shares.max()) if shares.size and shares.max() > 0 else float("nan")

    def __str__(self) -> str:
        lines = [f"placement ({self.mode}), balance {self.balance:.2f}:"]
        for w, (envs, share) in enumerate(zip(self.workers, self.share_us)):
            lines.append(f"  worker {w}: {share:8.1f} us/step  envs {list(envs)}")
        return "\n".join(lines)
