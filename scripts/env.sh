# Sourced by the set-up scripts: make .venv, install torch 2.13.0 first (on the CPU
# machines this takes the CPU build from local disk, where a bare `torch` requirement
# would pull a multi-GB CUDA build), then the project with its test extra (which holds the
# triton and report extras too, so the tests run every engine and the report's plots).
# pyproject.toml's digest is kept in the venv: when the dependencies change, the next run
# installs them again.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/bundlegen ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q torch==2.13.0
fi
stamp=.venv/.bundlegen-pyproject.sha256
if ! sha256sum --status -c "$stamp" 2>/dev/null; then
  .venv/bin/pip install -q -e '.[test]'
  sha256sum pyproject.toml > "$stamp"
fi
. .venv/bin/activate
