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
full_run() {   # name, level: bundlegen run into $OUT/name, keeping its log, run.json and results
  timeout "$(left)" bundlegen run --level "$2" --engine triton --device cuda --workers-per-device 8 \
    --mps --out "$OUT/$1" > "$OUT/$1.log" 2>&1
  echo "$1: exit $?"; tail -n 14 "$OUT/$1.log"
  cp "$OUT/$1/run.json" "$OUT/$1.run.json" 2>/dev/null
  gzip -c "$OUT/$1/results.jsonl" > "$OUT/$1.results.jsonl.gz" 2>/dev/null
  rm -rf "${OUT:?}/$1"
}
