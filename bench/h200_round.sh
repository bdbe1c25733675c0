#!/usr/bin/env bash
# One harvestable round on a host with two GPUs, in one device call: all four levels twice
# per engine (harvest takes two runs), the engines split over the two GPUs with WORKERS
# worker processes sharing each GPU; then, with both GPUs free again, the harness
# throughput of the triton engine (warm: one GPU with one and with WORKERS workers, both
# GPUs), the modifier mutants' kill check and the per-engine counts of this round's
# features. Steps that would start after LIMIT_S seconds are skipped (and say so), so the
# call ends inside the device tool's limit with everything it finished under $OUT.
#   OUT=/some/dir bash bench/h200_round.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200-round}
WORKERS=${WORKERS:-4}
LIMIT_S=${LIMIT_S:-520}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(), "x", torch.cuda.device_count())'

in_time() {   # step name: true while there is time to start it
  if (( SECONDS > LIMIT_S )); then echo "SKIPPED (time): $1"; return 1; fi
}

full() {   # engine, run number
  in_time "$1 run $2" || return
  local work="out/$1-full-$2"
  python3 -m bundlegen run --level full --engine "$1" --device cuda --workers-per-device "$WORKERS" \
    --out "$work" > "$OUT/run-$1-full-$2.log" 2>&1
  echo "$1 run $2: exit $? at ${SECONDS}s; $(grep -E '^│ total' "$OUT/run-$1-full-$2.log")"
  grep -E "^time|^  (fail|crash|claim|rejection|error)[a-z:-]* +[0-9a-f]{12}" "$OUT/run-$1-full-$2.log" | head -8
  gzip -c "$work/results.jsonl" > "$OUT/$1-full-$2.results.jsonl.gz"
  cp "$work/run.json" "$OUT/$1-full-$2.run.json"
}

gpu0() { full triton 1; full triton 2; full torch-cudnn 1; full torch-cudnn 2; }
gpu1() {
  full torch-math 1; full torch-math 2; full torch-flash 1; full torch-flash 2
  full torch-efficient 1; full torch-efficient 2
}

# the two halves share the host's cores: each gets half of them
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))}
CUDA_VISIBLE_DEVICES=0 gpu0 > "$OUT/gpu0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 gpu1 > "$OUT/gpu1.log" 2>&1 &
wait
unset OMP_NUM_THREADS
cat "$OUT/gpu0.log" "$OUT/gpu1.log"
python3 bench/feature_counts.py --feature BIAS --feature DBIAS --feature ALIBI --feature SINKS \
  --feature SOFTCAP --feature MODIFIERS "$OUT"/*-full-2.results.jsonl.gz | tee "$OUT/feature_counts.txt"

if in_time "modifier mutants"; then
  timeout 120 python3 -m bundlegen mutate --engine triton --level quick --device cuda \
    --mutant softcap-grad-dropped --mutant dbias-masked-tiles-unwritten \
    --mutant dsinks-sign-flipped --mutant bias-indexed-by-kv-head \
    --json "$OUT/mutate-modifiers.json" > "$OUT/mutate-modifiers.log" 2>&1
  echo "modifier mutants: exit $?; $(tail -n 2 "$OUT/mutate-modifiers.log" | head -n 1)"
fi
if in_time "harness throughput"; then
  timeout $(( LIMIT_S + 60 - SECONDS > 30 ? LIMIT_S + 60 - SECONDS : 30 )) \
    python3 bench/harness_throughput.py --no-cold --levels quick full --workers "$WORKERS" \
      --devices cuda:0,cuda:1 --out "$OUT/harness_throughput_h200.json" > "$OUT/harness_throughput.log" 2>&1
  echo "harness throughput: exit $?"; tail -n 40 "$OUT/harness_throughput.log"
fi
echo "round done at ${SECONDS}s"
