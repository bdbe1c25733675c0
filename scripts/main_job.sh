#!/usr/bin/env bash
# The main job: generate (dry run, with the report), then run the quick level on the
# default engine (triton) and device (the GPU if there is one, else the CPU through the
# Triton interpreter).
# On the CPU one worker per core (at most 8), each with one thread: the interpreter runs
# one program after another in one thread, and a worker whose float64 oracle spreads its
# small products over several OpenMP threads waits on them (many times slower on a loaded
# host); the workers share the level's cases, longest predicted first.
source "$(dirname "$0")/env.sh"
bundlegen generate --dry-run --report
if python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  bundlegen run --level quick --engine triton --device cuda "$@"
else
  workers=$(python -c 'import os; n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(); print(max(1, min(8, n or 1)))')
  bundlegen run --level quick --engine triton --device cpu --workers-per-device "$workers" "$@"
fi
