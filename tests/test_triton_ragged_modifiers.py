"""The Triton kernels on the CPU interpreter with score modifiers on ragged graphs (RAGGED
with HAS_BIAS / SOFTCAP / HAS_ALIBI, the dBias and dSinks kernels' RAGGED_DB / RAGGED_DS)
and ALiBi slopes on padded graphs (HAS_ALIBI: the query head's slope, not its K head's),
judged by the harness against the float64 oracle."""
from __future__ import annotations

import pytest

from bundlegen.graph import dense_graph, with_modifiers
from bundlegen.harness import verdicts as V
from bundlegen.harness.case import run_case
from tests.harness_support import PLAIN
from tests.test_ragged_modifiers import RAGGED, RAGGED_BR, _case

pytestmark = pytest.mark.usefixtures("triton_interpreter")


@pytest.fixture
def triton_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _engine():
    from bundlegen.engines.triton.engine import TritonEngine
    return TritonEngine("cpu")


@pytest.mark.parametrize("extras", [dict(bias="full", dbias=True, softcap=4.0),
                                    dict(bias="head", dbias=True, alibi_slopes="batch"),
                                    dict(sinks=True, dsinks=True, alibi_slopes="head")],
                         ids=["bias-dbias-softcap", "head-bias-dbias-alibi", "sinks-dsinks-alibi"])
@pytest.mark.parametrize("base", [RAGGED, RAGGED_BR], ids=["top-left", "bottom-right-causal"])
def test_ragged_modifiers_pass(base, extras):
    outcome = run_case(_case(with_modifiers(base, **extras)), _engine(), PLAIN)
    assert outcome.verdict == V.PASS, outcome.detail


@pytest.mark.parametrize("form", ["head", "batch"])
def test_padded_alibi_slopes_pass_under_gqa(form):
    base = dense_graph(B=2, H_q=4, H_k=1, S_q=12, S_kv=20, D_qk=16, alignment="BOTTOM_RIGHT", right=0)
    outcome = run_case(_case(with_modifiers(base, alibi_slopes=form, bias="both", dbias=True)),
                       _engine(), PLAIN)
    assert outcome.verdict == V.PASS, outcome.detail
