#!/usr/bin/env bash
# Full benchmark run, one folder per benchmark under benchmarks/results/:
#  1. bench_vecenv.py: env steps/s of fastvec against the peers on five workloads and the
#     fastvec scaling sweep -> vecenv/ (~15 min on 2 cores)
#  2. bench_gae.py: fastvec.gae against a numpy loop and CleanRL's torch loop -> gae/ (~1 min)
#  3. bench_train.py: PPO time-to-solve against SB3, transports, learners -> train/
#     (~10-20 min on 2 cores; SKIP_TRAIN=1 skips it)
#  4. bench_ray.py: fastvec.ray beside the local engine -> ray/ (~5 min; runs when Ray is
#     installed, SKIP_RAY=1 skips it)
# The real loops (bench_loops.py, ~1 h) and the other scripts run on their own; see
# benchmarks/README.md.
#
#   benchmarks/run_all.sh                 # everything
#   benchmarks/run_all.sh --repeats 9     # extra arguments go to bench_vecenv.py
#   SKIP_TRAIN=1 benchmarks/run_all.sh    # vector env + GAE benchmarks only
#   OUT=/tmp/bench benchmarks/run_all.sh  # somewhere else
#
# Run it on an otherwise idle machine: the multiprocess candidates need free cores, so
# background load lowers their ratios against SyncVectorEnv (see benchmarks/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results}"

python benchmarks/bench_vecenv.py --out "$OUT/vecenv" --repeats 7 "$@"
python benchmarks/bench_gae.py --out "$OUT/gae"

if [[ "${SKIP_TRAIN:-0}" != 1 ]]; then
    python benchmarks/bench_train.py --out "$OUT/train"
fi

if [[ "${SKIP_RAY:-0}" != 1 ]] && python -c "import ray" 2>/dev/null; then
    python benchmarks/bench_ray.py --out "$OUT/ray"
fi
