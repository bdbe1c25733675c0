"""torch-flash and torch-efficient draw their own dropout masks (Philox); the masks are
recovered for the oracle (engines/torch_drawn_dropout.py). The decline rules run anywhere;
the recovery needs the CUDA kernels and is judged end to end on a GPU: a recovered mask
that differs from the one the backward applied fails the gradients."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from bundlegen import reasons as R
from bundlegen.graph import dense_graph
from bundlegen.engines import torch_drawn_dropout as TD
from bundlegen.engines.torch_efficient.engine import TorchEfficientEngine
from bundlegen.engines.torch_flash.engine import TorchFlashEngine
from bundlegen.engines.torch_sdpa_common import DeviceFacts
from bundlegen.harness import verdicts as V
from bundlegen.harness.case import run_case
from tests import harness_support as S
from tests.graph_factory import make_case

H200 = DeviceFacts(kind="cuda", capability=(9, 0))
ENGINES = (TorchFlashEngine, TorchEfficientEngine)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="the ops' dropout kernels run on CUDA only")


def drawn(p=0.5, causal=False, **sizes):
    dims = dict(B=2, H_q=4, S_q=96, S_kv=160, D_qk=64, dtype="bf16")
    g = dense_graph(**{**dims, **sizes}, dropout=p, right=0 if causal else None,
                    alignment="BOTTOM_RIGHT" if causal else "TOP_LEFT")
    return dataclasses.replace(make_case(g, seed=11), tolerance_class="bf16-r256")


def with_port(case):
    g = case.graph
    port = dataclasses.replace(g.tensors["q"], dims=(g.B, g.H_q, g.S_q, g.S_kv),
                               strides=(g.H_q * g.S_q * g.S_kv, g.S_q * g.S_kv, g.S_kv, 1))
    return dataclasses.replace(g, tensors={**g.tensors, "dropout_mask": port})


@pytest.mark.parametrize("engine", ENGINES)
def test_a_drawn_mask_is_served_and_a_mask_port_declined(engine):
    e = engine("cpu", facts=H200)
    assert e.draws_dropout_mask
    assert e.is_applicable(drawn().graph) is None
    reason = e.is_applicable(with_port(drawn()))
    assert R.code_of(reason) == R.DROPOUT_NOT_SERVED and "takes no dropout mask" in reason


def test_masked_out_bits_count_as_kept():
    g = drawn(causal=True, S_q=8, S_kv=8, B=1, H_q=1).graph
    keep = TD.only_where_attended(torch.zeros(1, 1, 8, 8), g)
    assert int(keep.sum()) == 8 * 7 // 2      # strictly above the diagonal
    assert bool((keep.tril() == 0).all())


@cuda
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("p", (0.1, 0.5, 0.9))
def test_the_recovered_mask_is_the_one_the_backward_applies(engine, p):
    e = engine("cuda")
    for case in (drawn(p), drawn(p, causal=engine is TorchFlashEngine)):
        out = run_case(case, e, S.PLAIN, repeat=3)   # 3 runs: bitwise the same gradients
        assert out.verdict == V.PASS, out


@cuda
@pytest.mark.parametrize("engine", ENGINES)
def test_another_seed_draws_another_mask_and_fails_the_oracle(engine, monkeypatch):
    e = engine("cuda")
    case = drawn(0.5)
    first = e.drawn_dropout_mask(case.graph).clone()
    assert torch.equal(first, e.drawn_dropout_mask(case.graph))   # the same seed, the same mask
    # the mask told comes from another seed than the backward's: the gradients must fail
    told = TD.efficient_keep if engine is TorchEfficientEngine else (lambda g, d, seed: TD.flash_draw(g, d, seed)[0])
    monkeypatch.setattr(e, "drawn_dropout_mask", lambda g: told(g, e.device, seed=TD.PHILOX_SEED + 1))
    assert not torch.equal(first, e.drawn_dropout_mask(case.graph))
    assert run_case(case, e, S.PLAIN).verdict == V.FAIL_NUMERIC


@cuda
@pytest.mark.parametrize("engine", ENGINES)
def test_no_rng_state_leaks(engine):
    e = engine("cuda")
    before = torch.cuda.get_rng_state(), torch.get_rng_state()
    assert run_case(drawn(0.3), e, S.PLAIN).verdict == V.PASS
    after = torch.cuda.get_rng_state(), torch.get_rng_state()
    assert all(torch.equal(a, b) for a, b in zip(before, after))
