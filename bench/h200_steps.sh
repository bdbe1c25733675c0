# Sourced by bench/h200_round*.sh after they set OUT, LIMIT_S and STEPS: makes OUT, prints
# the software, and defines the step helpers (a step that would start after LIMIT_S
# seconds is skipped, saying so).
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(), "x", torch.cuda.device_count())'

in_time() {   # step name: true while there is time to start it
  if (( SECONDS > LIMIT_S )); then echo "SKIPPED (time): $1"; return 1; fi
}
wanted() { [[ " $STEPS " == *" $1 "* ]] && in_time "$1"; }
left() { echo $(( LIMIT_S + 50 - SECONDS > 30 ? LIMIT_S + 50 - SECONDS : 30 )); }
full_run() {   # name, level: bundlegen run into $OUT/name (WORKERS per GPU, default 8), keeping its log, run.json and results
  timeout "$(left)" bundlegen run --level "$2" --engine triton --device cuda --workers-per-device "${WORKERS:-8}" \
    --mps --out "$OUT/$1" > "$OUT/$1.log" 2>&1
  echo "$1: exit $?"; tail -n 14 "$OUT/$1.log"
  cp "$OUT/$1/run.json" "$OUT/$1.run.json" 2>/dev/null
  gzip -c "$OUT/$1/results.jsonl" > "$OUT/$1.results.jsonl.gz" 2>/dev/null
  rm -rf "${OUT:?}/$1"
}
worker_start_w8() {   # name, extra flags: bench/worker_start.py, 8 workers at once, twice, into $OUT/start_worker_start_w8_name.*
  local name=$1; shift
  timeout "$(left)" python3 bench/worker_start.py --engine triton --device cuda --repeat 2 --workers 8 \
    "$@" --json "$OUT/start_worker_start_w8_$name.json" > "$OUT/start_worker_start_w8_$name.log" 2>&1
  echo "worker_start ($name): exit $?"; tail -n 3 "$OUT/start_worker_start_w8_$name.log"
}
engine_targets() {   # rounds: bench/engine_speed.py --quick against PEERS (default torch-flash torch-cudnn)
  timeout "$(left)" python3 bench/engine_speed.py --quick --rounds "$1" \
    --peers ${PEERS:-torch-flash torch-cudnn} --out "$OUT/engine_speed_targets.json" > "$OUT/engine_speed_targets.log" 2>&1
  echo "targets: exit $?"; tail -n 16 "$OUT/engine_speed_targets.log"
}
finish_profile() {   # lines: the quick level under cProfile, 8 workers with --mps; the first lines of where the parent's time goes
  timeout "$(left)" python3 -m cProfile -o "$OUT/finish_quick.prof" -m bundlegen run --level quick \
    --engine triton --device cuda --workers-per-device 8 --mps --quiet --out "$OUT/finish-quick" \
    > "$OUT/finish_quick.log" 2>&1
  echo "finish: exit $?"; tail -n 2 "$OUT/finish_quick.log"
  python3 -c '
import pstats, sys
stats = pstats.Stats(sys.argv[1]); stats.sort_stats("cumulative")
stats.print_stats(r"harness/(run|mps|results|worker)\.py|cli\.py|rich", 40)' "$OUT/finish_quick.prof" \
    > "$OUT/finish_quick_stats.txt" 2>&1
  sed -n "1,${1}p" "$OUT/finish_quick_stats.txt"; rm -rf "$OUT/finish-quick"
}
compile_all() {   # name, module: the module's warm.py over the four levels in an empty cache, 15 processes (PYTHONPATH gets BEFORE, default before)
  local cache; cache=$(mktemp -d)
  TRITON_CACHE_DIR=$cache PYTHONPATH="${BEFORE:-before}${PYTHONPATH:+:$PYTHONPATH}" timeout "$(left)" \
    python3 -m "$2" --jobs 15 --bundles bundles > "$OUT/compile_$1.log" 2>&1
  echo "compile ($1): exit $?"; grep -v "kernels compiled (" "$OUT/compile_$1.log" | tail -n 3
  rm -rf "$cache"
}
band_speed() {   # peers: bench/engine_speed.py over bf16 D 64-256 at S 4000, 4096 and 16384, causal and not, 3 rounds, into $OUT/engine_speed_band.*
  PYTHONPATH="${BEFORE:-before}${PYTHONPATH:+:$PYTHONPATH}" timeout "$(left)" python3 bench/engine_speed.py \
    --dtypes bf16 --head-dims 64 128 192 256 --seqs 4000 4096 16384 --rounds 3 \
    --peers "$@" --out "$OUT/engine_speed_band.json" > "$OUT/engine_speed_band.log" 2>&1
  echo "speed: exit $?"; tail -n 40 "$OUT/engine_speed_band.log"
}
# Patch probes (rounds 20 and 21): PATCHES names the folder of the round's patches; a kernels
# name is "committed" (kernels.py and configs.py as the call found them, saved by
# save_committed; not from git: the device's copy may hold a HEAD without the working tree's
# changes) or patch names joined by "+", each PATCHES/<name>.patch applied to those files.
BEFORE_PEER=triton_before.engine_before:BeforeEngine
save_committed() {
  cp engines/triton/kernels.py "$OUT/kernels.committed.py"
  cp engines/triton/configs.py "$OUT/configs.committed.py"
}
with_kernels() {   # kernels name
  cp "$OUT/kernels.committed.py" engines/triton/kernels.py
  cp "$OUT/configs.committed.py" engines/triton/configs.py
  if [ "$1" = committed ]; then return 0; fi
  local part
  for part in ${1//+/ }; do
    if ! patch -s -p1 --no-backup-if-mismatch -r - < "$PATCHES/$part.patch"; then
      with_kernels committed   # no half-patched files left behind
      return 1
    fi
  done
}
# patched_tune and patched_targets return 1 (stop the loop) once a step would start too late
patched_tune() {   # out name, kernels name, masks...: bench/tune_triton.py at D 128 with those kernels, into $OUT/<out name>.*
  local name=$1 kernels=$2; shift 2
  in_time "$name" || return 1
  with_kernels "$kernels" || { echo "$name: a patch did not apply"; return 0; }
  timeout "$(left)" python3 bench/tune_triton.py --d 128 --masks "$@" --out "$OUT/$name.json" \
    > "$OUT/$name.log" 2>&1
  echo "$name: exit $?"; grep -E "table config|best dK/dV" "$OUT/$name.log"
  return 0
}
patched_tune_turns() {   # masks, kernels names...: patched_tune over the names, twice over in turns, into $OUT/tune128_<name>_<turn>.*
  local masks=$1 turn name; shift
  for turn in 1 2; do
    for name in "$@"; do
      patched_tune "tune128_${name}_$turn" "$name" $masks || return 1
    done
  done
}
patched_targets() {   # out name, kernels name, rounds: bench/engine_speed.py --quick with those kernels against torch-cudnn and the engine before (BEFORE, default before), into $OUT/<out name>.*
  in_time "$1" || return 1
  with_kernels "$2" || { echo "$1: a patch did not apply"; return 0; }
  PYTHONPATH="${BEFORE:-before}${PYTHONPATH:+:$PYTHONPATH}" timeout "$(left)" python3 bench/engine_speed.py \
    --quick --rounds "$3" --peers torch-cudnn "$BEFORE_PEER" --out "$OUT/$1.json" > "$OUT/$1.log" 2>&1
  echo "$1: exit $?"; grep -E "^B4|at or over" "$OUT/$1.log" | tail -n 4
  return 0
}
