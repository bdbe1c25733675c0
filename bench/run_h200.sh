#!/usr/bin/env bash
# The GPU measurements of issue 7 in one go, for one lent H200 call (~5 min): the harness
# throughput (all four levels cold, in a fresh Triton cache where the engine's prepare compiles
# in parallel, then each level warm), the cost model's fit and per-level error on those runs,
# the torch SDPA engines' self-check (bench/torch_sdpa_selfcheck.py), the target rows in
# interleaved rounds (engine_speed.py --quick --rounds 9) and the engine grid.
# Results go to $OUT (default bench/results/h200-run); nothing here is timed by a test.
#   OUT=/some/dir bash bench/run_h200.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200-run}
mkdir -p "$OUT"
RUNS=out/harness_throughput
step() { echo "== $1"; shift; ( "$@" ) > "$OUT/$LOG" 2>&1; echo "   exit $? (log $OUT/$LOG)"; tail -n "${TAIL:-12}" "$OUT/$LOG"; }

LOG=harness.log TAIL=40 step "harness throughput (cold, then warm)" timeout 1800 python3 bench/harness_throughput.py --levels quick pr nightly full --workers 4 --out "$OUT/harness_throughput_h200.json"
LOG=calibrate.log TAIL=30 step "cost model fit" python3 -m bundlegen calibrate $RUNS/warm-quick-cuda-x1 $RUNS/warm-pr-cuda-x1 $RUNS/warm-nightly-cuda-x1 $RUNS/warm-full-cuda-x1 --device-class h200
tar czf "$OUT/harness_runs.tar.gz" $RUNS/*/results.jsonl $RUNS/*/run.json $RUNS/*/log.txt 2>/dev/null
LOG=torch_sdpa_selfcheck.log TAIL=40 step "torch SDPA engines self-check" timeout 120 python3 bench/torch_sdpa_selfcheck.py
LOG=engine_speed_targets.log TAIL=12 step "target rows, engines timed in turns" timeout 150 python3 bench/engine_speed.py --quick --rounds 9 --out "$OUT/engine_speed_targets.json"
# the grid writes its JSON after every shape, so whatever the time left allows is kept
LOG=engine_speed.log TAIL=60 step "engine grid" timeout $(( ${CALL_LIMIT_S:-580} - SECONDS > 60 ? ${CALL_LIMIT_S:-580} - SECONDS : 60 )) python3 bench/engine_speed.py --out "$OUT/engine_speed_h200.json"
