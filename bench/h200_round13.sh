#!/usr/bin/env bash
# Round 13 on one H200, in device calls of under ten minutes each. STEPS picks what a call
# runs (default: all, in this order), and a step that would start after LIMIT_S seconds is
# skipped, saying so:
#   pairs        bench/pair_probe.py: D 128 dK/dV tiles x dQ tiles beside each other (the
#                side stream), both launch orders, against the table's pair
#   targets      bench/engine_speed.py --quick --rounds 7 (the cuDNN
#                and torch-flash ratios)
#   atomicfull   all four levels against triton-atomic-dq (the correctness run of its tiles)
#   zygote       bench/zygote_start.py: 8 triton workers always started plainly against the
#                default (restarts forked from the zygote), in turns, without and with MPS
#   fault        bench/mps_fault_check.py: a device-side assert in one of 4 workers, without
#                and with --mps (only the faulting case may be recorded as anything but a pass)
#   mpsbench     bench/harness_throughput.py (workers forked from the zygote), warm: 4
#                workers and `--mps` 8 workers, each also through `bundlegen serve`
#   mpsplain     the same without the zygote (BUNDLEGEN_ZYGOTE=0), not served
# Results go to $OUT (default bench/results/h200-round13).
#   STEPS="pairs targets" OUT=/some/dir bash bench/h200_round13.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/h200-round13}
LIMIT_S=${LIMIT_S:-540}
STEPS=${STEPS:-pairs targets atomicfull zygote fault mpsbench mpsplain}
source bench/h200_steps.sh

if wanted pairs; then
  timeout "$(left)" python3 bench/pair_probe.py --d 128 --rounds ${ROUNDS:-3} \
    --dkdv ${DKDV:-64,128,8,3 64,128,8,2 32,64,4,4 32,128,4,3 64,64,4,3} \
    --dq ${DQ:-128,64,8,3 128,64,8,2 64,64,4,3 128,128,8,2 64,128,8,3 128,32,8,3 64,64,8,3} \
    --out "$OUT/pair_probe.json" > "$OUT/pair_probe.log" 2>&1
  echo "pairs: exit $?"; grep -v "^D128 .*x table 0\.[0-8]" "$OUT/pair_probe.log" | head -60
fi
if wanted targets; then
  timeout "$(left)" python3 bench/engine_speed.py --quick --rounds ${TARGET_ROUNDS:-7} --atomic-dq \
    --peers torch-flash torch-cudnn --out "$OUT/engine_speed_targets.json" > "$OUT/engine_speed_targets.log" 2>&1
  echo "targets: exit $?"; tail -n 16 "$OUT/engine_speed_targets.log"
fi
if wanted atomicfull; then
  timeout "$(left)" bundlegen run --level full --engine bundlegen.engines.triton.engine:TritonAtomicDqEngine \
    --device cuda --workers-per-device 8 --mps --out "$OUT/atomic-full" > "$OUT/atomic_full.log" 2>&1
  echo "atomicfull: exit $?"; tail -n 12 "$OUT/atomic_full.log"
  cp "$OUT/atomic-full/run.json" "$OUT/atomic_full.run.json" 2>/dev/null
  gzip -c "$OUT/atomic-full/results.jsonl" > "$OUT/atomic_full.results.jsonl.gz" 2>/dev/null
  rm -rf "$OUT/atomic-full"
fi
if wanted zygote; then
  for mps in "" --mps; do
    timeout "$(left)" python3 bench/zygote_start.py --engine triton --device cuda --workers 8 \
      --rounds ${ZYGOTE_ROUNDS:-3} $mps --json "$OUT/zygote_start${mps:+_mps}.json" 2>&1 | tee "$OUT/zygote_start${mps:+_mps}.log"
  done
fi
if wanted fault; then
  timeout "$(left)" python3 bench/mps_fault_check.py --workers 4 --cases 48 2>&1 | tee "$OUT/mps_fault_check.log"
fi
if wanted mpsbench; then
  timeout "$(left)" python3 bench/harness_throughput.py --no-cold --no-one-worker --levels quick full \
    --workers 4 --mps-workers 8 --server --out "$OUT/harness_throughput_mps.json" \
    > "$OUT/harness_throughput_mps.log" 2>&1
  echo "mpsbench: exit $?"; tail -n 50 "$OUT/harness_throughput_mps.log"
fi
if wanted mpsplain; then
  BUNDLEGEN_ZYGOTE=0 timeout "$(left)" python3 bench/harness_throughput.py --no-cold --no-one-worker \
    --levels quick full --workers 4 --mps-workers 8 --out "$OUT/harness_throughput_mps_plain.json" \
    > "$OUT/harness_throughput_mps_plain.log" 2>&1
  echo "mpsplain: exit $?"; tail -n 30 "$OUT/harness_throughput_mps_plain.log"
fi
echo "round done at ${SECONDS}s"
