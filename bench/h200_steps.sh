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
