"""Write the Triton engine as committed at a git revision into a package of its own, so that
the engine before a change runs beside the current one on the same host, in one run:

    python bench/before_engine.py --rev HEAD --out before        # writes before/triton_before/
    PYTHONPATH=before python bench/engine_speed.py --quick --rounds 5 \
        --peers torch-cudnn triton_before.engine_before:BeforeEngine
    PYTHONPATH=before TRITON_CACHE_DIR=$(mktemp -d) python -m triton_before.warm --jobs 15

Every file of engines/triton is copied, its imports of the package rewritten to the copy's
name, so the copy launches its own launcher, kernels and configs, and compiles its own
variants (its warm.py). It runs with the current harness, graph and engine base class: the
revision's engine must still fit those. Run this where git is (the device machine has no
repository): the written folder travels with the working tree (or in `carry`).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "triton_before"
ENGINE = f"{PACKAGE}.engine_before:BeforeEngine"
SOURCE = "engines/triton"
IMPORT_NAME = "bundlegen.engines.triton"


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"before_engine: git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def write(rev: str, out: Path) -> Path:
    package = out / PACKAGE
    package.mkdir(parents=True, exist_ok=True)
    for path in _git("ls-tree", "--name-only", f"{rev}:{SOURCE}").split():
        text = _git("show", f"{rev}:{SOURCE}/{path}")
        if path.endswith(".py"):
            text = (text.replace(f"from {IMPORT_NAME} import", f"from {PACKAGE} import")
                        .replace(f"{IMPORT_NAME}.", f"{PACKAGE}."))
        (package / path).write_text(text)
    (package / "engine_before.py").write_text(
        f"from {PACKAGE}.engine import TritonEngine\n\n\n"
        "class BeforeEngine(TritonEngine):\n"
        f"    \"\"\"engines/triton at {rev} (bench/before_engine.py).\"\"\"\n"
        "    name = 'triton-before'\n")
    return package


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--out", type=Path, required=True, help="folder to put on PYTHONPATH")
    args = parser.parse_args(argv)
    package = write(args.rev, args.out)
    print(f"{package}: {SOURCE} at {args.rev}; peer {ENGINE} with PYTHONPATH={args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
