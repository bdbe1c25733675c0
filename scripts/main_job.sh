#!/usr/bin/env bash
# The main job: generate (dry run, with the report), then run the quick level on the
# default engine (triton) and device (the GPU if there is one, else the CPU through the
# Triton interpreter).
source "$(dirname "$0")/env.sh"
bundlegen generate --dry-run --report
if python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  bundlegen run --level quick --engine triton --device cuda "$@"
else
  bundlegen run --level quick --engine triton --device cpu "$@"
fi
