"""The one rule for the environment variables that turn a harness speed-up off
(BUNDLEGEN_ZYGOTE, BUNDLEGEN_PYCACHE, BUNDLEGEN_EARLY_CONTEXT, BUNDLEGEN_WARM_PATH,
BUNDLEGEN_EARLY_RELEASE, BUNDLEGEN_SHARED_PREPARE): each is on unless its variable is "0", so
that a benchmark can run the same thing without it."""
from __future__ import annotations

import os
from typing import Mapping


def turned_off(variable: str, env: Mapping[str, str] = os.environ) -> bool:
    return env.get(variable, "1") == "0"
