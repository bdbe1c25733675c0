"""Bytecode for bundlegen's own Python processes (`bundlegen run` and `bundlegen serve`,
workers, the zygote, and what they start, such as the Triton engine's compile processes).

Where the environment sets PYTHONDONTWRITEBYTECODE (container images often do), Python
writes no bytecode, so every process compiles the sources of what it imports again, torch's
the largest part of a worker's start where torch has no __pycache__. Such processes get PYTHONPYCACHEPREFIX instead, a
folder under the user's cache: Python keeps the bytecode there, so the second start reads
it, and site-packages and the source tree stay as they are, which is what the setting asks
for. The `run` and `serve` commands take the same prefix for their own imports as they
start (keep_bytecode_in_this_process): else, on such a host, they compile the sources of
every module they import before their first worker is started. BUNDLEGEN_PYCACHE=0 leaves the environment
alone; a PYTHONPYCACHEPREFIX already set is kept."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping

from bundlegen.harness.workers import switches

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
