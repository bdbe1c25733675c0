#!/usr/bin/env bash
# Round 14 on one H200, in device calls of under ten minutes each. STEPS picks what a call
# runs (default: all, in this order), and a step that would start after LIMIT_S seconds is
# skipped, saying so:
#   host         bench/host_overhead.py: the triton engine's run() against the same launches
#                prepared once (what run()'s host work costs on the GPU's clock)
#   cold         the compile of every variant of the four levels into an empty Triton cache
#                (python -m bundlegen.engines.triton.warm --jobs 15), then the same with the
#                compile plan of WARM_BEFORE (a copy of an earlier warm.py), when given
#   pairs        bench/pair_probe.py, causal D 128: dK/dV tiles near the banded table's x dQ
#                tiles with 3-5 stages, beside each other (the side stream), both launch orders
#   targets      bench/engine_speed.py --quick --rounds 7 (the cuDNN and torch-flash ratios;
#                PEERS: the engines beside triton, default torch-flash torch-cudnn)
#   full         all four levels against triton, 8 workers through MPS, in the Triton cache
#                as the host has it (empty on a fresh host: the cold run)
#   again        the same again (warm), then the quick level alone
# Results go to $OUT (default bench/results/h200-round14).
#   STEPS="host cold" OUT=/some/dir bash bench/h200_round14.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200-round14}
LIMIT_S=${LIMIT_S:-540}
STEPS=${STEPS:-host cold pairs targets full again}
source bench/h200_steps.sh

if wanted host; then
  timeout "$(left)" python3 bench/host_overhead.py --out "$OUT/host_overhead.json" 2>&1 | tee "$OUT/host_overhead.log"
fi
if wanted cold; then
  for plan in now ${WARM_BEFORE:+before}; do
    cache=$(mktemp -d)
    if [ "$plan" = now ]; then cmd=(python3 -m bundlegen.engines.triton.warm); else cmd=(python3 "$WARM_BEFORE"); fi
    start=$SECONDS
    TRITON_CACHE_DIR=$cache timeout "$(left)" "${cmd[@]}" --jobs 15 > "$OUT/cold_$plan.log" 2>&1
    echo "cold ($plan): exit $?, $((SECONDS - start)) s"; tail -n 3 "$OUT/cold_$plan.log"
    rm -rf "$cache"
  done
fi
if wanted pairs; then
  timeout "$(left)" python3 bench/pair_probe.py --d 128 --causal causal --rounds ${ROUNDS:-3} \
    --dkdv ${DKDV:-32,64,4,4 32,64,4,3 64,128,8,3} --dq ${DQ:-128,64,8,3 128,64,8,4 128,64,8,5} \
    --out "$OUT/pair_probe.json" > "$OUT/pair_probe.log" 2>&1
  echo "pairs: exit $?"; tail -n 30 "$OUT/pair_probe.log"
fi
if wanted targets; then
  timeout "$(left)" python3 bench/engine_speed.py --quick --rounds ${TARGET_ROUNDS:-7} \
    --peers ${PEERS:-torch-flash torch-cudnn} --out "$OUT/engine_speed_targets.json" > "$OUT/engine_speed_targets.log" 2>&1
  echo "targets: exit $?"; tail -n 16 "$OUT/engine_speed_targets.log"
fi
if wanted full; then full_run full full; fi
if wanted again; then full_run full-again full; full_run quick-again quick; fi
