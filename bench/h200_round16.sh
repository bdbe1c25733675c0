#!/usr/bin/env bash
# Round 16 on one H200, in device calls of under ten minutes each. STEPS picks what a call
# runs (default: all, in this order), and a step that would start after LIMIT_S seconds is
# skipped, saying so:
#   start        bench/worker_start.py with 8 workers at once, the CUDA context opened beside
#                import torch (harness/gpu_early.py) and after it (--no-early-context)
#   full         all four levels against triton, 8 workers through MPS, in the Triton cache
#                as the host has it (empty on a fresh host: the cold run)
#   again        the same again (warm), then the quick level alone
#   nowarm       again's two runs without the workers' warm-up of the case path
#                (BUNDLEGEN_WARM_PATH=0, harness/warm_path.py)
#   workers      the warm run again with 6, 10 and 12 workers (beside again's 8)
#   first        bench/first_case.py: a fresh worker's first quick cases, the first under
#                cProfile, with and without the warm-up of the case path
#   finish       the quick level under cProfile: where the parent's time goes (the finish:
#                stopping the workers and the MPS server, junit, run.json)
#   targets      bench/engine_speed.py --quick --rounds 5 (the cuDNN and torch-flash ratios;
#                PEERS: the engines beside triton, default torch-flash torch-cudnn)
# Results go to $OUT (default bench/results/h200-round16).
#   STEPS="start full again" OUT=/some/dir bash bench/h200_round16.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200-round16}
LIMIT_S=${LIMIT_S:-540}
STEPS=${STEPS:-start full again nowarm workers first finish targets}
source bench/h200_steps.sh

if wanted start; then
  worker_start_w8 early
  worker_start_w8 late --no-early-context
fi
if wanted full; then full_run full full; fi
if wanted again; then full_run full-again full; full_run quick-again quick; fi
if wanted nowarm; then
  BUNDLEGEN_WARM_PATH=0 full_run full-again-nowarm full; BUNDLEGEN_WARM_PATH=0 full_run quick-again-nowarm quick
fi
if wanted workers; then
  for n in 6 10 12; do WORKERS=$n full_run "full-again-w$n" full; done
fi
if wanted first; then
  for warm in on off; do
    timeout "$(left)" python3 bench/first_case.py --level quick --engine triton --device cuda --cases 8 \
      $([ $warm = off ] && echo --no-warm-path) --json "$OUT/first_case_warm_$warm.json" \
      > "$OUT/first_case_warm_$warm.log" 2>&1
    echo "first (warm-up $warm): exit $?"; tail -n 40 "$OUT/first_case_warm_$warm.log"
  done
fi
if wanted finish; then finish_profile 70; fi
if wanted targets; then engine_targets "${TARGET_ROUNDS:-5}"; fi
