"""The PyTorch backends and the score modifiers (issue 19), on the CPU: which modifiers each
engine lists, the bias rules read from PyTorch's checks, the op arguments built for a bias
(and dBias), the dBias reduction over broadcast axes, and the ops' plumbing on meta tensors."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from bundlegen import reasons as R
from bundlegen.dtypes import TORCH_DTYPES
from bundlegen.graph import TensorSpec, dense_graph, with_modifiers
from bundlegen.harness import verdicts as V
from bundlegen.harness.case import run_case
from bundlegen.engines.registry import engine_class
from bundlegen.engines.torch_cudnn.engine import cudnn_values
from bundlegen.engines.torch_efficient.engine import efficient_values
from bundlegen.engines.torch_sdpa_common import cuda_facts, write_dbias
from tests.harness_support import PLAIN
from tests.test_harness_modifiers import _case

H200 = cuda_facts(9, 0, cudnn_version=91002)
BASE = dense_graph(B=2, H_q=4, S_q=64, S_kv=48, D_qk=64, dtype="bf16")


def engine(name):
    return engine_class(name)("cpu", facts=H200)


def test_each_engine_lists_what_it_serves():
    assert engine_class("torch-flash").score_modifiers == frozenset()
    assert engine_class("torch-efficient").score_modifiers == {"bias", "dbias"}
    assert engine_class("torch-cudnn").score_modifiers == {"bias"}
    assert engine_class("torch-math").score_modifiers == {"bias", "dbias", "sinks", "softcap", "alibi_slopes"}


@pytest.mark.parametrize("name, extras, unlisted", [
    ("torch-flash", dict(bias="full"), "bias"),
    ("torch-efficient", dict(bias="full", sinks=True, dsinks=True), "sinks"),
    ("torch-efficient", dict(softcap=30.0), "softcap"),
    ("torch-cudnn", dict(bias="batch", dbias=True), "dbias"),
])
def test_the_harness_declines_what_an_engine_does_not_list(name, extras, unlisted):
    outcome = run_case(_case(with_modifiers(BASE, **extras)), engine(name), PLAIN)
    assert outcome.verdict == V.DECLINED
    assert R.code_of(outcome.reason) == R.MODIFIER_NOT_SERVED and unlisted in outcome.reason


def _bias(graph, strides, offset=0):
    return dataclasses.replace(graph, tensors={**graph.tensors, "bias": dataclasses.replace(
        graph.tensors["bias"], strides=strides, offset=offset)})


FULL = with_modifiers(BASE, bias="full", dbias=True)


@pytest.mark.parametrize("name", ["torch-efficient", "torch-cudnn"])
@pytest.mark.parametrize("kind", ["full", "batch", "head", "both"])
def test_packed_and_broadcast_biases_are_served(name, kind):
    graph = with_modifiers(BASE, bias=kind, dbias=name == "torch-efficient")
    assert engine(name).is_applicable(graph) is None


@pytest.mark.parametrize("name, graph, code", [
    # the key axis not contiguous (a transposed bias): both ops read it packed
    ("torch-efficient", _bias(FULL, (4 * 64 * 48, 64 * 48, 1, 64)), R.BIAS_LAYOUT_NOT_SERVED),
    ("torch-cudnn", _bias(FULL, (4 * 64 * 48, 64 * 48, 1, 64)), R.BIAS_LAYOUT_NOT_SERVED),
    # rows 50 apart: a multiple of kMinimumAlignment (efficient) but not of 16 bytes (cudnn)
    ("torch-cudnn", _bias(FULL, (4 * 64 * 50, 64 * 50, 50, 1)), R.MISALIGNED_STRIDE),
    # rows 49 apart: no op reads them
    ("torch-efficient", _bias(FULL, (4 * 64 * 49, 64 * 49, 49, 1)), R.MISALIGNED_STRIDE),
    # a bias starting 3 elements in
    ("torch-efficient", _bias(FULL, (4 * 64 * 48, 64 * 48, 48, 1), offset=3), R.MISALIGNED_STRIDE),
    ("torch-cudnn", _bias(FULL, (4 * 64 * 48, 64 * 48, 48, 1), offset=4), R.MISALIGNED_STRIDE),
])
def test_bias_layouts_an_op_rejects_are_declined(name, graph, code):
    if name == "torch-cudnn":
        graph = dataclasses.replace(graph, tensors={p: t for p, t in graph.tensors.items() if p != "dbias"})
    reason = engine(name).is_applicable(graph)
    assert reason is not None and R.code_of(reason) == code, reason


def test_efficient_accepts_rows_a_multiple_of_four_apart():
    assert engine("torch-efficient").is_applicable(_bias(FULL, (4 * 64 * 52, 64 * 52, 52, 1))) is None


def _meta(graph):
    return {p: torch.empty_strided(t.dims, t.strides, dtype=TORCH_DTYPES[t.dtype], device="meta")
            for p, t in graph.tensors.items()}


@pytest.mark.parametrize("kind", ["full", "batch", "head", "both"])
def test_efficient_arguments_keep_the_bias_view_and_ask_for_dbias(kind):
    graph = with_modifiers(BASE, bias=kind, dbias=True)
    tensors = _meta(graph)
    values = efficient_values(graph, tensors)
    assert values["attn_bias"] is tensors["bias"] and values["grad_input_mask"] == [True] * 4
    no_grad = with_modifiers(BASE, bias=kind)
    assert efficient_values(no_grad, _meta(no_grad))["grad_input_mask"][3] is False
    assert efficient_values(BASE, _meta(BASE))["attn_bias"] is None
    engine("torch-efficient").run(graph, tensors)      # the op's meta kernel: shapes agree


@pytest.mark.parametrize("kind, shape", [("full", (2, 4, 64, 48)), ("batch", (1, 4, 64, 48)),
                                         ("head", (2, 1, 64, 48)), ("both", (1, 1, 64, 48))])
def test_cudnn_arguments_broadcast_the_bias_by_dims(kind, shape):
    graph = with_modifiers(BASE, bias=kind)
    tensors = _meta(graph)
    bias = cudnn_values(graph, tensors)["attn_bias"]
    assert tuple(bias.shape) == shape and 0 not in bias.stride()[2:]
    assert bias.data_ptr() == tensors["bias"].data_ptr() or bias.device.type == "meta"
    engine("torch-cudnn").run(graph, tensors)


def test_write_dbias_sums_over_the_declared_size_one_axes():
    grad = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5).to(torch.bfloat16)
    out = torch.empty(1, 3, 4, 5, dtype=torch.bfloat16)
    write_dbias(out, grad)
    assert torch.equal(out, grad.float().sum(0, keepdim=True).to(torch.bfloat16))
    both = torch.empty(1, 1, 4, 5, dtype=torch.bfloat16)
    write_dbias(both, grad)
    assert torch.equal(both, grad.float().sum((0, 1), keepdim=True).to(torch.bfloat16))
    with pytest.raises(RuntimeError, match="dbias"):
        write_dbias(torch.empty(2, 3, 4, 6, dtype=torch.bfloat16), grad)
