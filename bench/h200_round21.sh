#!/usr/bin/env bash
# Round 21 on one H200: two forms of the band's mask in the dK/dV and dQ kernels, timed
# against the engine as committed before them (bench/results/h200/round21/README.md). Each
# probe is a patch in bench/results/h200/round21, applied to the files the call started with:
#   select_only  the exp2 of P before the band's branch, the branch keeping only the select
#                (P = where(keep, P, 0)), in both kernels
#   keep_even    select_only, and _keep without the sequences' compares where every tile is
#                whole (EVEN)
#   keep_only    _keep as keep_even's, the branches as committed
#   keep_even_one_chunk  keep_even where the head dims are one chunk, the two-chunk kernels'
#                branches as committed (select_only made D 192 causal 0.73-0.75x, call 2)
#   band_dpf3    configs.py: D 128's band config on 3 stages with dp_first (the fastest dK/dV
#                candidate of the tune step, call 1)
# STEPS picks what a call runs (default: all, in this order):
#   tune       bench/tune_triton.py at D 128, causal, with the kernels as committed, then each
#              patch, twice over in turns
#   targets    bench/engine_speed.py --quick --rounds 7 with each patch applied, against the
#              engine as committed (BEFORE, package triton_before) and torch-cudnn
#   band       bench/engine_speed.py over bf16 D 64, 128 and 256 at S 4096 and 16384, causal
#              and not, 3 rounds, with keep_even applied, against BEFORE and torch-cudnn
#   cfg        bench/engine_speed.py --quick --rounds 9 against BEFORE and torch-cudnn with
#              each of CFG (default band_dpf3, keep_even+band_dpf3, committed), twice over in
#              turns
#   grid       bench/engine_speed.py over bf16 and fp16 D (GRID_DIMS, default 64 128 192 256)
#              at S 4096 and 16384, causal and not, 3 rounds, with PATCH applied, against
#              BEFORE, torch-flash and torch-cudnn
#   levels     for each of LEVELS_FOR (default PATCH, else committed): all four levels against
#              triton in an empty Triton cache (cold), again (warm), then quick three times
# Results go to $OUT (default bench/results/h200-round21).
#   python bench/before_engine.py --rev HEAD --out before
#   STEPS="tune targets" OUT=/some/dir bash bench/h200_round21.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200-round21}
LIMIT_S=${LIMIT_S:-540}
STEPS=${STEPS:-tune targets band}
BEFORE=${BEFORE:-before}
PATCHES=bench/results/h200/round21
source bench/h200_steps.sh
save_committed

if wanted tune; then patched_tune_turns "causal" committed select_only keep_even; fi
if wanted targets; then
  for name in select_only keep_even; do
    patched_targets "engine_speed_targets_$name" "$name" "${TARGET_ROUNDS:-7}" || break
  done
fi
if wanted band; then
  with_kernels keep_even
  PYTHONPATH="$BEFORE${PYTHONPATH:+:$PYTHONPATH}" timeout "$(left)" python3 bench/engine_speed.py \
    --dtypes bf16 --head-dims 64 128 256 --seqs 4096 16384 --rounds 3 \
    --peers torch-cudnn "$BEFORE_PEER" --out "$OUT/engine_speed_band.json" > "$OUT/engine_speed_band.log" 2>&1
  echo "band: exit $?"; grep -E "^B" "$OUT/engine_speed_band.log" | tail -n 14
fi
if wanted cfg; then
  for turn in 1 2; do
    for name in ${CFG:-band_dpf3 keep_even+band_dpf3 committed}; do
      patched_targets "cfg_${name}_$turn" "$name" 9 || break
    done
  done
fi
if wanted grid; then
  with_kernels "${PATCH:-committed}"
  PYTHONPATH="$BEFORE${PYTHONPATH:+:$PYTHONPATH}" timeout "$(left)" python3 bench/engine_speed.py \
    --head-dims ${GRID_DIMS:-64 128 192 256} --seqs 4096 16384 --rounds 3 \
    --peers torch-flash torch-cudnn "$BEFORE_PEER" --out "$OUT/engine_speed_grid.json" \
    > "$OUT/engine_speed_grid.log" 2>&1
  echo "grid: exit $?"; grep -E "^B" "$OUT/engine_speed_grid.log" | tail -n 40
fi
if wanted levels; then
  for name in ${LEVELS_FOR:-${PATCH:-committed}}; do
    in_time "levels $name" || break
    with_kernels "$name" || continue
    tag=${name//+/-}
    TRITON_CACHE_DIR=$(mktemp -d)
    export TRITON_CACHE_DIR
    full_run "$tag-full" full
    full_run "$tag-full-again" full
    for n in 1 2 3; do full_run "$tag-quick-again-$n" quick; done
    unset TRITON_CACHE_DIR
  done
fi
with_kernels committed
