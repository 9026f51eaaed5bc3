"""Benchmark fastvec.gae against a numpy loop and CleanRL's torch loop.

    python benchmarks/bench_gae.py                 # T=2048, N=64, float32
    python benchmarks/bench_gae.py --T 512 --N 8 --dtype float64 --repeats 11
    python benchmarks/bench_gae.py --quick         # a few seconds

Prints a markdown table (time per call, spread over the repeats, elements per
second, speedup of fastvec.gae over each row).
"""
import argparse
import json
import os
import sys

try:
    from fastvec.bench.gae_bench import run_gae_bench
except ImportError:  # running from a source checkout without installing
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from fastvec.bench.gae_bench import run_gae_bench


def _us(s):
    return f"{s * 1e6:,.1f}"


def markdown(res):
    m = res["methods"]
    fv = m["fastvec"]["median_s"]
    lines = [
        f"GAE, T={res['T']}, N={res['N']}, {res['dtype']}, {res['repeats']} repeats "
        f"(numpy {res['versions']['numpy']}"
        + (f", torch {res['versions']['torch']} with {res['torch_threads']} threads" if "torch" in res["versions"] else "")
        + ")",
        "",
        "| implementation | median µs/call | min–max µs | elements/s | fastvec.gae speedup |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in m.items():
        lines.append(
            f"| {r['description']} | {_us(r['median_s'])} | {_us(r['min_s'])}–{_us(r['max_s'])} "
            f"| {r['elements_per_s'] / 1e9:.3f} G | {r['median_s'] / fv:.1f}x |"
        )
    lines.append("")
    lines.append(f"fastvec.gae vs numpy loop: {res['speedup_vs_numpy']:.0f}x faster")
    if res["speedup_vs_torch"] is not None:
        lines.append(f"fastvec.gae vs CleanRL torch loop: {res['speedup_vs_torch']:.0f}x faster")
    elif res.get("torch_error"):
        lines.append(f"torch loop skipped: {res['torch_error']}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, default=2048, help="rollout length (default 2048)")
    p.add_argument("--N", type=int, default=64, help="number of environments (default 64)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per implementation")
    p.add_argument("--quick", action="store_true", help="3 repeats of ~5 ms (smoke run)")
    p.add_argument("--no-torch", action="store_true", help="skip the torch loop")
    p.add_argument("--json", metavar="PATH", help="also write the result dict as JSON")
    a = p.parse_args(argv)
    repeats = 3 if a.quick else a.repeats
    min_time = 0.005 if a.quick else 0.02
    res = run_gae_bench(
        a.T, a.N, a.dtype, repeats,
        progress=lambda msg: print(f"# {msg}", file=sys.stderr, flush=True),
        min_time=min_time, include_torch=not a.no_torch,
    )
    print(markdown(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
