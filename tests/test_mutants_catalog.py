"""The mutant catalog: one record per defect class, each mutant buildable by name through
the engine registry, and each one a real defect: it computes something different from the
correct engine on a small graph, or accepts a graph the correct engine declines."""
import dataclasses
import inspect

import pytest
import torch

from bundlegen import reasons as R
from bundlegen.engines.registry import engine_class
from bundlegen.engines.torch_math.engine import TorchMathEngine
from bundlegen.engines.triton.engine import TritonEngine
from bundlegen.harness.materialize import materialize
from bundlegen.mutants import catalog as C
from bundlegen.mutants import triton_source as T
from bundlegen.mutants import wrappers as W
from tests.graph_factory import make_case, make_graph, packed_strides

#: a mutant's NaN and overflow are expected; numpy warns of them inside the interpreter
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

#: the defect classes issue 6 names, each of which must have a mutant
REQUIRED = {
    "stats-read-packed", "stats-batch-head-swapped", "v-indexed-with-k-heads", "dv-extra-row",
    "top-left-for-bottom-right", "drop-tail-block", "left-bound-off-by-one",
    "scale-ignored-in-dk", "odd-pitch-read-early", "do-strides-as-o", "delta-o-wrong-dtype",
    "accepts-zero-stride-outputs", "accepts-overlapping-outputs", "accepts-non-packed-stats",
    "masked-rows-nan", "dq-accumulated-fp16", "gqa-dkdv-not-reduced",
}


def test_catalog_records():
    assert REQUIRED <= set(C.NAMES)
    for m in C.CATALOG:
        assert dataclasses.is_dataclass(m) and m.kind in C.KINDS
        assert m.description and m.defect_class
        with pytest.raises(dataclasses.FrozenInstanceError):
            m.name = "x"
    assert C.select(["dv-extra-row"]) == (C.by_name("dv-extra-row"),)
    assert C.select() == C.CATALOG
    with pytest.raises(KeyError, match="unknown mutant"):
        C.by_name("no-such-mutant")


def test_engine_target_resolves_through_the_registry():
    cls = engine_class(C.engine_target("torch-math", "dv-extra-row"))
    assert cls.name == "torch-math"          # the real engine's config and claims apply
    engine = cls("cpu")
    assert isinstance(engine, W.DvExtraRow) and isinstance(engine.inner, TorchMathEngine)
    assert engine.name == "torch-math" and engine.arch == "cpu"
    # a source patch wraps the whole engine: what it serves is the engine's
    patched = engine_class(C.engine_target("triton", "drop-tail-block"))("cpu")
    assert isinstance(patched, T.Patched) and isinstance(patched.inner, TritonEngine)
    assert patched.name == "triton" and patched.ragged
    assert patched.score_modifiers == TritonEngine.score_modifiers
    with pytest.raises(Exception, match="unknown mutant"):
        engine_class(C.engine_target("torch-math", "no-such-mutant"))


def test_applicability():
    kernel = [m for m in C.CATALOG if m.kind == C.SOURCE_PATCH]
    assert kernel and all(m.not_applicable(TorchMathEngine) for m in kernel)
    assert all(m.not_applicable(TritonEngine) is None for m in C.CATALOG)
    stats_only = C.by_name("stats-batch-head-swapped")
    assert "never reads stats" in stats_only.not_applicable(TorchMathEngine)
    assert C.by_name("do-strides-as-o").not_applicable(TorchMathEngine) is None


# ----------------------------------------------------------------------------- real defects
def _outputs(engine, case) -> dict[str, torch.Tensor]:
    """Every output storage (guards included) after one run of `engine` on `case`."""
    m = materialize(case, "cpu")
    try:
        engine.run(case.graph, m.tensors)
    except W.OutOfStorage:
        return {"raised": torch.ones(1)}
    return {p: m.storages[p].clone() for p in ("dq", "dk", "dv")}


def _differs(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return True
    return any(not torch.equal(a[p].view(torch.int16), b[p].view(torch.int16)) for p in a)


# (mutant, engine, graph) on which the mutant must compute something else
WRAPPER_GRAPHS = {
    "stats-batch-head-swapped": (TritonEngine, dict(B=2, H_q=2, H_k=2, H_v=2, S_q=16, S_kv=16)),
    "accepts-non-packed-stats": (TritonEngine, dict(B=1, H_q=2, H_k=2, H_v=2, S_q=16, S_kv=16,
                                                    out_strides={"stats": (2 * 21, 21, 1, 1)})),
    "v-indexed-with-k-heads": (TorchMathEngine, dict(H_q=4, H_k=1, H_v=2, S_q=9, S_kv=12, D_qk=8, D_v=8)),
    "do-strides-as-o": (TorchMathEngine, dict(B=2, H_q=2, H_k=2, H_v=2, S_q=9, S_kv=12, D_qk=8, D_v=8,
                                              out_strides={"do": packed_strides((2, 2, 9, 8), (0, 2, 1, 3))})),
    "dv-extra-row": (TorchMathEngine, dict(H_q=2, S_q=9, S_kv=12, D_qk=8, D_v=8)),
}


@pytest.mark.parametrize("name", sorted(WRAPPER_GRAPHS))
def test_wrapper_mutant_computes_something_else(name):
    engine_cls, kwargs = WRAPPER_GRAPHS[name]
    case = make_case(make_graph(D_qk=kwargs.pop("D_qk", 16), D_v=kwargs.pop("D_v", 16), **kwargs), seed=3)
    correct = engine_cls("cpu")
    mutant = C.by_name(name).wrap(engine_cls("cpu"))
    assert correct.is_applicable(case.graph) is None and mutant.is_applicable(case.graph) is None
    assert _differs(_outputs(correct, case), _outputs(mutant, case))
    # and the same mutant is a no-op where its defect cannot show (strides that agree)
    plain = make_case(make_graph(B=1, H_q=1, H_k=1, H_v=1, S_q=9, S_kv=12, D_qk=8, D_v=8), seed=3)
    if name not in ("dv-extra-row",):
        assert not _differs(_outputs(correct, plain), _outputs(mutant, plain))


# source-patch mutant -> (graph, input distribution) on which it computes something else
PATCH_GRAPHS = {
    "stats-read-packed": (dict(B=2, S_q=16, out_strides={"stats": (2 * 21, 21, 1, 1)}), "randn"),
    "odd-pitch-read-early": (dict(S_q=16, out_strides={"q": (2 * 16 * 17, 16 * 17, 17, 1)}), "randn"),
    "delta-o-wrong-dtype": (dict(S_q=16), "randn"),
    "top-left-for-bottom-right": (dict(S_q=9, S_kv=20, right=0, alignment="BOTTOM_RIGHT"), "randn"),
    "left-bound-off-by-one": (dict(S_q=20, S_kv=20, left=3, right=0), "randn"),
    "drop-tail-block": (dict(S_q=17, S_kv=17), "randn"),
    "masked-rows-nan": (dict(S_q=20, S_kv=9, right=0, alignment="BOTTOM_RIGHT"), "randn"),
    "scale-ignored-in-dk": (dict(S_q=16), "randn"),
    "dq-accumulated-fp16": (dict(H_q=1, S_q=16, S_kv=128, scale=1e-10), "shifted-logits"),
    "gqa-dkdv-not-reduced": (dict(H_q=4, H_k=2, H_v=2, S_q=16), "randn"),
}


#: source-patch mutants of the ragged kernels, shown failing the ragged checks where they
#: run: tests/test_triton_ragged.py (by name, so the two lists cannot drift apart)
RAGGED_PATCHES = {"ragged-token-base-unbounded": "test_the_unbounded_token_base_mutant_fails_the_bad_offset_check"}


#: source-patch mutants only a case too large for the CPU can kill: the test that checks
#: their patch (their kill is the GPU run's: bench/h200_levels.sh)
GPU_PATCHES = {"offsets-32-bit": "test_the_32_bit_offsets_patch_fits_and_is_invisible_below_2_31"}


#: boundary-class mutants (issue 17), shown differing inside their class and not outside
#: it: tests/test_mutants_boundary.py (BOUNDARY there, and the grid's own test)
GRID_PATCHES = {"dq-grid-capped-1024": "test_the_grid_cap_drops_programs_past_1024_only"}


#: score-modifier mutants (issue 19), shown failing the modifier checks on graphs with
#: a bias, sinks or softcap: tests/test_triton_modifiers.py (its MUTANT_GRAPHS)
MODIFIER_PATCHES = ("softcap-grad-dropped", "dbias-masked-tiles-unwritten", "dsinks-sign-flipped",
                    "bias-indexed-by-kv-head")

#: dropout mutants of the mask the kernels draw, shown failing dQ alone on a drawn-mask
#: graph: tests/test_triton_drawn_dropout.py
DROPOUT_PATCHES = {"dropout-drawn-dq-offset-shifted": "test_the_shifted_dq_offset_mutant_fails_dq_alone"}


def test_every_source_patch_mutant_has_a_graph():
    from tests import (test_mutants_boundary, test_mutants_triton_source, test_triton_drawn_dropout,
                       test_triton_modifiers, test_triton_ragged)
    boundary = set(test_mutants_boundary.BOUNDARY)
    assert set(PATCH_GRAPHS) | set(RAGGED_PATCHES) | set(GPU_PATCHES) | boundary | set(GRID_PATCHES) \
        | set(MODIFIER_PATCHES) | set(DROPOUT_PATCHES) == {m.name for m in C.CATALOG if m.kind == C.SOURCE_PATCH}
    assert {m.name for m in C.CATALOG if m.needs_gpu} == set(GPU_PATCHES)
    assert set(test_triton_modifiers.MUTANT_GRAPHS) == set(MODIFIER_PATCHES)
    for module, tests in ((test_triton_ragged, RAGGED_PATCHES), (test_mutants_triton_source, GPU_PATCHES),
                          (test_mutants_boundary, GRID_PATCHES), (test_triton_drawn_dropout, DROPOUT_PATCHES)):
        for name, test in tests.items():
            assert name in inspect.getsource(getattr(module, test))


@pytest.mark.parametrize("name", sorted(PATCH_GRAPHS))
def test_source_patch_mutant_computes_something_else(name):
    kwargs, distribution = PATCH_GRAPHS[name]
    case = make_case(make_graph(**kwargs), seed=5, distribution=distribution)
    correct = TritonEngine("cpu")
    mutant = C.by_name(name).wrap(TritonEngine("cpu"))
    assert isinstance(mutant, T.Patched) and not mutant.inner.launches_own_modules()
    assert _differs(_outputs(correct, case), _outputs(mutant, case))


def _zero_stride_dq():
    return make_graph(B=2, out_strides={"dq": (0, 17 * 16, 16, 1)})


def _overlapping_dq():
    return make_graph(out_strides={"dq": (2 * 17 * 8, 17 * 8, 8, 1)})


@pytest.mark.parametrize("name, graph, code", [
    ("accepts-zero-stride-outputs", _zero_stride_dq, R.ZERO_STRIDE_OUTPUT),
    ("accepts-overlapping-outputs", _overlapping_dq, R.OVERLAPPING_OUTPUT)])
@pytest.mark.parametrize("engine_cls", [TorchMathEngine, TritonEngine])
def test_decline_arm_mutant_accepts_what_the_engine_declines(name, graph, code, engine_cls):
    g = graph()
    assert R.code_of(engine_cls("cpu").is_applicable(g)) == code
    mutant = C.by_name(name).wrap(engine_cls("cpu"))
    assert mutant.is_applicable(g) is None
    assert isinstance(mutant, W.WithoutDeclineArm) and mutant.code == code
    # only that arm: the other layout arm still declines
    other = _overlapping_dq() if code == R.ZERO_STRIDE_OUTPUT else _zero_stride_dq()
    assert mutant.is_applicable(other) is not None
    # and Triton's own run, which asks is_applicable again, serves the graph too
    if engine_cls is TritonEngine:
        mutant.run(g, materialize(make_case(g, seed=1), "cpu").tensors)


def test_out_of_storage_views_raise():
    t = torch.zeros(10)[2:6].view(1, 1, 4, 1)
    assert W.restrided(t, (1, 1, 2, 1), (4, 4, 4, 1)).shape == (1, 1, 2, 1)
    with pytest.raises(W.OutOfStorage, match="v addressed .* 1 element"):
        W.restrided(t, (1, 1, 3, 1), (4, 4, 4, 1), "v")


def test_row_past_end_indices():
    storage = torch.zeros(100)
    view = storage.as_strided((2, 2, 3, 2), (12, 6, 2, 1), 5)
    index = W.row_past_end(view)
    assert sorted(index.tolist()) == sorted(5 + b * 12 + h * 6 + 3 * 2 + d
                                            for b in range(2) for h in range(2) for d in range(2))
