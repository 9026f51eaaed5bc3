#!/usr/bin/env python
"""GAE speed: fastvec.gae against a numpy loop and a per-step torch loop.

    python benchmarks/bench_gae.py --out benchmarks/results/gae   # T=2048, N=64, float32
    python benchmarks/bench_gae.py --T 512 --N 8 --dtype float64 --repeats 11
    python benchmarks/bench_gae.py --quick                        # a few seconds

Three implementations of GAE over a ``[T, N]`` rollout are timed in one run,
interleaved repeat by repeat (so slow drifts of a shared machine hit all of
them alike):

* ``fastvec``: :func:`fastvec.returns.gae_estimates.gae` (validating wrapper + Cython kernel,
  output arrays allocated by the call, as in ordinary use);
* ``numpy_loop``: a plain numpy loop over ``t``, vectorised over ``N``, same
  formula and flags as :func:`fastvec.returns.gae_estimates.gae`;
* ``torch_cleanrl``: a per-step torch loop on CPU tensors in CleanRL's ``dones``
  convention (float tensors, ``torch.no_grad()``), the loop a torch user writes.

For information it also times ``fastvec_out`` (``gae(..., out=...)`` reusing
buffers) and ``fastvec_from_dones`` (:func:`fastvec.returns.gae_estimates.gae_from_dones`, the
like-for-like counterpart of the torch loop). Results are cross-checked
(fastvec vs the numpy loop, gae_from_dones vs the torch loop) before timing.
Prints a markdown table (time per call, spread over the repeats, elements per
second, speedup of fastvec.gae over each row); ``--out DIR`` also writes
``results.md`` and ``results.json`` there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

from fastvec.returns.gae_estimates import gae, gae_from_dones

__all__ = ["run_gae_bench", "numpy_gae_loop", "torch_cleanrl_gae", "markdown", "main"]

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
    """GAE as a per-step loop over CPU torch tensors, in the convention CleanRL's PPO
    scripts use (``dones[t]`` flags that ``obs[t]`` began a new episode; ``next_value``
    [1, N] and ``next_done`` [N] follow the last step): the loop a torch user writes,
    timed against the compiled kernel. Our own code, not a copy of CleanRL's."""
    import torch

    T = rewards.shape[0]
    # the value and the "still running" mask that follow each step t
    following_values = torch.cat([values[1:], next_value.reshape(1, -1)])
    running = 1.0 - torch.cat([dones[1:], next_done.reshape(1, -1)])
    with torch.no_grad():
        adv = torch.empty_like(rewards)
        carry = torch.zeros_like(rewards[0])
        for t in range(T - 1, -1, -1):
            td = rewards[t] + gamma * following_values[t] * running[t] - values[t]
            carry = td + gamma * gae_lambda * running[t] * carry
            adv[t] = carry
    return adv, adv + values


def _calls_for(fn, min_time):
    """Calls per timed repeat so that one repeat lasts about ``min_time``."""
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    if dt >= min_time:
        return 1
    return max(1, min(100_000, int(min_time / max(dt, 1e-7)) + 1))


def run_gae_bench(
    T=2048, N=64, dtype="float32", repeats=7, progress=None, *, min_time=0.02, include_torch=True, seed=0
):
    """Time fastvec.gae, a numpy loop and a per-step torch loop.

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

    x = _inputs(T, N, dt, seed)
    methods = _methods(x)

    result = {
        "T": T,
        "N": N,
        "dtype": dt.name,
        "repeats": repeats,
        "elements": T * N,
        "gamma": GAMMA,
        "lam": LAM,
        "torch_threads": None,
        "torch_error": None,
        "versions": {"numpy": np.__version__, "python": platform.python_version()},
    }

    say("checking results agree")
    ref_adv, ref_ret = numpy_gae_loop(
        x["rewards"], x["values"], x["next_values"], x["terminated"], x["truncated"], GAMMA, LAM
    )
    adv, ret = methods["fastvec"][1]()
    diffs = {"fastvec_vs_numpy": float(max(np.max(np.abs(adv - ref_adv)), np.max(np.abs(ret - ref_ret))))}

    if include_torch:
        _add_torch(methods, x, result, diffs)
    result["max_abs_diff"] = diffs
    tol = 1e-3 if dt == np.float32 else 1e-9
    scale = max(1.0, float(np.max(np.abs(ref_adv))))
    bad = {k: v for k, v in diffs.items() if not v <= tol * scale}
    if bad:
        raise RuntimeError(f"implementations disagree: {bad}")

    result["methods"] = _time_methods(methods, repeats, min_time, T * N, say)
    out = result["methods"]
    fv = out["fastvec"]["median_s"]
    result["speedup_vs_numpy"] = out["numpy_loop"]["median_s"] / fv
    result["speedup_vs_torch"] = out["torch_cleanrl"]["median_s"] / fv if "torch_cleanrl" in out else None
    say("done")
    return result


def _inputs(T: int, N: int, dt, seed: int) -> dict:
    """A random rollout: rewards, values, flags, and output buffers."""
    rng = np.random.default_rng(seed)
    x = {name: rng.standard_normal((T, N)).astype(dt) for name in ("rewards", "values", "next_values")}
    x["terminated"] = rng.random((T, N)) < 0.01
    x["truncated"] = rng.random((T, N)) < 0.005
    x["dones"] = rng.random((T, N)) < 0.01
    x["last_value"] = rng.standard_normal(N).astype(dt)
    x["last_done"] = rng.random(N) < 0.01
    x["out"] = (np.empty((T, N), dt), np.empty((T, N), dt))
    return x


def _methods(x: dict) -> dict:
    """name -> (description, zero-argument call) of the numpy-side implementations."""
    r, v, nv, te, tr = x["rewards"], x["values"], x["next_values"], x["terminated"], x["truncated"]
    return {
        "fastvec": ("fastvec.gae (allocates outputs)", lambda: gae(r, v, nv, te, tr, GAMMA, LAM)),
        "fastvec_out": (
            "fastvec.gae(out=...) reusing buffers",
            lambda: gae(r, v, nv, te, tr, GAMMA, LAM, out=x["out"]),
        ),
        "fastvec_from_dones": (
            "fastvec.gae_from_dones (CleanRL convention)",
            lambda: gae_from_dones(r, v, x["dones"], x["last_value"], x["last_done"], GAMMA, LAM),
        ),
        "numpy_loop": ("numpy loop over t, vectorised over N", lambda: numpy_gae_loop(r, v, nv, te, tr, GAMMA, LAM)),
    }


def _add_torch(methods: dict, x: dict, result: dict, diffs: dict) -> None:
    """Add the per-step torch loop to ``methods`` and its cross-check to ``diffs`` (or note
    in ``result`` why torch is missing)."""
    try:
        import torch
    except Exception as exc:  # pragma: no cover - torch is optional
        result["torch_error"] = f"{type(exc).__name__}: {exc}"
        return
    dt = x["values"].dtype
    result["versions"]["torch"] = torch.__version__
    result["torch_threads"] = torch.get_num_threads()
    t_r = torch.from_numpy(x["rewards"])
    t_v = torch.from_numpy(x["values"])
    t_d = torch.from_numpy(x["dones"].astype(dt))
    t_nv = torch.from_numpy(x["last_value"]).reshape(1, -1)
    t_nd = torch.from_numpy(x["last_done"].astype(dt))
    methods["torch_cleanrl"] = (
        "per-step torch loop (CleanRL's dones convention), CPU",
        lambda: torch_cleanrl_gae(t_r, t_v, t_d, t_nv, t_nd, GAMMA, LAM),
    )
    tadv, tret = methods["torch_cleanrl"][1]()
    fadv, fret = methods["fastvec_from_dones"][1]()
    diffs["from_dones_vs_torch"] = float(max(np.max(np.abs(fadv - tadv.numpy())), np.max(np.abs(fret - tret.numpy()))))


def _time_methods(methods: dict, repeats: int, min_time: float, elements: int, say) -> dict:
    """name -> timing summary of each ``(description, fn)``, interleaved repeat by repeat."""
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
            "elements_per_s": elements / med,
            "calls_per_repeat": calls[name],
        }
    return out


def _us(s):
    return f"{s * 1e6:,.1f}"


def markdown(res):
    m = res["methods"]
    fv = m["fastvec"]["median_s"]
    lines = [
        f"GAE, T={res['T']}, N={res['N']}, {res['dtype']}, {res['repeats']} repeats "
        f"(numpy {res['versions']['numpy']}"
        + (
            f", torch {res['versions']['torch']} with {res['torch_threads']} threads"
            if "torch" in res["versions"]
            else ""
        )
        + ")",
        "",
        "| implementation | median µs/call | min–max µs | elements/s | fastvec.gae speedup |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in m.values():
        lines.append(
            f"| {r['description']} | {_us(r['median_s'])} | {_us(r['min_s'])}–{_us(r['max_s'])} "
            f"| {r['elements_per_s'] / 1e9:.3f} G | {r['median_s'] / fv:.1f}x |"
        )
    lines.append("")
    lines.append(f"fastvec.gae vs numpy loop: {res['speedup_vs_numpy']:.0f}x faster")
    if res["speedup_vs_torch"] is not None:
        lines.append(f"fastvec.gae vs a per-step torch loop: {res['speedup_vs_torch']:.0f}x faster")
    elif res.get("torch_error"):
        lines.append(f"torch loop skipped: {res['torch_error']}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--T", type=int, default=2048, help="rollout length (default 2048)")
    p.add_argument("--N", type=int, default=64, help="number of environments (default 64)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per implementation")
    p.add_argument("--quick", action="store_true", help="3 repeats of ~5 ms (smoke run)")
    p.add_argument("--no-torch", action="store_true", help="skip the torch loop")
    p.add_argument("--json", metavar="PATH", help="also write the result dict as JSON")
    p.add_argument("--out", metavar="DIR", help="also write DIR/results.md and DIR/results.json")
    a = p.parse_args(argv)
    repeats = 3 if a.quick else a.repeats
    min_time = 0.005 if a.quick else 0.02
    res = run_gae_bench(
        a.T,
        a.N,
        a.dtype,
        repeats,
        progress=lambda msg: print(f"# {msg}", file=sys.stderr, flush=True),
        min_time=min_time,
        include_torch=not a.no_torch,
    )
    md = markdown(res)
    print(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump(res, f, indent=2)
        with open(os.path.join(a.out, "results.md"), "w") as f:
            f.write(
                f"# GAE\n\n`python benchmarks/bench_gae.py {' '.join(argv if argv is not None else sys.argv[1:])}`"
                f"\n\n{md}\n"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
