#!/usr/bin/env bash
# All four levels against each engine named (default: every built-in engine) on one GPU,
# twice, in two case orders (`--shuffle 1`, `--shuffle 2`: harvest's two orders), then the
# per-engine counts of the dropout, fp32 and ragged cases. Each run's gzipped results and
# run.json go to $OUT/evidence.tar (the files evidence/h200/ keeps), its log to $OUT.
#   OUT=/some/dir bash bench/h200_levels.sh triton torch-flash
#   SELFCHECK=1 ... also runs the Triton self-check and the mutants at quick and pr.
#   WORKERS=8 MPS=1 ...  eight workers per GPU through a private MPS server (docs/PERFORMANCE.md)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out/h200-levels}
WORKERS=${WORKERS:-4}
mkdir -p "$OUT" out/evidence
export PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
engines=("${@:-triton torch-flash torch-efficient torch-cudnn torch-math}")
for engine in ${engines[@]}; do
  for n in 1 2; do
    echo "== $engine full, order $n"
    python3 -m bundlegen run --level full --engine "$engine" --device cuda --shuffle "$n" \
      --workers-per-device "$WORKERS" ${MPS:+--mps} --out "out/$engine-full-$n" > "$OUT/run-$engine-full-$n.log" 2>&1
    echo "   exit $?"; grep -E "^│ (quick|pr|nightly|full|total)|^ran|^time|^failing|^engine prepare failed" "$OUT/run-$engine-full-$n.log"
    gzip -nc "out/$engine-full-$n/results.jsonl" > "out/evidence/$engine-full-$n.results.jsonl.gz"
    cp "out/$engine-full-$n/run.json" "out/evidence/$engine-full-$n.run.json"
    tar -C out/evidence -cf "$OUT/evidence.tar" .    # after each run: a cut-off call keeps what ran
  done
done
echo "== dropout, fp32 and ragged cases per engine"
python3 bench/feature_counts.py --feature DROPOUT --feature FP32 --feature RAGGED --feature ALIBI \
  out/evidence/*.results.jsonl.gz | tee "$OUT/feature_counts.txt"
if [ -n "${SELFCHECK:-}" ]; then
  echo "== triton self-check"
  python3 bench/triton_selfcheck.py --device cuda --no-bench > "$OUT/triton_selfcheck.log" 2>&1
  echo "   exit $?"; tail -n 4 "$OUT/triton_selfcheck.log"
  echo "== kill matrix by level (quick, then pr for what quick left)"
  python3 -m bundlegen mutate --engine triton --levels quick,pr --device cuda \
    --json "$OUT/mutate-levels.json" > "$OUT/mutate-levels.log" 2>&1
  echo "   exit $?"; tail -n 4 "$OUT/mutate-levels.log"
fi
echo "== the statistical judge's margins per engine and level"
python3 bench/statistical_margins.py out/evidence/*.results.jsonl.gz --json "$OUT/statistical_margins.json" \
  | tee "$OUT/statistical_margins.txt"
