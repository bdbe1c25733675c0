"""torch-math, the reference engine: within the plan's tolerance against the float64 oracle
over the graph features it serves, zero gradients for rows with no kept key, and declines
for exactly what it cannot do."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from bundlegen import reasons as R
from bundlegen.graph import Attributes
from bundlegen.engines.registry import engine_class
from bundlegen.engines.torch_math.engine import TorchMathEngine, attention_backward
from bundlegen.harness import verdicts as V
from bundlegen.harness.case import run_case
from bundlegen.plans.sdpa_bwd import tolerance_class_for
from tests import harness_support as S
from tests.graph_factory import make_case, make_graph, packed_strides

SMALL = dict(B=2, H_q=4, H_k=2, H_v=1, S_q=19, S_kv=33, D_qk=24, D_v=16)


def padded(dims, pad):
    b, h, s, d = dims
    return (h * s * (d + pad), s * (d + pad), d + pad, 1)


GRAPHS = {
    "gqa-hk-ne-hv-dqk-ne-dv": {},
    "mqa-fp16": dict(H_k=1, dtype="fp16"),
    "causal-bottom-right-sq-gt-skv": dict(S_q=40, S_kv=17, right=0, alignment="BOTTOM_RIGHT"),
    "sliding-window-top-left": dict(left=5, right=0),
    "bshd-inputs-padded-outputs": dict(layout="bshd", out_strides={
        "dq": padded((2, 4, 19, 24), 3), "dk": padded((2, 2, 33, 24), 5), "dv": padded((2, 1, 33, 16), 1)}),
    "scale-and-offsets": dict(scale=0.9, offsets={"q": 7, "dv": 3}),
    "broadcast-k-over-batch": dict(out_strides={"k": (0, *packed_strides((2, 2, 33, 24))[1:])}),
}


def plan_case(graph, **kwargs):
    """A case carrying its plan tolerance class, as a generated one does."""
    return replace(make_case(graph, **kwargs), tolerance_class=tolerance_class_for(graph))


@pytest.fixture(scope="module")
def engine():
    return TorchMathEngine("cpu")


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_within_the_plan_tolerance(engine, name):
    case = plan_case(make_graph(**{**SMALL, **GRAPHS[name]}), seed=7)
    outcome = run_case(case, engine, S.PLAIN)
    assert outcome.verdict == V.PASS, outcome
    assert outcome.tolerance["source"] == f"manifest class {case.tolerance_class}"


def test_small_int_data_and_repeats(engine):
    case = plan_case(make_graph(**SMALL), seed=3, distribution="small-int")
    assert run_case(case, engine, S.PLAIN, repeat=3).verdict == V.PASS


def test_rows_with_no_kept_key_get_zero_gradients_not_nan():
    # bottom-right causal with S_q > S_kv: rows i < S_q - S_kv keep no key
    g = make_graph(B=1, H_q=2, H_k=1, H_v=1, S_q=12, S_kv=4, D_qk=8, D_v=8, right=0,
                   alignment="BOTTOM_RIGHT")
    torch.manual_seed(0)
    q, do = torch.randn(1, 2, 12, 8).bfloat16(), torch.randn(1, 2, 12, 8).bfloat16()
    k, v = torch.randn(1, 1, 4, 8).bfloat16(), torch.randn(1, 1, 4, 8).bfloat16()
    dq, dk, dv = attention_backward(g, q, k, v, do)
    assert all(bool(torch.isfinite(t).all()) for t in (dq, dk, dv))
    assert bool((dq[:, :, :8] == 0).all()) and bool((dq[:, :, 8:] != 0).any())
    # every row empty: all gradients zero
    empty = replace(g, attributes=Attributes(attn_scale=0.3, left_bound=1, right_bound=-1))
    assert all(bool((t == 0).all()) for t in attention_backward(empty, q, k, v, do))


def test_gradients_match_float64_autograd_of_the_same_function():
    g = make_graph(**{**SMALL, "dtype": "fp16"}, right=0)
    torch.manual_seed(1)
    shapes = [(2, 4, 19, 24), (2, 2, 33, 24), (2, 1, 33, 16), (2, 4, 19, 16)]
    q, k, v, do = (torch.randn(s, dtype=torch.float64) for s in shapes)
    exact = attention_backward(g, q, k, v, do)  # float64 in, float64 math
    half = attention_backward(g, *(t.half() for t in (q, k, v, do)))
    for e, h in zip(exact, half):
        assert h.dtype == torch.float16
        torch.testing.assert_close(h.double(), e, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("change, code", [
    (dict(dtype="fp32"), R.DTYPE_NOT_SERVED),
    (dict(out_strides={"dk": (0, 0, 24, 1)}), None),  # zero strides on size-1 axes are fine
    (dict(H_k=1, out_strides={"dk": (24, 24, 0, 1)}), R.ZERO_STRIDE_OUTPUT),
    (dict(out_strides={"dq": (4 * 19 * 24, 19 * 24, 12, 1)}), R.OVERLAPPING_OUTPUT),
])
def test_declines_only_what_it_cannot_do(engine, change, code):
    graph = make_graph(**{**SMALL, "B": 1, "H_k": 1, **change})
    reason = engine.is_applicable(graph)
    assert (reason and R.code_of(reason)) == code


def test_declines_dropout(engine):
    g = make_graph(**SMALL)
    g = replace(g, attributes=replace(g.attributes, dropout_probability=0.1))
    assert R.code_of(engine.is_applicable(g)) == R.GATED_FEATURE


def test_found_by_name():
    cls = engine_class("torch-math")
    assert cls is TorchMathEngine and cls.name == "torch-math" and cls.deterministic
    assert "cpu" in cls("cpu").archs()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_runs_on_cuda():
    case = plan_case(make_graph(**SMALL), seed=7)
    assert run_case(case, TorchMathEngine("cuda"), S.PLAIN).verdict == V.PASS


def test_every_probe_of_the_checked_in_bundles_is_rejected(engine):
    """Probes are never executed, so this runs every level's probes in a moment."""
    from bundlegen.harness.bundles import default_bundle_root, load_level

    loaded = load_level(default_bundle_root(), S.MANIFEST.level_names[-1])
    probes = [c for c in loaded.cases if c.expected_rejection is not None]
    assert len(probes) >= 20
    outcomes = {c.id: run_case(c, engine, S.PLAIN) for c in probes}
    # a device probe runs (bad ragged offsets only device code sees): torch-math skips
    # the bad sequences and gets the good ones right
    want = {c.id: V.CONTAINED if c.expected_rejection.by == "device" else V.REJECTED for c in probes}
    assert V.CONTAINED in want.values()
    assert {c: o.verdict for c, o in outcomes.items() if o.verdict != want[c]} == {}
    assert not loaded.errors
