#!/usr/bin/env bash
# Round 20 on one H200: kernel and config changes timed against the engine as committed
# before them (bench/results/h200/round20/README.md). Each probe is a patch in
# bench/results/h200/round20, applied to the files the call started with: even_dq.patch (the
# dQ kernel's mask branch left out where every block is whole: EVEN and no band),
# dp_early.patch (even_dq, and dP issued right after S in both kernels, before the exp2),
# banded_A.patch and banded_B.patch (configs.py). STEPS picks what a call runs (default: all,
# in this order):
#   tune       bench/tune_triton.py at D 128, causal and not, with the kernels as committed,
#              then each patch, twice over in turns
#   targets    bench/engine_speed.py --quick --rounds 7 with each patch applied, against the
#              engine as committed (BEFORE, package triton_before) and torch-cudnn
# and, with the files the call started with (call 2 on: the changes taken):
#   tuneall    bench/tune_triton.py at D 64, 128, 192 and 256, causal and not (the "dpf" tiles)
#   speed      bench/engine_speed.py over bf16 D 64-256 at S 4000, 4096 and 16384, causal and
#              not, against BEFORE, torch-flash and torch-cudnn, 3 rounds
#   final      bench/engine_speed.py --quick --rounds 9 against the same peers
#   levels     all four levels against triton in an empty Triton cache (cold), again (warm),
#              then the quick level three times (8 workers per GPU, --mps)
#   tune64     bench/tune_triton.py at D 64 and 192, causal and not (the configs taken)
#   banded     bench/engine_speed.py over bf16 D 64 and 128 at S 4096, 5 rounds, against BEFORE
#              and torch-cudnn, in turns: the configs taken, banded_A.patch (D 128's band
#              config the non-banded one: 64 x 128 tiles, 8 warps), banded_B.patch (D 64's band
#              config none), the configs taken again
# Results go to $OUT (default bench/results/h200-round20).
#   python bench/before_engine.py --rev HEAD --out before
#   STEPS="tune targets" OUT=/some/dir bash bench/h200_round20.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200-round20}
LIMIT_S=${LIMIT_S:-540}
STEPS=${STEPS:-tune targets levels tune64 banded tuneall speed final}
BEFORE=${BEFORE:-before}
PATCHES=bench/results/h200/round20
source bench/h200_steps.sh
save_committed

if wanted tune; then patched_tune_turns "full causal" committed even_dq dp_early; fi
if wanted targets; then
  for name in dp_early even_dq; do
    patched_targets "engine_speed_targets_$name" "$name" "${TARGET_ROUNDS:-7}" || break
  done
fi
with_kernels committed
if wanted levels; then
  TRITON_CACHE_DIR=$(mktemp -d)
  export TRITON_CACHE_DIR
  full_run full full
  full_run full-again full
  for n in 1 2 3; do full_run "quick-again-$n" quick; done
  unset TRITON_CACHE_DIR
fi
if wanted tune64; then
  timeout "$(left)" python3 bench/tune_triton.py --d 64 192 --masks full causal \
    --out "$OUT/tune64.json" > "$OUT/tune64.log" 2>&1
  echo "tune64: exit $?"; grep -v "^  drop" "$OUT/tune64.log" | grep -E "^D|ms " | head -n 70
fi
if wanted banded; then
  turn=0
  for name in committed banded_A banded_B committed; do
    turn=$((turn + 1))
    in_time "banded $name" || break
    with_kernels "$name" || continue
    PYTHONPATH="$BEFORE${PYTHONPATH:+:$PYTHONPATH}" timeout "$(left)" python3 bench/engine_speed.py \
      --dtypes bf16 --head-dims 64 128 --seqs 4096 --rounds 5 --peers torch-cudnn "$BEFORE_PEER" \
      --out "$OUT/banded_${turn}_$name.json" > "$OUT/banded_${turn}_$name.log" 2>&1
    echo "banded $turn $name: exit $?"; grep -E "^B4" "$OUT/banded_${turn}_$name.log" | tail -n 8
  done
  with_kernels committed
fi
if wanted tuneall; then
  timeout "$(left)" python3 bench/tune_triton.py --d 64 128 192 256 --masks full causal \
    --out "$OUT/tuneall.json" > "$OUT/tuneall.log" 2>&1
  echo "tuneall: exit $?"; grep -E "table config|best dK/dV|dpf" "$OUT/tuneall.log" | head -n 60
fi
if wanted speed; then band_speed torch-flash torch-cudnn "$BEFORE_PEER"; fi
if wanted final; then
  PYTHONPATH="$BEFORE${PYTHONPATH:+:$PYTHONPATH}" PEERS="torch-flash torch-cudnn $BEFORE_PEER" \
    engine_targets "${TARGET_ROUNDS:-9}"
fi
