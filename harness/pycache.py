"""Bytecode for bundlegen's own Python processes (the CLI, workers, the zygote, and what they
start, such as the Triton engine's compile processes).

Where the environment sets PYTHONDONTWRITEBYTECODE (container images often do), Python
writes no bytecode, so every process compiles the sources of what it imports again: torch's
alone took 3.9-4.8 s of a GPU worker's start on an H200 host whose torch had no
__pycache__ (bench/results/h200/round15). Such processes get PYTHONPYCACHEPREFIX instead, a
folder under the user's cache: Python keeps the bytecode there, so the second start reads
it, and site-packages and the source tree stay as they are, which is what the setting asks
for. The CLI process takes the same prefix for its own imports once it starts
(keep_bytecode_in_this_process): on such a host it compiled the sources of every module it
imports before its first worker was started. BUNDLEGEN_PYCACHE=0 leaves the environment
alone; a PYTHONPYCACHEPREFIX already set is kept."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping

from bundlegen.harness import switches

OPT_OUT = "BUNDLEGEN_PYCACHE"


def cache_prefix(env: Mapping[str, str]) -> Path:
    """<XDG_CACHE_HOME or ~/.cache>/bundlegen/pycache (Python mirrors each source's path
    under it, so one folder serves every workspace and interpreter)."""
    root = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "bundlegen" / "pycache"


def with_bytecode(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a child Python process: PYTHONDONTWRITEBYTECODE replaced by a
    PYTHONPYCACHEPREFIX where it is set and neither the opt-out nor a prefix is."""
    out = dict(env)
    if (not env.get("PYTHONDONTWRITEBYTECODE") or env.get("PYTHONPYCACHEPREFIX")
            or switches.turned_off(OPT_OUT, env)):
        return out
    del out["PYTHONDONTWRITEBYTECODE"]
    out["PYTHONPYCACHEPREFIX"] = str(cache_prefix(env))
    return out


def keep_bytecode_in_this_process() -> bool:
    """This interpreter, from now on, as with_bytecode would start it: the cache prefix as
    sys.pycache_prefix, bytecode written there; whether it changed anything."""
    env = with_bytecode(os.environ)
    if "PYTHONPYCACHEPREFIX" in os.environ or "PYTHONPYCACHEPREFIX" not in env:
        return False
    sys.pycache_prefix = env["PYTHONPYCACHEPREFIX"]
    sys.dont_write_bytecode = False
    return True
