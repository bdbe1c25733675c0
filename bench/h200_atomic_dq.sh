#!/usr/bin/env bash
# The atomic-dQ engine (TritonAtomicDqEngine) on one H200 in one device call (~4 min): its
# speed at the headline shapes beside the deterministic engine and the torch peers, then all
# four levels against it (not deterministic: the harness runs each case once).
#   OUT=/some/dir bash bench/h200_atomic_dq.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200-atomic-dq}
ENGINE=bundlegen.engines.triton.engine:TritonAtomicDqEngine
mkdir -p "$OUT"
python3 bench/engine_speed.py --quick --atomic-dq --out "$OUT/engine_speed.json" > "$OUT/engine_speed.log" 2>&1
echo "engine_speed: exit $?"
grep -E "^triton /|with atomic dQ" "$OUT/engine_speed.log"
python3 -m bundlegen run --level full --engine "$ENGINE" --device cuda --workers-per-device 4 \
  --out out/atomic-dq-full > "$OUT/full.log" 2>&1
echo "all four levels: exit $?"
grep -E "^│ total|^time" "$OUT/full.log"
gzip -c out/atomic-dq-full/results.jsonl > "$OUT/full.results.jsonl.gz"
cp out/atomic-dq-full/run.json "$OUT/full.run.json"
