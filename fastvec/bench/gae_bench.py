"""Side-by-side timing of :func:`fastvec.gae` against the usual Python loops.

Three implementations of GAE over a ``[T, N]`` rollout are timed in one run,
interleaved repeat by repeat (so slow drifts of a shared machine hit all of
them alike):

* ``fastvec``: :func:`fastvec.gae.gae` (validating wrapper + Cython kernel,
  output arrays allocated by the call, as in ordinary use);
* ``numpy_loop``: a plain numpy loop over ``t``, vectorised over ``N``, same
  formula and flags as :func:`fastvec.gae.gae`;
* ``torch_cleanrl``: CleanRL ``ppo.py``'s GAE loop, verbatim, on CPU torch
  tensors (``dones`` convention, float tensors, ``torch.no_grad()``).

For information it also times ``fastvec_out`` (``gae(..., out=...)`` reusing
buffers) and ``fastvec_from_dones`` (:func:`fastvec.gae.gae_from_dones`, the
like-for-like counterpart of the CleanRL loop). Results are cross-checked
(fastvec vs the numpy loop, gae_from_dones vs the torch loop) before timing.

Use :func:`run_gae_bench`, or ``python benchmarks/bench_gae.py``.
"""
from __future__ import annotations

import platform
import time

import numpy as np

from fastvec.gae import gae, gae_from_dones

__all__ = ["run_gae_bench", "numpy_gae_loop", "torch_cleanrl_gae"]

GAMMA = 0.99
LAM = 0.95


def numpy_gae_loop(rewards, values, next_values, terminated, truncated, gamma, lam):
    """Reference numpy implementation: loop over t, vectorised over N."""
    dt = values.dtype
    nonterminal = 1.0 - terminated.astype(dt)
    cont = nonterminal * (1.0 - truncated.astype(dt))
    g = dt.type(gamma)
    gl = dt.type(gamma * lam)
    T = values.shape[0]
    advantages = np.empty_like(values)
    lastgaelam = np.zeros(values.shape[1], dt)
    for t in range(T - 1, -1, -1):
        delta = rewards[t] + g * nonterminal[t] * next_values[t] - values[t]
        lastgaelam = delta + gl * cont[t] * lastgaelam
        advantages[t] = lastgaelam
    return advantages, advantages + values


def torch_cleanrl_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """CleanRL ppo.py's GAE loop (tensors: rewards/values/dones [T, N],
    next_value [1, N], next_done [N])."""
    import torch

    with torch.no_grad():
        num_steps = rewards.shape[0]
        advantages = torch.zeros_like(rewards)
        lastgaelam = 0
        for t in reversed(range(num_steps)):
            if t == num_steps - 1:
                nextnonterminal = 1.0 - next_done
                nextvalues = next_value
            else:
                nextnonterminal = 1.0 - dones[t + 1]
                nextvalues = values[t + 1]
            delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
            advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        returns = advantages + values
    return advantages, returns


def _calls_for(fn, min_time):
    """Calls per timed repeat so that one repeat lasts about ``min_time``."""
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    if dt >= min_time:
        return 1
    return max(1, min(100_000, int(min_time / max(dt, 1e-7)) + 1))


def run_gae_bench(T=2048, N=64, dtype="float32", repeats=7, progress=None, *,
                  min_time=0.02, include_torch=True, seed=0):
    """Time fastvec.gae, a numpy loop and a CleanRL-style torch loop.

    Parameters
    ----------
    T, N : int
        Rollout length and number of environments.
    dtype : {"float32", "float64"}
    repeats : int
        Timed repeats per implementation (interleaved). Each repeat runs
        enough calls to last about ``min_time`` seconds and records the mean
        time per call.
    progress : callable(str) or None
        Called with a short status line as the run goes.
    min_time : float, keyword-only
        Target duration of one repeat, seconds.
    include_torch : bool, keyword-only
        Skip the torch loop when False (it is also skipped, with
        ``torch_error`` set, if torch cannot be imported).
    seed : int, keyword-only

    Returns
    -------
    dict
        ``T``, ``N``, ``dtype``, ``repeats``, ``elements`` (= T * N),
        ``gamma``, ``lam``; ``methods``: name -> {``median_s``, ``min_s``,
        ``max_s`` (seconds per call over the repeats), ``elements_per_s``
        (elements / median), ``calls_per_repeat``, ``description``} for
        ``fastvec``, ``fastvec_out``, ``fastvec_from_dones``, ``numpy_loop``
        and ``torch_cleanrl`` (absent without torch); ``speedup_vs_numpy`` =
        numpy_loop median / fastvec median and ``speedup_vs_torch`` =
        torch_cleanrl median / fastvec median (None without torch), i.e. how
        many times faster fastvec is; ``max_abs_diff`` of the cross-checks;
        ``versions`` and ``torch_threads``.
    """
    say = progress if progress is not None else (lambda msg: None)
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    T, N, repeats = int(T), int(N), int(repeats)
    if T < 1 or N < 1 or repeats < 1:
        raise ValueError("T, N and repeats must be >= 1")

    rng = np.random.default_rng(seed)
    rewards = rng.standard_normal((T, N)).astype(dt)
    values = rng.standard_normal((T, N)).astype(dt)
    next_values = rng.standard_normal((T, N)).astype(dt)
    terminated = rng.random((T, N)) < 0.01
    truncated = rng.random((T, N)) < 0.005
    dones = rng.random((T, N)) < 0.01
    last_value = rng.standard_normal(N).astype(dt)
    last_done = rng.random(N) < 0.01
    adv_buf, ret_buf = np.empty((T, N), dt), np.empty((T, N), dt)

    methods = {
        "fastvec": (
            "fastvec.gae (allocates outputs)",
            lambda: gae(rewards, values, next_values, terminated, truncated, GAMMA, LAM),
        ),
        "fastvec_out": (
            "fastvec.gae(out=...) reusing buffers",
            lambda: gae(rewards, values, next_values, terminated, truncated, GAMMA, LAM,
                        out=(adv_buf, ret_buf)),
        ),
        "fastvec_from_dones": (
            "fastvec.gae_from_dones (CleanRL convention)",
            lambda: gae_from_dones(rewards, values, dones, last_value, last_done, GAMMA, LAM),
        ),
        "numpy_loop": (
            "numpy loop over t, vectorised over N",
            lambda: numpy_gae_loop(rewards, values, next_values, terminated, truncated, GAMMA, LAM),
        ),
    }

    result = {
        "T": T, "N": N, "dtype": dt.name, "repeats": repeats, "elements": T * N,
        "gamma": GAMMA, "lam": LAM, "torch_threads": None, "torch_error": None,
        "versions": {"numpy": np.__version__, "python": platform.python_version()},
    }

    say("checking results agree")
    ref_adv, ref_ret = numpy_gae_loop(rewards, values, next_values, terminated, truncated, GAMMA, LAM)
    adv, ret = methods["fastvec"][1]()
    diffs = {"fastvec_vs_numpy": float(max(np.max(np.abs(adv - ref_adv)), np.max(np.abs(ret - ref_ret))))}

    if include_torch:
        try:
            import torch
        except Exception as exc:  # pragma: no cover - torch is optional
            result["torch_error"] = f"{type(exc).__name__}: {exc}"
        else:
            result["versions"]["torch"] = torch.__version__
            result["torch_threads"] = torch.get_num_threads()
            t_r = torch.from_numpy(rewards)
            t_v = torch.from_numpy(values)
            t_d = torch.from_numpy(dones.astype(dt))
            t_nv = torch.from_numpy(last_value).reshape(1, -1)
            t_nd = torch.from_numpy(last_done.astype(dt))
            methods["torch_cleanrl"] = (
                "CleanRL ppo.py GAE loop, torch CPU",
                lambda: torch_cleanrl_gae(t_r, t_v, t_d, t_nv, t_nd, GAMMA, LAM),
            )
            tadv, tret = methods["torch_cleanrl"][1]()
            fadv, fret = methods["fastvec_from_dones"][1]()
            diffs["from_dones_vs_torch"] = float(max(
                np.max(np.abs(fadv - tadv.numpy())), np.max(np.abs(fret - tret.numpy()))))
    result["max_abs_diff"] = diffs
    tol = 1e-3 if dt == np.float32 else 1e-9
    scale = max(1.0, float(np.max(np.abs(ref_adv))))
    bad = {k: v for k, v in diffs.items() if not v <= tol * scale}
    if bad:
        raise RuntimeError(f"implementations disagree: {bad}")

    calls = {}
    for name, (_, fn) in methods.items():
        say(f"calibrating {name}")
        fn()  # warm up
        calls[name] = _calls_for(fn, min_time)
    times = {name: [] for name in methods}
    for rep in range(repeats):
        say(f"repeat {rep + 1}/{repeats}")
        for name, (_, fn) in methods.items():
            k = calls[name]
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            times[name].append((time.perf_counter() - t0) / k)
            if name == "torch_cleanrl":
                # torch's OpenMP workers keep spinning for a while after the
                # last parallel region and slow down whatever runs next on a
                # small machine (measured: fastvec ~40% slower right after the
                # torch loop); let them go idle before the next repeat.
                time.sleep(0.1)

    out = {}
    for name, (desc, _) in methods.items():
        ts = np.asarray(times[name])
        med = float(np.median(ts))
        out[name] = {
            "description": desc,
            "median_s": med,
            "min_s": float(ts.min()),
            "max_s": float(ts.max()),
            "elements_per_s": T * N / med,
            "calls_per_repeat": calls[name],
        }
    result["methods"] = out
    fv = out["fastvec"]["median_s"]
    result["speedup_vs_numpy"] = out["numpy_loop"]["median_s"] / fv
    result["speedup_vs_torch"] = out["torch_cleanrl"]["median_s"] / fv if "torch_cleanrl" in out else None
    say("done")
    return result
