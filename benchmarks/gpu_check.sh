#!/usr/bin/env bash
# The GPU check, one script of at most ~8 minutes, for a machine with CUDA:
#
#   benchmarks/gpu_check.sh [OUT_DIR]      (default benchmarks/results/gpu)
#
# 1. the CUDA tests (pinned segment, non-blocking copies, PPO and the CNN on CUDA,
#    batch groups and the busy fraction on CUDA);
# 2. the engine's random-action speed on Pong (16 envs, lock-step, copy=False);
# 3. `fastvec train ALE/Pong-v5 --device cuda` (16 envs, 100k env steps) against it
#    (goal >= 0.6x), in lock-step, with batch groups (`--set env_groups=2`) and with the
#    async pipeline (`--set pipeline=async`: a learner process on the GPU), the GPU's busy
#    fraction sampled by nvidia-smi every 200 ms while each trains, beside the trainer's
#    own figure (lock-step: CUDA events, `device_busy_fraction`; async: the learner
#    process's busy fraction; the seeds' figure for a decoupled learner is 85%);
# 4. data-parallel ranks, one per GPU of the machine (`--nproc G`, 16 envs each, 100k env
#    steps per rank): env steps/s against the one-rank lock-step row (scaling, goal near G)
#    and each GPU's busy fraction (nvidia-smi); on a one-GPU machine, not run;
# and writes OUT_DIR/gpu_check.md.
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
tests=$(timeout 150 $py -m pytest -q -p no:cacheprovider tests/test_train_cuda.py tests/test_train_groups.py tests/test_train_pipeline.py -k cuda 2>&1 | tail -1)
t_tests=$(( $(date +%s) - t0 ))

# 2. random actions, the engine's speed
random_sps=$(cd /tmp && timeout 60 $py "$here/bench_batches.py" --one pong lockstep none 4000 2>/dev/null | tail -1 |
             $py -c "import json, sys; print(round(json.loads(sys.stdin.read())['sps']))")

# 3. training on CUDA, lock-step and groups, GPU busy fraction sampled alongside
train_row() {  # $1: name, $2: a --set key=value -> "sps|ratio|nvidia-smi busy|trainer busy|seconds"
  nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 > "$out/util-$1.txt" 2>/dev/null &
  local smi=$! t0=$(date +%s)
  local res
  res=$(timeout 120 $py -m fastvec train ALE/Pong-v5 --device cuda --num-envs 16 --total-steps 100000 \
        --no-progress --checkpoint-every 0 --set "$2" --logdir "$out/pong-$1" \
        2>"$out/train-$1.stderr" | tail -1)
  local secs=$(( $(date +%s) - t0 ))
  kill "$smi" 2>/dev/null
  echo "$res" | $py -c "
import json, sys
vals = [float(v) for v in open('$out/util-$1.txt') if v.strip().replace('.', '', 1).isdigit()]
smi = f'{sum(vals) / len(vals):.0f}% (median of {len(vals)} samples: {sorted(vals)[len(vals) // 2]:.0f}%)' if vals else 'n/a'
try:
    r = json.loads(sys.stdin.read())
    sps, own = r['sps'], r.get('device_busy_fraction')
    ratio = f'{sps / float(\"$random_sps\"):.2f}x' if '$random_sps' else 'n/a'
    print(f'{sps}|{ratio}|{smi}|' + ('n/a' if own is None else f'{100 * own:.0f}%') + '|$secs')
except Exception:
    print('failed (see train-$1.stderr)|n/a|' + smi + '|n/a|$secs')"
}
IFS='|' read -r lock_sps lock_ratio lock_smi lock_own lock_s <<< "$(train_row lockstep env_groups=1)"
IFS='|' read -r grp_sps grp_ratio grp_smi grp_own grp_s <<< "$(train_row groups env_groups=2)"
IFS='|' read -r asy_sps asy_ratio asy_smi asy_own asy_s <<< "$(train_row async pipeline=async)"

# 4. data-parallel: every GPU a rank
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
dp_row="n/a (one GPU: nothing to scale over)"
if [ "$ngpu" -gt 1 ]; then
  nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits -lms 200 > "$out/util-ranks.txt" 2>/dev/null &
  smi=$! t0=$(date +%s)
  res=$(timeout 180 $py -m fastvec train ALE/Pong-v5 --device cuda --nproc "$ngpu" --num-envs $((16 * ngpu)) \
        --total-steps $((100000 * ngpu)) --no-progress --checkpoint-every 0 --logdir "$out/pong-ranks" \
        2>"$out/train-ranks.stderr" | tail -1)
  secs=$(( $(date +%s) - t0 ))
  kill "$smi" 2>/dev/null
  dp_row=$(echo "$res" | $py -c "
import collections, json, sys
busy = collections.defaultdict(list)
for line in open('$out/util-ranks.txt'):
    i, _, u = line.partition(',')
    if u.strip().isdigit():
        busy[int(i)].append(float(u))
per = ' '.join(f'GPU{i} {sum(v) / len(v):.0f}%' for i, v in sorted(busy.items()))
try:
    r = json.loads(sys.stdin.read())
    scale = f'{r[\"sps\"] / float(\"$lock_sps\"):.2f}x' if '$lock_sps'.replace('.', '', 1).isdigit() else 'n/a'
    print(f'{r[\"sps\"]} env steps/s, {scale} the one-rank row ($ngpu GPUs, ${secs} s); busy {per}')
except Exception:
    print('failed (see train-ranks.stderr); busy ' + per)")
fi

{
  echo "# GPU check ($(date -u +%Y-%m-%d), $gpu)"
  echo
  echo "\`benchmarks/gpu_check.sh\` at $(git rev-parse --short HEAD 2>/dev/null)."
  echo
  echo "| check | result |"
  echo "|---|---|"
  echo "| CUDA tests (\`tests/test_train_cuda.py -k cuda\`, ${t_tests} s) | $tests |"
  echo "| Pong x16, random actions, lock-step (env steps/s) | $random_sps |"
  echo "| \`fastvec train ALE/Pong-v5 --device cuda\`, 16 envs, 100k steps, lock-step (${lock_s} s), env steps/s | $lock_sps |"
  echo "| training / random actions (goal >= 0.6x), lock-step | $lock_ratio |"
  echo "| GPU busy, lock-step: nvidia-smi utilization, mean / the trainer's CUDA events | $lock_smi / $lock_own |"
  echo "| same with batch groups (\`--set env_groups=2\`, ${grp_s} s), env steps/s | $grp_sps |"
  echo "| training / random actions, groups | $grp_ratio |"
  echo "| GPU busy, groups: nvidia-smi / CUDA events | $grp_smi / $grp_own |"
  echo "| same with the async pipeline (\`--set pipeline=async\`, ${asy_s} s), env steps/s | $asy_sps |"
  echo "| training / random actions, async | $asy_ratio |"
  echo "| GPU busy, async (goal >= 85%): nvidia-smi / the learner's | $asy_smi / $asy_own |"
  echo "| data-parallel, \`--nproc\` = GPUs, 16 envs a rank: speed, scaling against one rank, GPU busy per rank | $dp_row |"
} | tee "$md"
