#!/usr/bin/env bash
# All four levels against each engine named (default: triton) on one GPU, then the Triton
# self-check and the engine mutants at quick. Results and logs go to $OUT (default
# bench/results/h200-levels): per engine a gzipped results.jsonl, run.json and the log.
#   OUT=/some/dir bash bench/h200_levels.sh triton torch-flash
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200-levels}
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
python3 -m bundlegen.engines.triton.selfcheck --device cuda --no-bench > "$OUT/triton_selfcheck.log" 2>&1
echo "   exit $?"; tail -n 4 "$OUT/triton_selfcheck.log"
echo "== mutants at quick"
python3 -m bundlegen mutate --engine triton --level quick --device cuda > "$OUT/mutate-quick.log" 2>&1
echo "   exit $?"; tail -n 6 "$OUT/mutate-quick.log"
