"""BlockConfig.fused_dbias on the interpreter: the dK pass stores dBias as it forms dS
(kernels.bwd_dkdv FUSED_DBIAS) where launch.fuses_dbias allows it, against the float64
autograd reference (tests/triton_reference.py: gradients, canaries around dBias, untouched
inputs); where it does not (a band, a broadcast dBias), bwd_dbias's pass runs as before."""
import dataclasses

import pytest

from bundlegen.engines.triton import launch as L
from bundlegen.engines.triton import warm
from bundlegen.graph import dense_graph, with_modifiers
from tests.triton_reference import check, prepare
from tests.triton_tiles import TEST_TILES, small_tile
from bundlegen.engines.triton.engine import TritonEngine

FUSED = dataclasses.replace(TEST_TILES, fused_dbias=True)
FusedEngine = type("FusedDbiasEngine", (TritonEngine,), {"config": lambda self, g: FUSED})

CASES = {
    # MHA, tails in both kernels (S not a multiple of the tiles), two batches
    "full": (dict(B=2, H_q=2, S_q=24, S_kv=40, D_qk=16), dict(bias="full", dbias=True)),
    # GQA and unequal head dims: the dK pass loops over its group's query heads
    "gqa": (dict(B=2, H_q=4, H_k=2, H_v=1, S_q=33, S_kv=47, D_qk=24, D_v=16, dtype="bf16"),
            dict(bias="full", dbias=True)),
    # dBias is dS before the softcap factor
    "softcap": (dict(H_q=2, S_q=30, S_kv=20, D_qk=16, scale=1.5), dict(bias="full", dbias=True, softcap=2.5)),
}


def _kernels(graph, cfg):
    """Names of the kernels a launch of `graph` with `cfg` runs (recorded, not run)."""
    rec = warm._Launches()
    L.run(dataclasses.replace(L.prepare(graph.as_launched(), L.meta_tensors(graph), cfg), kernels=rec))
    return [name for name, _, kwargs in rec.calls], [kw.get("FUSED_DBIAS", False) for _, _, kw in rec.calls]


@pytest.mark.parametrize("name", list(CASES))
def test_the_fused_dbias_matches_the_reference(name):
    sizes, mods = CASES[name]
    graph = with_modifiers(dense_graph(**sizes), **mods)
    names, fused = _kernels(graph, FUSED)
    assert "bwd_dbias" not in names and any(fused)
    check(prepare(graph, seed=len(name)), FusedEngine("cpu"))


@pytest.mark.parametrize("sizes, mods", [
    (dict(H_q=2, S_q=24, D_qk=16, right=0), dict(bias="full", dbias=True)),         # a band
    (dict(B=2, H_q=2, S_q=24, D_qk=16), dict(bias="head", dbias=True)),             # broadcast: a sum
])
def test_where_it_cannot_fuse_the_dbias_pass_runs(sizes, mods):
    graph = with_modifiers(dense_graph(**sizes), **mods)
    names, fused = _kernels(graph, FUSED)
    assert "bwd_dbias" in names and not any(fused)
    check(prepare(graph, seed=3), small_tile(FusedEngine)("cpu"))
