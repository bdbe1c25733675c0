"""Port-form mutants (mutants/port_forms.py, padded ones): each is the engine itself off its
condition and fails its case on it, judged by the harness's own checks over torch-math on
the CPU. The ragged ones are measured by `bundlegen mutate` against the bundles."""
from __future__ import annotations

import dataclasses

import pytest

from bundlegen.graph import dense_graph, with_modifiers
from bundlegen.harness.case import run_case
from bundlegen.harness.bundles import manifest_of
from bundlegen.harness.config import EngineConfig
from bundlegen.engines.registry import engine_class
from bundlegen.mutants import port_forms as PF
from bundlegen.tolerance_rule import class_for
from bundlegen.plans.sdpa_bwd import TOLERANCE_CLASSES
from tests.graph_factory import make_case

CONFIG = EngineConfig(manifest=manifest_of())


def _verdict(wrapper, graph):
    engine = wrapper(engine_class("torch-math")("cpu"))
    case = dataclasses.replace(make_case(graph, seed=5), tolerance_class=class_for(graph, TOLERANCE_CLASSES))
    return run_case(case, engine, CONFIG).verdict


def _g(dtype="bf16", B=2, H_q=2, H_k=None, S=24, **mods):
    return with_modifiers(dense_graph(B=B, H_q=H_q, H_k=H_k or H_q, S_q=S, D_qk=16, dtype=dtype), **mods)


# (wrapper, graph under its condition, graph off it)
CASES = {
    "dropout-batch-only": (PF.DropoutBatchOnlyReadAsBoth, _g(dropout=0.5, dropout_mask="batch"),
                           _g(dropout=0.5, dropout_mask="both")),
    "dropout-kv-head": (PF.DropoutMaskHeadOfKvHead, _g(H_q=4, H_k=2, dropout=0.5),
                        _g(H_q=4, dropout=0.5)),
    "dropout-scale-fp32": (PF.DropoutScaleRoundedInFp32, _g("fp32", dropout=0.1), _g("bf16", dropout=0.1)),
    "alibi-batch-slopes": (PF.AlibiBatchSlopesFirstRow, _g(alibi_slopes="batch"), _g(alibi_slopes="head")),
    "softcap-alibi": (PF.SoftcapDroppedWithAlibi, _g(alibi_slopes="head", softcap=5.0), _g(softcap=5.0)),
    "alibi-non-pow2": (PF.AlibiSlopesWrapPastPowerOfTwo, _g(H_q=6, H_k=2, alibi_slopes="head"),
                       _g(H_q=4, H_k=2, alibi_slopes="head")),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_misbehaves_only_under_its_condition(name):
    wrapper, on, off = CASES[name]
    assert _verdict(wrapper, off) == "pass"
    assert _verdict(wrapper, on) not in ("pass", "declined", "skipped")
