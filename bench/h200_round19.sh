#!/usr/bin/env bash
# Round 19 on one H200, in device calls of under ten minutes each: what a band's mask costs the
# kernels, and the cold run's compile floor (bench/results/h200/round19/README.md). The kernel
# changes it measured are not in the engine: apply one (e.g. `git apply
# bench/results/h200/round19/two_phase_dkdv.patch`) to time it against the engine before it.
# BEFORE names the folder bench/before_engine.py wrote (default: before), which holds the
# engine as committed before the change (package triton_before). STEPS picks what a call runs
# (default: all, in this order), and a step that would start after LIMIT_S seconds is
# skipped, saying so:
#   speed      bench/engine_speed.py over bf16 D 64-256 at S 4000 (tiles not whole), 4096 and
#              16384, causal and not, with the engine before and torch-cudnn and torch-flash
#              as peers, 3 rounds
#   targets    bench/engine_speed.py --quick --rounds 7, the same peers
#   tune       bench/tune_triton.py at D 128, causal and not: the dK/dV and dQ kernels' tiles
#   atomic     bench/engine_speed.py --quick --atomic-dq against the engine before's atomic-dQ
#              engine, 3 rounds
#   stages     bench/compile_stages.py --jobs 15 (the four levels' kernels, each compile stage's
#              time), then the four levels' variants compiled in an empty cache, 15 processes
# Results go to $OUT (default bench/results/h200-round19).
#   python bench/before_engine.py --rev REV --out before
#   STEPS="targets speed" OUT=/some/dir bash bench/h200_round19.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200-round19}
LIMIT_S=${LIMIT_S:-540}
STEPS=${STEPS:-speed targets tune atomic stages}
BEFORE=${BEFORE:-before}
source bench/h200_steps.sh
BEFORE_PEER=triton_before.engine_before:BeforeEngine

if wanted speed; then band_speed torch-flash torch-cudnn "$BEFORE_PEER"; fi
if wanted targets; then
  PYTHONPATH="$BEFORE${PYTHONPATH:+:$PYTHONPATH}" PEERS="torch-flash torch-cudnn $BEFORE_PEER" \
    engine_targets "${TARGET_ROUNDS:-7}"
fi
if wanted tune; then
  timeout "$(left)" python3 bench/tune_triton.py --d 128 --masks full causal \
    --out "$OUT/tune128.json" > "$OUT/tune128.log" 2>&1
  echo "tune: exit $?"; grep -v "^  drop" "$OUT/tune128.log" | tail -n 45
fi
if wanted atomic; then
  PYTHONPATH="$BEFORE${PYTHONPATH:+:$PYTHONPATH}" timeout "$(left)" python3 bench/engine_speed.py \
    --quick --rounds 3 --atomic-dq --peers triton_before.engine:TritonAtomicDqEngine \
    --out "$OUT/engine_speed_atomic.json" > "$OUT/engine_speed_atomic.log" 2>&1
  echo "atomic: exit $?"; tail -n 12 "$OUT/engine_speed_atomic.log"
fi
if wanted stages; then
  timeout "$(left)" python3 bench/compile_stages.py --jobs 15 --json "$OUT/compile_stages.json" \
    > "$OUT/compile_stages.log" 2>&1
  echo "stages: exit $?"; grep -v -i warn "$OUT/compile_stages.log" | tail -n 18
  compile_all current bundlegen.engines.triton.warm
fi
