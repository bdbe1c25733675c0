"""The atomic-dQ variant of the Triton engine (kernels.bwd_dkdv ATOMIC_DQ: the dK pass adds
dS K into an fp32 scratch, no dQ kernel) against the float64 reference in the interpreter:
heads, head dims, masks, layouts, score modifiers; and which graphs it serves with atomics
(engine.atomic_dq_serves: padded, head dims up to 128, no deterministic backward asked)."""
import dataclasses

import pytest
import torch

from bundlegen.graph import dense_graph, ragged_graph, with_modifiers
from bundlegen.engines.triton import configs, launch
from bundlegen.engines.triton.engine import (TritonAtomicDqEngine, TritonEngine,
                                             atomic_dq_serves)
from tests.triton_reference import check, permuted, prepare
from tests.triton_tiles import TEST_TILES, small_tile

AtomicEngine = small_tile(TritonAtomicDqEngine)

CASES = {
    "mha": dict(H_q=2, S_q=32, D_qk=32),
    "gqa-4-tails": dict(H_q=8, H_k=2, S_q=17, S_kv=33, D_qk=16, dtype="bf16"),
    "hk-eq-hq-gt-hv": dict(H_q=4, H_k=4, H_v=2, S_q=16, D_qk=16),   # a dK pass and a dV pass
    "dqk-40-dv-24": dict(H_q=2, S_q=17, S_kv=33, D_qk=40, D_v=24, dtype="bf16"),
    "causal-br": dict(H_q=2, S_q=33, S_kv=47, D_qk=16, right=0, alignment="BOTTOM_RIGHT"),
    "band-tl": dict(H_q=2, S_q=37, S_kv=29, D_qk=16, left=3, right=2),
    "masked-rows-br-causal": dict(H_q=2, S_q=45, S_kv=13, D_qk=16, right=0,
                                  alignment="BOTTOM_RIGHT"),
    "scale-0.3": dict(H_q=2, S_q=24, D_qk=16, scale=0.3, dtype="bf16"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gradients(name):
    graph = dense_graph(**CASES[name])
    check(prepare(graph, seed=len(name)), AtomicEngine("cpu"))


def test_odd_output_layouts():
    """dQ BSHD with an odd pitch and an offset: the scratch is packed, the copy into dQ
    writes only the elements dQ's view addresses (triton_reference.check checks the gaps and guards)."""
    args = dict(H_q=4, H_k=2, H_v=1, S_q=18, S_kv=22, D_qk=24, D_v=16)
    dims = {p: t.dims for p, t in dense_graph(**args).tensors.items()}
    strides = {"dq": permuted(dims["dq"], (0, 2, 1, 3), pad=3), "dv": permuted(dims["dv"], (0, 1, 3, 2))}
    check(prepare(dense_graph(strides=strides, offsets={"dq": 1, "dv": 7}, **args), seed=5),
          AtomicEngine("cpu"))


def test_score_modifiers():
    graph = with_modifiers(dense_graph(B=2, H_q=4, H_k=2, S_q=20, S_kv=24, D_qk=16, right=0),
                           bias="batch", dbias=True, sinks=True, dsinks=True, softcap=5.0)
    check(prepare(graph, seed=11), AtomicEngine("cpu"))


def test_shifted_logits_with_a_partial_kv_block():
    """Every score near -110 (LSE below fp32's exp range): in the last KV block, rows past the
    sequence have S = 0, so their P^T = exp(-LSE) overflows to inf and K there is 0. The dK
    pass needs no mask for those rows (never stored), the atomic dQ does: inf * 0 = NaN."""
    graph = dense_graph(H_q=2, S_q=24, S_kv=40, D_qk=16, dtype="fp16")   # 40 = 32 + 8 rows
    gen = torch.Generator().manual_seed(3)
    scale = float(graph.attributes.attn_scale)
    offset = (110.0 / (16 * scale)) ** 0.5     # q . k * scale = -offset^2 * D * scale
    dims = {p: t.dims for p, t in graph.tensors.items()}
    inputs = {p: torch.randn(dims[p], generator=gen, dtype=torch.float64) for p in ("q", "k", "v", "do")}
    inputs["q"] = inputs["q"] * 0.1 + offset
    inputs["k"] = inputs["k"] * 0.1 - offset
    check(prepare(graph, inputs=inputs), AtomicEngine("cpu"))


def _launch(engine, graph):
    tensors = {p: torch.zeros(t.dims, dtype=torch.float32 if t.dtype == "fp32" else torch.bfloat16)
               for p, t in graph.tensors.items()}
    return launch.prepare(graph, tensors, engine.config(graph), atomic_dq=engine.uses_atomic_dq(graph))


def test_atomic_only_where_it_serves():
    """Padded graphs get the scratch (and the sm90 atomic tiles where the table has them) and
    pointer loads; a graph asking for a deterministic backward, a ragged one or one with head
    dims past 128 runs the dQ kernel."""
    engine = TritonAtomicDqEngine("cpu")
    padded = dense_graph(H_q=2, S_q=16, D_qk=16, dtype="bf16")
    assert _launch(engine, padded).dq_scratch is not None
    assert _launch(TritonEngine("cpu"), padded).dq_scratch is None
    # the atomic launches keep pointer loads; the same graph without them takes descriptors
    assert not _launch(engine, padded).flags["TMA"]
    assert _launch(TritonEngine("cpu"), padded).flags["TMA"]
    asks = dataclasses.replace(padded, attributes=dataclasses.replace(
        padded.attributes, deterministic_algorithm=True))
    assert not engine.uses_atomic_dq(asks)
    ragged = ragged_graph((0, 9, 16), (0, 12, 16), H_q=2, H_k=2, H_v=2, D_qk=16, D_v=16)
    assert not engine.uses_atomic_dq(ragged)
    with pytest.raises(ValueError, match="padded graphs only"):
        launch.dq_scratch(ragged, torch.zeros(16, 2, 16))
    assert engine.uses_atomic_dq(dense_graph(H_q=2, S_q=16, D_qk=128, D_v=96))
    assert atomic_dq_serves(padded, "sm90") and not atomic_dq_serves(padded, "sm120")
    wide = dense_graph(H_q=2, S_q=16, D_qk=192, D_v=130, dtype="bf16")
    assert not engine.uses_atomic_dq(wide) and _launch(engine, wide).dq_scratch is None
    assert engine.deterministic is False and engine.deterministic_mode is True
    plain = configs.config_for("sm90", 128, 128)
    atomic = configs.config_for("sm90", 128, 128, atomic_dq=True)
    assert atomic == plain.atomic_dq != plain
    assert configs.config_for("sm90", 128, 128, banded=True, atomic_dq=True) == atomic


def test_no_dq_kernel_runs():
    calls = []

    class Recorder:
        def __getattr__(self, name):
            return type("Site", (), {"__getitem__": lambda self, grid: lambda *a, **k: calls.append(name)})()
    graph = dense_graph(H_q=2, S_q=16, D_qk=16, dtype="bf16")
    L = dataclasses.replace(_launch(TritonAtomicDqEngine("cpu"), graph), kernels=Recorder())
    launch.run(L)
    assert calls == ["bwd_preprocess", "bwd_dkdv"]
