"""The candidate layouts of a set of envs and the timing that chooses one: what
``fastvec tune`` and the doors' ``num_workers="auto"`` share.

How many workers, lock-step or batches, contiguous or balanced placement: each is a
trade between parallel env work, the cost of waking processes (high on small VMs) and
the caller's own time between steps, and the winner moves with the env and the machine.
So nothing here models it; each candidate layout is timed on the envs themselves, in a
loop with a stand-in for the caller's policy (``policy_us`` of busy CPU between a
step's return and the next step), about ``seconds`` each, twice with the order
reversed, and keeps the best time of each. The default layout stays unless another
beats it by ``KEEP``: a tuner that does not pay for itself changes nothing. The vector
env that runs the layouts is passed in, so the doors that offer ``"auto"`` time with
their own class and this module imports none of them.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence

import numpy as np

from ._core.placement import contiguous
from .options import available_cores

__all__ = ["KEEP", "Layout", "TuneResult", "layouts", "measure", "choose", "resolve_auto"]

# Another layout must beat the default's steps/s by this factor to be chosen (the
# spread of one candidate's repeated 1 s timings on this 2-core VM: a few percent).
KEEP = 1.05
WARMUP_S = 0.15  # of each timing, not counted: envs' first steps, the waits' learning
# Envs whose measured costs spread wider than this get balanced placements among the
# candidates (alike envs measure up to ~10% apart here, by core and by noise).
UNEVEN = 1.25


@dataclasses.dataclass(frozen=True)
class Layout:
    """A way to run ``num_envs`` envs: worker processes, lock-step or batches, placement."""

    num_workers: int
    batch_mode: str | None = None  # None: lock-step ``step``; "groups" or "ready": send/recv
    batch_size: int | None = None
    placement: str = "contiguous"

    def kwargs(self) -> dict:
        """Keywords for ``fastvec.AsyncVectorEnv``."""
        out: dict = {"num_workers": self.num_workers, "placement": self.placement}
        if self.batch_mode is not None:
            out.update(batch_mode=self.batch_mode, batch_size=self.batch_size)
        return out

    def __str__(self) -> str:
        loop = "lock-step" if self.batch_mode is None else f"batches of {self.batch_size} ({self.batch_mode})"
        place = "" if self.placement == "contiguous" else f", {self.placement}"
        return f"{self.num_workers} worker{'s' * (self.num_workers > 1)}, {loop}{place}"


@dataclasses.dataclass
class TuneResult:
    """What ``tune`` measured: each env's cost per step, every candidate's steps/s
    (best of its timings), the default, the layout chosen and the runner-up."""

    env_us: tuple[float, ...]
    trials: list[tuple[Layout, float]]
    default: Layout
    chosen: Layout
    runner_up: Layout | None
    policy_us: float
    seconds: float

    def sps(self, layout: Layout) -> float:
        return dict(self.trials)[layout]

    def __str__(self) -> str:
        us = np.asarray(self.env_us)
        lines = [
            f"env step cost: {np.median(us):.1f} us median ({us.min():.1f}-{us.max():.1f} over {us.size} envs); "
            f"policy stand-in {self.policy_us:g} us between steps",
            "",
            f"{'layout':<46} {'env steps/s':>12}  {'/ default':>9}",
        ]
        base = self.sps(self.default)
        for layout, sps in sorted(self.trials, key=lambda t: -t[1]):
            mark = " <- chosen" if layout == self.chosen else (" (runner-up)" if layout == self.runner_up else "")
            mark += " [default]" if layout == self.default else ""
            lines.append(f"{str(layout):<46} {sps:>12,.0f}  {sps / base:>8.2f}x{mark}")
        lines += ["", f"chosen: {self.chosen} ({self.seconds:.1f} s of tuning)"]
        return "\n".join(lines)


def layouts(num_envs: int, cores: int, batches: bool = True, uneven: bool = False) -> list[Layout]:
    """The candidates: 1, 2, 4, ... workers up to ``min(num_envs, cores)`` (and that
    count itself); lock-step with each (placed by cost too when ``uneven``); with
    ``batches``, two batch groups and ready batches of half the envs where the worker
    count fits them. The default (``min(num_envs, cores)`` workers, lock-step,
    contiguous) is always first."""
    top = min(num_envs, cores)
    counts = sorted({top} | {w for w in (2**k for k in range(8)) if w <= top})
    out = [Layout(top)]
    for w in counts:
        if w != top:
            out.append(Layout(w))
        if uneven and w > 1:
            out.append(Layout(w, placement="balanced"))
    if batches and num_envs % 2 == 0 and num_envs >= 2:
        half = num_envs // 2
        from .engine import batch_fits

        for w in counts:
            for mode in ("groups", "ready"):
                if w >= 2 and batch_fits(w, num_envs, half, mode):
                    out.append(Layout(w, mode, half))
    return out


def _busy(us: float) -> None:
    """The caller's policy, stood in for by CPU work of that length."""
    if us > 0:
        end = time.perf_counter() + us * 1e-6
        while time.perf_counter() < end:
            pass


def measure(
    vector_env: Callable, env_fns: Sequence[Callable], layout: Layout, policy_us: float, seconds: float, **env_kwargs
) -> tuple:
    """``(env steps/s, each env's us per step, each worker's envs)`` of ``layout`` on ``env_fns`` in the loop
    its API runs (``step``; batches: ``recv``, act, ``send``), ``policy_us`` of CPU work
    between a result and the next actions, timed for ``seconds`` after a warm-up. ``vector_env``: the class that runs it
    (``fastvec.AsyncVectorEnv`` or a door's own)."""
    import warnings

    envs = vector_env(list(env_fns), copy=False, torch_threads=None, **layout.kwargs(), **env_kwargs)
    try:
        space = envs.action_space
        space.seed(0)
        if layout.batch_mode is None:
            actions = space.sample()
            envs.reset(seed=0)
            step = functools.partial(envs.step, actions)
            per_call = envs.num_envs
        else:
            from gymnasium.vector.utils import batch_space

            actions = batch_space(envs.single_action_space, layout.batch_size).sample()
            envs.async_reset(seed=0)

            def step():
                envs.recv()
                envs.send(actions)

            per_call = layout.batch_size
        calls = 0
        t_end = time.perf_counter() + WARMUP_S
        while time.perf_counter() < t_end:
            _busy(policy_us)
            step()
        t0 = time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < seconds:
            _busy(policy_us)
            step()
            calls += 1
        report = envs.placement
        return calls * per_call / elapsed, report.env_us, report.workers
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # batches: the last ones sent are still in flight
            envs.close()


def choose(
    fns: list,
    measure: Callable,
    policy_us: float,
    seconds: float,
    cores: int,
    *,
    batches: bool = True,
    candidates: list[Layout] | None = None,
    default: Layout | None = None,
    **env_kwargs,
) -> TuneResult:
    """``fastvec.tune.tune``'s choice on ``cores`` cores, each layout timed by
    ``measure(fns, layout, policy_us, seconds, **env_kwargs)`` (``measure`` above with
    its vector env bound)."""
    t_start = time.perf_counter()
    if default is None:
        default = Layout(min(len(fns), cores))
    times: dict[Layout, list[float]] = {}

    def timed(layout: Layout):
        sps, env_us, workers = measure(fns, layout, policy_us, seconds, **env_kwargs)
        runs = [tuple(int(i) for i in r) for r in contiguous(len(fns), layout.num_workers)]
        if layout.placement == "balanced" and list(workers) == runs:
            layout = dataclasses.replace(layout, placement="contiguous")  # the probe kept the runs: that layout
        times.setdefault(layout, []).append(sps)
        return env_us

    env_us = timed(default)
    if candidates is None:
        us = np.asarray(env_us)
        uneven = bool(np.isfinite(us).all() and us.min() > 0 and us.max() > UNEVEN * us.min())
        candidates = layouts(len(fns), cores, batches, uneven)
    rest = [c for c in candidates if c != default]
    for layout in rest + list(reversed(rest)) + [default]:
        timed(layout)
    best = {c: max(t) for c, t in times.items()}
    ranked = sorted(best, key=lambda c: -best[c])
    chosen = default
    if ranked[0] != default and best[ranked[0]] > KEEP * best[default]:
        # A change must hold up: two more timings of each, alternating, and the mean
        # of all four still ahead by KEEP (one lucky second must not move the default).
        for layout in (ranked[0], default, default, ranked[0]):
            timed(layout)
        if np.mean(times[ranked[0]]) > KEEP * np.mean(times[default]):
            chosen = ranked[0]
    best = {c: max(t) for c, t in times.items()}
    others = sorted((c for c in best if c != chosen), key=lambda c: -best[c])
    return TuneResult(
        env_us=tuple(env_us),
        trials=list(best.items()),
        default=default,
        chosen=chosen,
        runner_up=others[0] if others else None,
        policy_us=float(policy_us),
        seconds=time.perf_counter() - t_start,
    )


def resolve_auto(
    vector_env: Callable, env_fns, placement, env_costs, batch_size=None, batch_mode="groups", **env_kwargs
) -> Layout:
    """``num_workers="auto"`` in a door: the layout ``tune`` picks for a loop that steps
    back to back (short timings, 0.3 s each: this runs in a constructor), lock-step, or
    batches of ``batch_size`` in ``batch_mode``. It picks the placement too, so a
    placement or costs given beside it are refused (``ValueError``). ``vector_env``: the
    class the layouts are timed with (the door's own vector env)."""
    if not (isinstance(placement, str) and placement == "contiguous") or env_costs is not None:
        raise ValueError("num_workers='auto' picks the placement too: leave placement and env_costs unset")
    from .options import check_env_fns

    fns = check_env_fns(env_fns)
    timed = functools.partial(measure, vector_env)
    if batch_size is None or batch_size == len(fns):
        return choose(fns, timed, 0.0, 0.3, available_cores(), batches=False, **env_kwargs).chosen
    from .engine import batch_fits, batch_workers

    default = Layout(batch_workers(None, len(fns), batch_size, available_cores(), batch_mode), batch_mode, batch_size)
    counts = [
        w for w in range(1, min(len(fns), 2 * available_cores()) + 1) if batch_fits(w, len(fns), batch_size, batch_mode)
    ]
    cands = [Layout(w, batch_mode, batch_size) for w in counts]
    return choose(fns, timed, 0.0, 0.3, available_cores(), candidates=cands, default=default, **env_kwargs).chosen
