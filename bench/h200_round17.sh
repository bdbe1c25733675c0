#!/usr/bin/env bash
# Round 17 on one H200, in device calls of under ten minutes each. STEPS picks what a call
# runs (default: all, in this order), and a step that would start after LIMIT_S seconds is
# skipped, saying so:
#   full       all four levels against triton, 8 workers through MPS, in the Triton cache as
#              the host has it (empty on a fresh host: the cold run)
#   again      the same again (warm), then the quick level alone three times
#   norelease  again's runs with every worker stopped after the last case and waited for
#              (BUNDLEGEN_EARLY_RELEASE=0) instead of each as soon as no case is left for it,
#              and the run not waiting for their exits
#   exit       bench/worker_exit.py: 8 MPS clients stopped, waiting for their exits or not,
#              and the MPS server's quit after
#   shared     all four levels and quick, twice each, in turns with every worker preparing
#              (BUNDLEGEN_SHARED_PREPARE=0) and with the joiners skipping the Triton
#              engine's host-shared prepare (Engine.prepare_shared)
#   nowarm     the quick level without the workers' warm-up of the case path
#              (BUNDLEGEN_WARM_PATH=0, harness/warm_path.py)
#   workers    the quick level with 4, 6 and 12 workers, and all four levels with 12
#   finish     the quick level under cProfile: where the parent's time goes
#   priority   bench/overlap_probe.py --priorities: the side stream's dQ kernel beside the
#              dK/dV pass with either stream at a higher priority (D 64, 128, 256, S 4096)
#   targets    bench/engine_speed.py --quick --rounds 7 (the cuDNN and torch-flash ratios)
# Results go to $OUT (default bench/results/h200-round17).
#   STEPS="full again" OUT=/some/dir bash bench/h200_round17.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200-round17}
LIMIT_S=${LIMIT_S:-540}
STEPS=${STEPS:-full exit again norelease shared nowarm workers finish priority targets}
source bench/h200_steps.sh

if wanted full; then full_run full full; fi
if wanted exit; then
  timeout "$(left)" python3 bench/worker_exit.py --engine triton --device cuda --workers 8 --mps \
    --repeat 2 --json "$OUT/worker_exit.json" > "$OUT/worker_exit.log" 2>&1
  echo "exit: exit $?"; cat "$OUT/worker_exit.log"
fi
leftovers() {   # what of a run is still alive: its workers, the MPS daemon and server
  ps -eo pid,etimes,args | grep -E "bundlegen.harness.worker|nvidia-cuda-mps" | grep -v grep || echo "(none)"
}
if wanted again; then
  full_run full-again full
  for n in 1 2 3; do full_run "quick-again-$n" quick; done
  echo "left right after the last run:"; leftovers; sleep 2; echo "2 s later:"; leftovers
fi
if wanted norelease; then
  BUNDLEGEN_EARLY_RELEASE=0 full_run full-again-norelease full
  for n in 1 2 3; do BUNDLEGEN_EARLY_RELEASE=0 full_run "quick-again-norelease-$n" quick; done
fi
if wanted shared; then
  for n in 1 2; do
    BUNDLEGEN_SHARED_PREPARE=0 full_run "full-again-prepare-all-$n" full; full_run "full-again-shared-$n" full
    BUNDLEGEN_SHARED_PREPARE=0 full_run "quick-again-prepare-all-$n" quick; full_run "quick-again-shared-$n" quick
  done
fi
if wanted nowarm; then BUNDLEGEN_WARM_PATH=0 full_run quick-again-nowarm quick; fi
if wanted workers; then
  for n in 4 6 12; do WORKERS=$n full_run "quick-again-w$n" quick; done
  WORKERS=12 full_run full-again-w12 full
fi
if wanted finish; then finish_profile 50; fi
if wanted priority; then
  timeout "$(left)" python3 bench/overlap_probe.py --d 64 128 256 --seqs 4096 --rounds 5 --priorities \
    --out "$OUT/overlap_priority.json" > "$OUT/overlap_priority.log" 2>&1
  echo "priority: exit $?"; cat "$OUT/overlap_priority.log"
fi
if wanted targets; then engine_targets "${TARGET_ROUNDS:-7}"; fi
