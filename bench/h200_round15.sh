#!/usr/bin/env bash
# Round 15 on one H200, in device calls of under ten minutes each. STEPS picks what a call
# runs (default: all, in this order), and a step that would start after LIMIT_S seconds is
# skipped, saying so:
#   start        where a worker's start goes: whether the host writes bytecode, then
#                bench/worker_start.py with 8 workers at once, in the host's environment
#                (--host-env) and in a worker's (harness/pycache.py: bytecode under a cache
#                prefix where the host writes none)
#   full         all four levels against triton, 8 workers through MPS, in the Triton cache
#                as the host has it (empty on a fresh host: the cold run)
#   again        the same again (warm), then the quick level alone
#   targets      bench/engine_speed.py --quick --rounds 5 (the cuDNN and torch-flash ratios;
#                PEERS: the engines beside triton, default torch-flash torch-cudnn)
#   profile      bench/case_profile.py over every 4th case of the four levels, one thread
# Results go to $OUT (default bench/results/h200-round15).
#   STEPS="start full again" OUT=/some/dir bash bench/h200_round15.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200-round15}
LIMIT_S=${LIMIT_S:-540}
STEPS=${STEPS:-start full again targets profile}
source bench/h200_steps.sh

if wanted start; then
  python3 -c 'import sys, os, torch; d = os.path.dirname(torch.__file__); print("torch at", d, "writable", os.access(d, os.W_OK), "dont_write_bytecode", sys.flags.dont_write_bytecode, "pycache dirs", sum(n == "__pycache__" for _, ds, _ in os.walk(d) for n in ds))' 2>&1 | tee "$OUT/start_env.log"
  worker_start_w8 host --host-env
  worker_start_w8 worker
fi
if wanted full; then full_run full full; fi
if wanted again; then full_run full-again full; full_run quick-again quick; fi
if wanted targets; then engine_targets "${TARGET_ROUNDS:-5}"; fi
if wanted profile; then
  timeout "$(left)" python3 bench/case_profile.py --level full --engine triton --device cuda --every 4 \
    --threads 1 --out "$OUT/case_profile.json" > "$OUT/case_profile.log" 2>&1
  echo "profile: exit $?"; tail -n 30 "$OUT/case_profile.log"
fi
