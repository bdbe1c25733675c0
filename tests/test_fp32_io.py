"""fp32 io (issue 43, item 3): true fp32 products, the fp32 tolerance classes against the
oracle, the engines that serve or decline fp32, and a TF32 defect caught by the classes."""
from dataclasses import replace

import pytest
import torch

from bundlegen import reasons as R
from bundlegen.engines.fp32_products import ieee_fp32
from bundlegen.engines.torch_math.engine import TorchMathEngine
from bundlegen.graph import dense_graph
from bundlegen.harness import materialize as M
from bundlegen.harness.checks import judge_outputs
from bundlegen.harness.config import Tolerance
from bundlegen.mutants.wrappers import Tf32Products, tf32_rounded
from bundlegen.plans import sdpa_bwd as P
from tests.graph_factory import make_case


@pytest.mark.parametrize("before", [True, False])
def test_ieee_fp32_turns_tf32_off_for_the_block_and_back(before):
    torch.backends.cuda.matmul.allow_tf32 = before
    torch.backends.cudnn.allow_tf32 = before
    try:
        with ieee_fp32():
            assert torch.backends.cuda.matmul.allow_tf32 is False
            assert torch.backends.cudnn.allow_tf32 is False
        assert torch.backends.cuda.matmul.allow_tf32 is before
        assert torch.backends.cudnn.allow_tf32 is before
        with ieee_fp32(False):       # a 16-bit graph leaves the switches alone
            assert torch.backends.cuda.matmul.allow_tf32 is before
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = True


def test_fp32_classes_follow_the_bf16_fp16_model():
    for limit, suffix, factor in P.REDUCTION_BUCKETS:
        tc = P.TOLERANCE_CLASSES[f"fp32-{suffix}"]
        assert (tc.dtype, tc.max_reduction, tc.atol) == ("fp32", limit, P.ATOL)
        assert tc.rtol == 2.0 ** -24 * (factor + P.SCORE_MAGNITUDE)
        assert P.TOLERANCE_CLASSES[f"bf16-{suffix}"].rtol == 2.0 ** -8 * factor


def test_tf32_rounding_keeps_ten_mantissa_bits():
    x = torch.tensor([1 + 2 ** -10, 1 + 2 ** -11 + 2 ** -12, 1 + 2 ** -12, 3.0]).as_strided((2,), (2,), 1)
    got = tf32_rounded(x)
    assert got.stride() == x.stride() and got.storage_offset() == x.storage_offset()
    assert got.tolist() == [1 + 2 ** -10, 3.0]      # rounded to nearest
    assert tf32_rounded(torch.tensor([1 + 2 ** -11 + 2 ** -12])).item() == 1 + 2 ** -10


def _judged(engine, graph, distribution="randn"):
    case = replace(make_case(graph, seed=5, distribution=distribution), tolerance_class=P.tolerance_class_for(graph))
    tc = P.TOLERANCE_CLASSES[case.tolerance_class]
    m = M.materialize(case, "cpu")
    engine.run(graph, m.tensors)
    return judge_outputs({p: m.tensors[p] for p in ("dq", "dk", "dv")}, m.reference, Tolerance(tc.rtol, tc.atol, "test"))


GRAPHS = [
    (dense_graph(dtype="fp32", H_q=2, H_k=1, H_v=1, S_q=40, S_kv=72, D_qk=32, D_v=32, right=0,
                 alignment="BOTTOM_RIGHT"), "randn"),
    (dense_graph(dtype="fp32", H_q=1, H_k=1, H_v=1, S_q=48, S_kv=48, D_qk=32, D_v=32), "shifted-logits"),
]


@pytest.mark.parametrize("graph, distribution", GRAPHS)
def test_torch_math_meets_the_fp32_class_and_tf32_does_not(graph, distribution):
    engine = TorchMathEngine("cpu")
    assert engine.is_applicable(graph) is None
    good = _judged(engine, graph, distribution)
    assert good.verdict == "pass", good
    bad = _judged(Tf32Products(engine), graph, distribution)
    assert bad.verdict != "pass"


def test_triton_serves_fp32_and_bounds_its_head_dim_on_gpus():
    from bundlegen.engines.triton.capabilities import ROWS
    small = dense_graph(dtype="fp32", D_qk=128, D_v=128)
    large = dense_graph(dtype="fp32", D_qk=192, D_v=192)
    for arch, row in ROWS.items():
        assert row.mismatch(small) is None
        want = None if arch == "cpu" else R.HEAD_DIM_TOO_LARGE
        assert (row.mismatch(large) and R.code_of(row.mismatch(large))) == want
        assert row.mismatch(dense_graph(dtype="bf16", D_qk=192, D_v=192)) is None


def test_triton_interpreter_meets_the_fp32_class():
    from bundlegen.engines.triton.engine import TritonEngine
    graph, distribution = GRAPHS[0]
    assert _judged(TritonEngine("cpu"), graph, distribution).verdict == "pass"
