#!/usr/bin/env bash
# Round 18 on one H200, in device calls of under ten minutes each: one kernel for every band
# kind (kernels BAND, launch.band_flags) against the engine before it. BEFORE names the
# folder bench/before_engine.py wrote (default: before), which holds the engine as committed
# before the change (package triton_before). STEPS picks what a call runs (default: all, in
# this order), and a step that would start after LIMIT_S seconds is skipped, saying so:
#   compile    the four levels' variants compiled in an empty Triton cache, by the engine
#              before (python -m triton_before.warm) and then by the current one
#              (python -m bundlegen.engines.triton.warm), 15 processes each
#   full       all four levels against triton, 8 workers through MPS, in the Triton cache as
#              the host has it (empty on a fresh host: the cold run)
#   again      the same again (warm), then the quick level alone three times
#   speed      bench/engine_speed.py over bf16 D 64-256 at S 4000 (tiles not whole), 4096 and
#              16384, causal and not, with the engine before and torch-cudnn and torch-flash
#              as peers, 3 rounds
#   targets    bench/engine_speed.py --quick --rounds 7, the same peers
# Results go to $OUT (default bench/results/h200-round18).
#   python bench/before_engine.py --rev REV --out before
#   STEPS="compile full again" OUT=/some/dir bash bench/h200_round18.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200-round18}
LIMIT_S=${LIMIT_S:-540}
STEPS=${STEPS:-compile full again speed targets}
BEFORE=${BEFORE:-before}
source bench/h200_steps.sh
BEFORE_PEER=triton_before.engine_before:BeforeEngine

if wanted compile; then
  compile_all before triton_before.warm
  compile_all after bundlegen.engines.triton.warm
fi
if wanted full; then full_run full full; fi
if wanted again; then
  full_run full-again full
  for n in 1 2 3; do full_run "quick-again-$n" quick; done
fi
if wanted speed; then band_speed torch-flash torch-cudnn "$BEFORE_PEER"; fi
if wanted targets; then
  PYTHONPATH="$BEFORE${PYTHONPATH:+:$PYTHONPATH}" PEERS="torch-flash torch-cudnn $BEFORE_PEER" \
    engine_targets "${TARGET_ROUNDS:-7}"
fi
