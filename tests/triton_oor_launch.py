"""A launch module for tests/test_triton_fallback.py: the real launcher's prepare, whose `run`
records each launch's variant and config instead of running the kernels, and raises
Triton's OutOfResources for a banded launch with the table's tiles (as a variant whose
table config needs more shared memory than the device has)."""
from triton.runtime.errors import OutOfResources

from bundlegen.engines.triton import configs
from bundlegen.engines.triton.launch import out_of_resources, prepare  # noqa: F401  (the engine's)

launched: list = []   # (variant, cfg) of each launch that ran
refused: list = []    # variant of each launch that ran out of resources


def run(L) -> None:
    table = configs.config_for("cpu", L.graph.D_qk, L.graph.D_v)
    if L.flags["HAS_RIGHT"] and L.cfg.block_m1 == table.block_m1:
        refused.append(L.variant)
        raise OutOfResources(262144, 232448, "shared memory")
    launched.append((L.variant, L.cfg))
