"""The boundary-class mutants (issue 17): each is a real defect that shows only under its
boundary class. For each, on small tiles in the Triton interpreter: a graph inside the class
on which it computes something else than the product, and graphs outside it (the class's
neighbouring values, the same feature exercised) on which it computes the same bits. A
mutant that were wrong everywhere fails the second half; one that were right everywhere
fails the first."""
import importlib

import pytest
import torch

from bundlegen.engines.triton import configs
from bundlegen.engines.triton import launch as product_launch
from bundlegen.engines.triton.engine import TritonEngine
from bundlegen.harness.materialize import materialize, reset_outputs
from bundlegen.mutants import catalog as C
from tests.graph_factory import make_case, make_graph

#: a mutant's NaN and overflow are expected; numpy warns of them inside the interpreter
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

#: small unequal tiles (M1, N1, M2, N2): each condition is met by its own kernel's block
TILES = configs.BlockConfig(16, 32, 32, 16)
OUTPUTS = ("dq", "dk", "dv")


class SmallTiles(TritonEngine):
    def config(self, graph):
        return TILES


def _g(**kw):
    sizes = dict(B=1, H_q=1, H_k=1, H_v=1, D_qk=16, D_v=16)
    sizes.update(kw)
    return make_graph(**sizes)


BR = dict(right=0, alignment="BOTTOM_RIGHT")
#: mutant -> (boundary class, [graphs inside: it must differ], [graphs outside: the same bits])
#: (TILES: BLOCK_M1 16, BLOCK_N1 32, BLOCK_M2 32, BLOCK_N2 16)
BOUNDARY = {
    # S_q mod BLOCK_M2 == BLOCK_M2 - 1 (S_q = T-1, T = 32); not 15, 30, 32, 33
    "sq-tail-stored-as-full": ("BND-SQ-TAIL", [_g(S_q=31, S_kv=20, B=2)],
                               [_g(S_q=s, S_kv=20, B=2) for s in (15, 30, 32, 33)]),
    # S_kv mod BLOCK_N2 == 1 (S_kv = T+1, T = 16); not 15, 16, 18
    "skv-one-key-tail-skipped": ("BND-SKV-TAIL", [_g(S_q=20, S_kv=17)],
                                 [_g(S_q=20, S_kv=s) for s in (15, 16, 18)]),
    # bottom-right S_kv - S_q not a multiple of BLOCK_N2: 17 and -4; not 16, 32, -16, top-left
    "br-shift-in-whole-blocks": ("BND-BR-OFFSET", [_g(S_q=16, S_kv=33, **BR), _g(S_q=20, S_kv=16, **BR)],
                                 [_g(S_q=16, S_kv=32, **BR), _g(S_q=16, S_kv=48, **BR),
                                  _g(S_q=32, S_kv=16, **BR), _g(S_q=16, S_kv=33, right=0)]),
    # left - shift == -1 mod 16 (left = T-1, T = 16, 32); not 14, 16, 17
    "window-left-edge-inclusive": ("BND-WINDOW-LEFT", [_g(S_q=48, S_kv=48, left=v) for v in (15, 31)],
                                   [_g(S_q=48, S_kv=48, left=v) for v in (14, 16, 17)]),
    # right + shift == 1 mod BLOCK_M1 (a right bound alone, T+1, T = 16); not 0, 15, 16
    "window-right-edge-exclusive": ("BND-WINDOW-RIGHT", [_g(S_q=48, S_kv=48, right=17)],
                                    [_g(S_q=48, S_kv=48, right=v) for v in (0, 15, 16)]),
    # D_qk mod 16 != 0 (T-1 = 15, T+1 = 17); not 16, 32, nor a D_v tail
    "head-dim-cut-to-16": ("BND-HEAD-DIM", [_g(S_q=16, D_qk=15), _g(S_q=16, D_qk=17)],
                           [_g(S_q=16, D_qk=32), _g(S_q=16, D_qk=16, D_v=17)]),
    # H_q / H_k not a power of two (3, 6 / 2); not 2, 4, 8 (GQA all the same)
    "group-as-power-of-two": ("BND-GROUP", [_g(S_q=16, H_q=3), _g(S_q=16, H_q=6, H_k=2, H_v=2)],
                              [_g(S_q=16, H_q=4), _g(S_q=16, H_q=8, H_k=2, H_v=2),
                               _g(S_q=16, H_q=4, H_k=2, H_v=1)]),
}


def _outputs(engine, case) -> dict[str, torch.Tensor]:
    """Every output storage (guards included) after one run of `engine` on `case`."""
    m = materialize(case, "cpu")
    engine.run(case.graph, m.tensors)
    return {p: m.storages[p].clone() for p in OUTPUTS}


def _differing(a: dict, b: dict) -> list[str]:
    return [p for p in OUTPUTS if not torch.equal(a[p].view(torch.int16), b[p].view(torch.int16))]


def _label(graph) -> str:
    a = graph.attributes
    return (f"B{graph.B} H{graph.H_q}/{graph.H_k}/{graph.H_v} S{graph.S_q}x{graph.S_kv} "
            f"D{graph.D_qk}/{graph.D_v} left={a.left_bound} right={a.right_bound} "
            f"{a.diagonal_alignment}")


def test_one_boundary_mutant_per_class_each_killed_by_pr():
    by_class = {m.boundary_class: m for m in C.CATALOG if m.boundary_class}
    assert set(by_class) == {cls for cls, _, _ in BOUNDARY.values()} | {"BND-GRID"}
    assert set(BOUNDARY) | {"dq-grid-capped-1024"} == {m.name for m in by_class.values()}
    for m in by_class.values():
        assert m.kind == C.SOURCE_PATCH and m.killed_by == "pr" and not m.needs_gpu
        assert m.description.startswith(f"{m.boundary_class}:")
        assert m.name not in C.QUICK_CPU_NAMES      # the CPU gate runs the quick ones only
        assert m.prefer[0] == f"{m.boundary_class}*"


@pytest.mark.parametrize("name", sorted(BOUNDARY))
def test_the_mutant_differs_only_inside_its_class(name):
    _, inside, outside = BOUNDARY[name]
    correct, mutant = SmallTiles("cpu"), C.by_name(name).wrap(SmallTiles("cpu"))
    assert not mutant.inner.launches_own_modules()
    for graph in inside:
        case = make_case(graph, seed=5)
        assert _differing(_outputs(correct, case), _outputs(mutant, case)), (
            f"{name} computes what the product computes inside its class: {_label(graph)}")
    for graph in outside:
        case = make_case(graph, seed=5)
        assert not _differing(_outputs(correct, case), _outputs(mutant, case)), (
            f"{name} differs outside its class: {_label(graph)}")


def _dq_stage(launcher, case, m) -> torch.Tensor:
    """dQ's storage after the dQ kernel alone (Delta zero: the same for both launchers)."""
    reset_outputs(m)
    run = launcher.prepare(case.graph, m.tensors, TILES)
    run.delta.zero_()
    launcher.run_dq(run)
    return m.storages["dq"].clone()


def test_the_grid_cap_drops_programs_past_1024_only():
    """BND-GRID (> 1024 dQ programs): one program per 32 query rows, B 1, H 1, so S_q 1025 * 32
    makes 1025 programs. Only the dQ stage runs (1025 interpreted programs, twice); a
    graph of 1024 programs or fewer is the product's bits (the whole backward)."""
    name = "dq-grid-capped-1024"
    mutant_launch = importlib.import_module(C.by_name(name).patch.load())
    rows = TILES.block_m2
    many = make_case(_g(S_q=1025 * rows, S_kv=16, D_v=16), seed=5)
    m = materialize(many, "cpu")
    want, got = _dq_stage(product_launch, many, m), _dq_stage(mutant_launch, many, m)
    view = m.tensors["dq"]
    first = view.storage_offset()                  # packed: the 1025th program's rows follow
    split = first + 1024 * rows * view.stride(2)
    assert torch.equal(want[:split].view(torch.int16), got[:split].view(torch.int16))
    assert not torch.equal(want[split:].view(torch.int16), got[split:].view(torch.int16))
    # outside the class: the whole backward, bit for bit
    correct, mutant = SmallTiles("cpu"), C.by_name(name).wrap(SmallTiles("cpu"))
    for graph in (_g(S_q=4 * rows + 1, B=2, H_q=3, H_k=3, H_v=3),):
        case = make_case(graph, seed=5)
        assert not _differing(_outputs(correct, case), _outputs(mutant, case)), _label(graph)
