#!/usr/bin/env bash
# The GPU check, one script of at most ~8 minutes, for a machine with CUDA:
#
#   benchmarks/gpu_check.sh [OUT_DIR]      (default benchmarks/results/gpu)
#
# 1. the CUDA tests (pinned segment, non-blocking copies, PPO and the CNN on CUDA);
# 2. the engine's random-action speed on Pong (16 envs, lock-step, copy=False);
# 3. `fastvec train ALE/Pong-v5 --device cuda` (16 envs, 100k env steps) against it
#    (goal >= 0.6x), with the GPU's busy fraction sampled by nvidia-smi every 200 ms
#    while it trains (the trainer's own time/* split is in its TensorBoard run);
# and writes OUT_DIR/gpu_check.md. The trainer does not use batches yet (issue 15):
# the "with groups" row of that issue is not measured here.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=${1:-$here/results/gpu}
mkdir -p "$out"
md="$out/gpu_check.md"
py=${PYTHON:-python}
cd "$root"

if ! $py -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA device: nothing to check" | tee "$md"
  exit 1
fi
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)

# 1. CUDA tests
t0=$(date +%s)
tests=$(timeout 240 $py -m pytest -q -p no:cacheprovider tests/test_ppo.py -k cuda 2>&1 | tail -1)
t_tests=$(( $(date +%s) - t0 ))

# 2. random actions, the engine's speed
random_sps=$(cd /tmp && timeout 120 $py "$here/bench_batches.py" --one pong lockstep none 4000 2>/dev/null | tail -1 |
             $py -c "import json, sys; print(round(json.loads(sys.stdin.read())['sps']))")

# 3. training on CUDA, GPU busy fraction sampled alongside
nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 > "$out/util.txt" 2>/dev/null &
smi=$!
t0=$(date +%s)
train=$(timeout 300 $py -m fastvec train ALE/Pong-v5 --device cuda --num-envs 16 --total-steps 100000 \
        --no-progress --checkpoint-every 0 --logdir "$out/pong-run" 2>"$out/train.stderr" | tail -1)
t_train=$(( $(date +%s) - t0 ))
kill "$smi" 2>/dev/null
train_sps=$(echo "$train" | $py -c "import json, sys; print(json.loads(sys.stdin.read())['sps'])" 2>/dev/null || echo "failed")
busy=$($py -c "
vals = [float(v) for v in open('$out/util.txt') if v.strip().replace('.', '', 1).isdigit()]
print(f'{sum(vals) / len(vals):.0f}% (median of {len(vals)} samples: {sorted(vals)[len(vals) // 2]:.0f}%)' if vals else 'n/a')")
ratio=$($py -c "print(f'{float(\"$train_sps\") / float(\"$random_sps\"):.2f}x')" 2>/dev/null || echo "n/a")

{
  echo "# GPU check ($(date -u +%Y-%m-%d), $gpu)"
  echo
  echo "\`benchmarks/gpu_check.sh\` at $(git rev-parse --short HEAD 2>/dev/null)."
  echo
  echo "| check | result |"
  echo "|---|---|"
  echo "| CUDA tests (\`tests/test_ppo.py -k cuda\`, ${t_tests} s) | $tests |"
  echo "| Pong x16, random actions, lock-step (env steps/s) | $random_sps |"
  echo "| \`fastvec train ALE/Pong-v5 --device cuda\`, 16 envs, 100k steps (${t_train} s), env steps/s | $train_sps |"
  echo "| training / random actions (goal >= 0.6x) | $ratio |"
  echo "| GPU busy while training (nvidia-smi utilization, mean) | $busy |"
  echo "| GPU busy with batches (groups) | not measured: the trainer does not use batches yet |"
} | tee "$md"
