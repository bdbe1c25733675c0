"""The dropout mask the Triton kernels draw themselves (engines/triton/dropout_draw.py), on the
interpreter: it is Philox 4x32-10 of (seed, (j, i, b * H_q + h, offset)) (checked against a
plain-Python Philox that reproduces Random123's known answers), the mask the engine tells is
the one its dK/dV and dQ kernels used (the harness judges the gradients with it), the same
seed and offset give the same mask and bitwise gradients, another seed another mask, and no
state leaks between cases or from torch's RNG."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from bundlegen.engines.triton.engine import TritonEngine
from bundlegen.graph import dense_graph
from bundlegen.harness import materialize as M
from bundlegen.harness import verdicts as V
from bundlegen.harness.case import run_case
from bundlegen.harness.drawn_dropout import mask_problem
from bundlegen.mutants import catalog as C
from bundlegen.plans import sdpa_bwd as P
from tests import harness_support as S
from tests.graph_factory import make_case

M32 = 0xFFFFFFFF


def philox4x32_10(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, ...]:
    """Random123's Philox 4x32 with 10 rounds, in plain Python."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p2 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p2 >> 32) ^ c1 ^ k0) & M32, p2 & M32, ((p0 >> 32) ^ c3 ^ k1) & M32, p0 & M32
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def test_the_reference_philox_gives_random123s_known_answers():
    assert philox4x32_10((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    assert philox4x32_10((M32,) * 4, (M32, M32)) == (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)
    assert philox4x32_10((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)) \
        == (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)


def reference_mask(graph, seed: int, offset: int) -> torch.Tensor:
    """keep[b, h, i, j] = top 24 bits of word 0 of Philox(seed, (j, i, b H_q + h, offset)) / 2^24
    >= p, in fp32 as the kernels compare it."""
    p = torch.tensor(graph.attributes.dropout_probability, dtype=torch.float32)
    out = torch.zeros(graph.B, graph.H_q, graph.S_q, graph.S_kv, dtype=torch.uint8)
    key = (seed & M32, seed >> 32)
    for b in range(graph.B):
        for h in range(graph.H_q):
            for i in range(graph.S_q):
                words = [philox4x32_10((j, i, b * graph.H_q + h, offset), key)[0] for j in range(graph.S_kv)]
                u = torch.tensor([w >> 8 for w in words], dtype=torch.float32) / 16777216.0
                out[b, h, i] = (u >= p).to(torch.uint8)
    return out


def drawn_graph(p=0.5, **kw):
    base = dict(dtype="bf16", B=2, H_q=4, H_k=2, S_q=24, S_kv=40, D_qk=16, dropout=p)
    return dense_graph(**{**base, **kw})


def drawn_case(graph, seed=9):
    return dataclasses.replace(make_case(graph, seed=seed), tolerance_class=P.tolerance_class_for(graph))


def test_the_kernels_generator_is_philox_of_the_entry_coordinates():
    graph = drawn_graph(B=2, H_q=3, S_q=5, S_kv=70, p=0.3)    # 70: two column tiles of the mask kernel
    for seed, offset in ((0x5EEDD50F, 0), (12345, 7)):
        told = TritonEngine("cpu", dropout_seed=seed, dropout_offset=offset).drawn_dropout_mask(graph)
        assert torch.equal(told, reference_mask(graph, seed, offset)), (seed, offset)


@pytest.mark.parametrize("kw", [
    dict(p=0.1, right=0, alignment="BOTTOM_RIGHT", S_q=17, S_kv=33),           # tails, causal
    dict(p=0.5, dtype="fp32", H_q=3, H_k=1, H_v=3, S_q=33, S_kv=20, D_qk=32, D_v=16),   # H_k != H_v
    dict(p=0.9, dtype="fp16", left=5, right=2)])                                # a band, p near 1
def test_the_gradients_are_judged_with_the_mask_the_kernels_drew(kw):
    engine = TritonEngine("cpu")
    out = run_case(drawn_case(drawn_graph(**kw)), engine, S.PLAIN, repeat=2)
    assert out.verdict == V.PASS, out          # repeat 2: the same seed and offset, bitwise gradients
    assert mask_problem(engine.drawn_dropout_mask(drawn_graph(**kw)), drawn_graph(**kw)) is None


def _gradients(engine, case):
    m = M.materialize(case, "cpu", dropout_keep=engine.drawn_dropout_mask(case.graph))
    engine.run(case.graph, m.tensors)
    return [m.tensors[p].clone() for p in ("dq", "dk", "dv")]


def test_same_seed_and_offset_same_mask_and_bitwise_gradients_another_seed_another_mask():
    graph = drawn_graph()
    case = drawn_case(graph)
    a, b = TritonEngine("cpu"), TritonEngine("cpu")
    assert torch.equal(a.drawn_dropout_mask(graph), b.drawn_dropout_mask(graph))
    for x, y in zip(_gradients(a, case), _gradients(b, case)):
        assert torch.equal(x, y)
    for other in (TritonEngine("cpu", dropout_seed=77), TritonEngine("cpu", dropout_offset=1)):
        assert not torch.equal(a.drawn_dropout_mask(graph), other.drawn_dropout_mask(graph))
        assert run_case(case, other, S.PLAIN).verdict == V.PASS


def test_no_state_leaks_between_cases_or_from_torchs_rng():
    """The mask of a graph does not depend on torch's RNG, on the cases run before it, or on
    the engine instance; and the engine leaves torch's RNG as it found it."""
    first, second = drawn_graph(), drawn_graph(p=0.1, B=1, S_q=17)
    engine = TritonEngine("cpu")
    torch.manual_seed(1)
    before = engine.drawn_dropout_mask(first)
    grads = _gradients(engine, drawn_case(first))
    torch.manual_seed(2)
    state = torch.get_rng_state()
    _gradients(engine, drawn_case(second))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(engine.drawn_dropout_mask(first), before)
    for x, y in zip(_gradients(engine, drawn_case(first)), grads):
        assert torch.equal(x, y)
    assert torch.equal(TritonEngine("cpu").drawn_dropout_mask(first), before)


def test_a_seed_out_of_range_is_refused():
    for kw in (dict(dropout_seed=-1), dict(dropout_seed=2 ** 31), dict(dropout_offset=2 ** 31)):
        with pytest.raises(ValueError, match="outside"):
            TritonEngine("cpu", **kw)


def test_the_shifted_dq_offset_mutant_fails_dq_alone():
    case = drawn_case(drawn_graph(B=1, H_q=2, H_k=1, S_q=17, S_kv=33, right=0, alignment="BOTTOM_RIGHT"))
    mutant = C.by_name("dropout-drawn-dq-offset-shifted").wrap(TritonEngine("cpu"))
    assert mutant.draws_dropout_mask
    out = run_case(case, mutant, S.PLAIN)
    assert out.verdict == V.FAIL_NUMERIC and "dq" in out.detail and "dk" not in out.detail, out
