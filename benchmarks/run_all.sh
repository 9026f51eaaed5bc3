#!/usr/bin/env bash
# Full benchmark run, results in benchmarks/results/:
#  1. `fastvec bench`: env steps/s of fastvec against the peers on five workloads, the
#     fastvec scaling sweep (num_envs x num_workers on CartPole) and the GAE benchmark
#     -> results.md, results.json, ratios.png, scaling.png, latency.png (~15 min on 2 cores)
#  2. benchmarks/bench_train.py: PPO time-to-solve against SB3 -> train.md, train.json
#     (~10-20 min on 2 cores; SKIP_TRAIN=1 skips it)
#  3. benchmarks/bench_ray.py: fastvec.ray beside the local engine -> ray.md, ray.json
#     (~5 min; runs when Ray is installed, SKIP_RAY=1 skips it)
#
#   benchmarks/run_all.sh                 # everything
#   benchmarks/run_all.sh --repeats 9     # extra arguments go to `fastvec bench`
#   SKIP_TRAIN=1 benchmarks/run_all.sh    # vector env + GAE benchmarks only
#   OUT=/tmp/bench benchmarks/run_all.sh  # somewhere else
#
# Run it on an otherwise idle machine: the multiprocess candidates need free cores, so
# background load lowers their ratios against SyncVectorEnv (see benchmarks/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results}"

fastvec bench --out "$OUT" --repeats 7 "$@"

if [[ "${SKIP_TRAIN:-0}" != 1 ]]; then
    python benchmarks/bench_train.py --out "$OUT"
fi

if [[ "${SKIP_RAY:-0}" != 1 ]] && python -c "import ray" 2>/dev/null; then
    python benchmarks/bench_ray.py --out "$OUT"
fi
