"""The environment of a test's subprocess that compiles for a GPU target (or lets the CLI
choose the interpreter itself): Triton is imported in one mode per process, and the engine
tests import it under the interpreter, so TRITON_INTERPRET is left out."""
from __future__ import annotations

import os


def gpu_compile_env(cache_dir=None) -> dict[str, str]:
    """os.environ without TRITON_INTERPRET; `cache_dir`: Triton's cache there (an empty
    folder: a compile, not a cache hit)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"   # silences Triton 3.9's notice (its default)
    if cache_dir is not None:
        env["TRITON_CACHE_DIR"] = str(cache_dir)
    return env
