#!/usr/bin/env bash
# All four levels against each engine named (default: triton) on one GPU, then the Triton
# self-check, the engine mutants at quick, the GPU-only mutant (32-bit offsets) against the
# 64-bit-offset cases of full, the cuDNN varlen experiment and the ragged cases' counts per
# engine. Results and logs go to $OUT (default
# out/h200-levels): per engine a gzipped results.jsonl, run.json and the log.
#   OUT=/some/dir bash bench/h200_levels.sh triton torch-flash
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out/h200-levels}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
for engine in "${@:-triton}"; do
  echo "== $engine full"
  python3 -m bundlegen run --level full --engine "$engine" --device cuda --out "out/$engine-full" \
    > "$OUT/run-$engine-full.log" 2>&1
  echo "   exit $?"; grep -E "^│ (quick|pr|nightly|full|total)|^ran|^time|^failing" "$OUT/run-$engine-full.log"
  gzip -c "out/$engine-full/results.jsonl" > "$OUT/$engine-full.results.jsonl.gz"
  cp "out/$engine-full/run.json" "$OUT/$engine-full.run.json"
done
echo "== triton self-check"
python3 bench/triton_selfcheck.py --device cuda --no-bench > "$OUT/triton_selfcheck.log" 2>&1
echo "   exit $?"; tail -n 4 "$OUT/triton_selfcheck.log"
echo "== mutants at quick"
python3 -m bundlegen mutate --engine triton --level quick --device cuda > "$OUT/mutate-quick.log" 2>&1
echo "   exit $?"; tail -n 6 "$OUT/mutate-quick.log"
echo "== kill matrix by level (quick, then pr for what quick left; the BND-* boundary mutants die by pr)"
python3 -m bundlegen mutate --engine triton --levels quick,pr --device cuda \
  --json "$OUT/mutate-levels.json" > "$OUT/mutate-levels.log" 2>&1
echo "   exit $?"; tail -n 4 "$OUT/mutate-levels.log"
echo "== mutants only a GPU can kill (full level, the 64-bit-offset cases)"
python3 -m bundlegen mutate --engine triton --level full --device cuda --mutant offsets-32-bit \
  -k SHP-INT64-OFFSETS > "$OUT/mutate-gpu-only.log" 2>&1
echo "   exit $?"; tail -n 4 "$OUT/mutate-gpu-only.log"
echo "== cuDNN varlen experiment"
python3 bench/cudnn_varlen_check.py > "$OUT/cudnn_varlen_check.log" 2>&1
echo "   exit $?"; cat "$OUT/cudnn_varlen_check.log"
echo "== ragged and 64-bit-offset cases per engine"
python3 bench/feature_counts.py --feature RAGGED --feature INT64 "$OUT"/*-full.results.jsonl.gz \
  | tee "$OUT/feature_counts.txt"
