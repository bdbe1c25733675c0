#!/usr/bin/env bash
# Every GPU measurement of issue 7 in one go, for one lent H200 call (~8 min):
# program orders, the harness throughput on a warm cache (all four levels, with the
# per-level prediction error of the cost model fitted to that very run), and the engine
# grid. Results go to $OUT (default bench/results/h200-run); nothing here is timed by a test.
#   OUT=/some/dir bash bench/run_h200.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200-run}
mkdir -p "$OUT"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/out/harness_throughput/triton-cache}
mkdir -p "$TRITON_CACHE_DIR"
step() { echo "== $1"; shift; ( "$@" ) > "$OUT/$LOG" 2>&1; echo "   exit $? (log $OUT/$LOG)"; tail -n "${TAIL:-12}" "$OUT/$LOG"; }

LOG=orders.log step "program orders" timeout 100 python3 bench/tune_triton.py --orders --out "$OUT/orders.json"
LOG=warm.log TAIL=2 step "kernel cache warm-up" timeout 120 python3 -m engines.triton.warm --levels quick pr nightly full --jobs 16
LOG=harness.log TAIL=40 step "harness throughput (warm)" timeout 240 python3 bench/harness_throughput.py --no-cold --out "$OUT/harness_throughput_h200.json"
LOG=calibrate.log TAIL=30 step "cost model fit" python3 -m bundlegen calibrate out/harness_throughput/warm-full --device-class h200
tar czf "$OUT/harness_runs.tar.gz" out/harness_throughput/warm-*/results.jsonl out/harness_throughput/warm-*/log.txt 2>/dev/null
# the grid writes its JSON after every shape, so whatever the time left allows is kept
LOG=engine_speed.log TAIL=60 step "engine grid" timeout $(( ${CALL_LIMIT_S:-580} - SECONDS > 60 ? ${CALL_LIMIT_S:-580} - SECONDS : 60 )) python3 bench/engine_speed.py --out "$OUT/engine_speed_h200.json"
