#!/usr/bin/env bash
# Round 12 on one H200, in device calls of under ten minutes each. STEPS picks what a call
# runs (default: all, in this order), and a step that would start after LIMIT_S seconds is
# skipped, saying so:
#   overlap   bench/overlap_probe.py: the dQ kernel on a side stream beside the dK/dV pass,
#             against one stream, in turns (bitwise equal gradients required)
#   targets   bench/engine_speed.py --quick --rounds 9 (the cuDNN and torch-flash ratios)
#   harness   bench/harness_throughput.py: all four levels cold (fills the cache, and is the
#             all-levels correctness run), then quick and all four levels warm, 4 workers
#   mps       the same warm runs with the workers as clients of a CUDA MPS server started
#             by hand (its pipe and log folders under /tmp), 4 and 8 workers (before --mps)
#   mpsbench  bench/harness_throughput.py with a cold fill, then warm: 4 workers, and (MPS_WORKERS)
#             `bundlegen run --mps` with 8 and 12 workers, each also through `bundlegen serve`
#   fault     bench/mps_fault_check.py: a device-side assert in one of 4 workers, without
#             and with --mps (only the faulting case may be recorded as anything but a pass)
# Results go to $OUT (default bench/results/h200-round12).
#   STEPS="overlap targets harness" OUT=/some/dir bash bench/h200_round12.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200-round12}
LIMIT_S=${LIMIT_S:-540}
STEPS=${STEPS:-overlap targets harness mps mpsbench fault}
source bench/h200_steps.sh

if wanted overlap; then
  timeout "$(left)" python3 bench/overlap_probe.py --d 64 128 256 --seqs 4096 --rounds 5 \
    --out "$OUT/overlap_probe.json" 2>&1 | tee "$OUT/overlap_probe.log"
fi
if wanted targets; then
  timeout "$(left)" python3 bench/engine_speed.py --quick --rounds 9 --peers torch-flash torch-cudnn \
    --out "$OUT/engine_speed_targets.json" > "$OUT/engine_speed_targets.log" 2>&1
  echo "targets: exit $?"; tail -n 14 "$OUT/engine_speed_targets.log"
fi
if wanted harness; then
  timeout "$(left)" python3 bench/harness_throughput.py --no-cold --no-one-worker --levels quick full \
    --workers 4 --out "$OUT/harness_throughput_w4.json" > "$OUT/harness_throughput_w4.log" 2>&1
  echo "harness: exit $?"; tail -n 30 "$OUT/harness_throughput_w4.log"
fi
if wanted mps; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/bundlegen-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/bundlegen-mps/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    for w in 4 8; do
      in_time "mps $w workers" || break
      timeout "$(left)" python3 bench/harness_throughput.py --no-cold --no-one-worker --levels quick full \
        --workers "$w" --out "$OUT/harness_throughput_mps_w$w.json" > "$OUT/harness_throughput_mps_w$w.log" 2>&1
      echo "mps, $w workers: exit $?"; tail -n 22 "$OUT/harness_throughput_mps_w$w.log"
    done
    echo quit | nvidia-cuda-mps-control
    cp "$CUDA_MPS_LOG_DIRECTORY"/*.log "$OUT"/ 2>/dev/null
  else
    echo "mps: nvidia-cuda-mps-control -d failed"
  fi
fi
if wanted mpsbench; then
  timeout "$(left)" python3 bench/harness_throughput.py --no-cold --no-one-worker --levels quick full \
    --workers 4 --mps-workers ${MPS_WORKERS:-8 12} --server --out "$OUT/harness_throughput_mps.json" \
    > "$OUT/harness_throughput_mps.log" 2>&1
  echo "mpsbench: exit $?"; tail -n 50 "$OUT/harness_throughput_mps.log"
fi
if wanted fault; then
  timeout "$(left)" python3 bench/mps_fault_check.py --workers 4 --cases 48 2>&1 | tee "$OUT/mps_fault_check.log"
fi
echo "round done at ${SECONDS}s"
