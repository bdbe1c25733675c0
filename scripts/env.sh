# Sourced by the set-up scripts: make .venv, install torch 2.13.0 first (on the CPU
# machines this takes the CPU build from local disk, where a bare `torch` requirement
# would pull a multi-GB CUDA build), then the project with its test extras.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/bundlegen ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q torch==2.13.0
  .venv/bin/pip install -q -e '.[test]'
fi
. .venv/bin/activate
