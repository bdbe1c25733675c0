#!/usr/bin/env bash
# The test suite (what CI runs): unit tests, generator checks, the CPU mutation gate.
source "$(dirname "$0")/env.sh"
python -m pytest -q -n 2 "$@"
