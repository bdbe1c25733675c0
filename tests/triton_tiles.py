"""Small, unequal Triton tiles for the interpreter tests (M != N): small shapes then cross
several blocks in both kernels, so block skipping, tails, band edges and fully masked tiles
all occur. The interpreter is set for the session by tests/conftest.py."""
import pytest

from bundlegen.engines.triton import configs
from bundlegen.engines.triton.engine import TritonEngine

#: score_rows: aligned bias and dropout-mask tiles read in vectors, as sm90's tables read them
TEST_TILES = configs.BlockConfig(16, 32, 32, 16, score_rows=True)


def small_tile(engine_cls):
    """`engine_cls` with TEST_TILES for every graph."""
    return type(f"{engine_cls.__name__}SmallTiles", (engine_cls,), {"config": lambda self, g: TEST_TILES})


SmallTileEngine = small_tile(TritonEngine)


@pytest.fixture(scope="module")
def engine():
    return SmallTileEngine("cpu")
