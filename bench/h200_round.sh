#!/usr/bin/env bash
# One harvestable round on a host with two GPUs: all four levels twice per engine (harvest
# takes two runs), the engines split over the two GPUs, then on GPU 0 the kill matrix by
# level, the GPU-only mutant, the Triton self-check, the cuDNN varlen experiment and the
# per-engine counts of the ragged and 64-bit-offset cases. Results go to $OUT (default
# bench/results/h200-round): per engine and run a gzipped results.jsonl, run.json and log.
#   OUT=/some/dir bash bench/h200_round.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200-round}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(), "x", torch.cuda.device_count())'

full() {   # engine, run number
  local work="out/$1-full-$2"
  python3 -m bundlegen run --level full --engine "$1" --device cuda --out "$work" > "$OUT/run-$1-full-$2.log" 2>&1
  echo "$1 run $2: exit $?; $(grep -E '^│ total' "$OUT/run-$1-full-$2.log")"
  grep -E "^time|^  (fail|crash|claim|rejection|error)[a-z:-]* +[0-9a-f]{12}" "$OUT/run-$1-full-$2.log" | head -8
  gzip -c "$work/results.jsonl" > "$OUT/$1-full-$2.results.jsonl.gz"
  cp "$work/run.json" "$OUT/$1-full-$2.run.json"
}

gpu0() {
  full triton 1; full triton 2; full torch-cudnn 2
  python3 -m bundlegen mutate --engine triton --levels quick,pr --device cuda \
    --json "$OUT/mutate-levels.json" > "$OUT/mutate-levels.log" 2>&1
  echo "mutate --levels quick,pr: exit $?; $(tail -n 2 "$OUT/mutate-levels.log" | head -n 1)"
  python3 -m bundlegen mutate --engine triton --level full --device cuda --mutant offsets-32-bit \
    -k SHP-INT64-OFFSETS --json "$OUT/mutate-gpu-only.json" > "$OUT/mutate-gpu-only.log" 2>&1
  echo "gpu-only mutant: exit $?; $(tail -n 2 "$OUT/mutate-gpu-only.log" | head -n 1)"
  python3 -m bundlegen.engines.triton.selfcheck --device cuda --no-bench > "$OUT/triton_selfcheck.log" 2>&1
  echo "selfcheck: exit $?"
  python3 bench/cudnn_varlen_check.py > "$OUT/cudnn_varlen_check.log" 2>&1
}

gpu1() {
  full torch-math 1; full torch-math 2; full torch-cudnn 1
  full torch-flash 1; full torch-flash 2; full torch-efficient 1; full torch-efficient 2
}

# the two halves share the host's cores: each gets half of them (unset, each worker's
# OpenMP and draw threads took every core; round 4's case phases, run so, were about ten
# times slower than the same cases in a process of their own)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))}
CUDA_VISIBLE_DEVICES=0 gpu0 > "$OUT/gpu0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 gpu1 > "$OUT/gpu1.log" 2>&1 &
wait
cat "$OUT/gpu0.log" "$OUT/gpu1.log"
python3 bench/feature_counts.py --feature RAGGED --feature INT64 --feature BND --feature DETERMINISTIC "$OUT"/*-full-2.results.jsonl.gz \
  | tee "$OUT/feature_counts.txt"
