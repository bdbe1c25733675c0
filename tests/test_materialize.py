"""Materialization: guard regions and gaps hold the canary and every out-of-view write is
caught, inputs are reproducible and a modified input is caught, O and Stats come from the
oracle forward with their declared strides, and the input distributions do what they say."""
from __future__ import annotations

import math

import pytest
import torch

from bundlegen.graph import INPUT_PORTS, OUTPUT_PORTS, PORTS
from bundlegen.harness import distributions as DIST
from bundlegen.harness import materialize as M
from bundlegen.harness import oracle
from bundlegen.harness.checks import bit_pattern
from tests.graph_factory import make_case, make_graph, packed_strides

B, H, S_Q, S_KV, D = 2, 2, 5, 7, 8


def write_reference(m: M.Materialized) -> None:
    """A perfect engine: the oracle gradients rounded to the io dtype, through the views."""
    for port in OUTPUT_PORTS:
        m.tensors[port].copy_(m.reference.gradient(port))


def poke(m: M.Materialized, port: str, index: int, value: float = 0.0) -> None:
    """One bad write: element `index` of the port's storage."""
    m.storages[port][index] = value


def view_start(m: M.Materialized, port: str) -> int:
    return m.origins[port] + m.case.graph.tensors[port].offset


def view_end(m: M.Materialized, port: str) -> int:
    """One past the last addressed storage element."""
    return m.origins[port] + m.case.graph.tensors[port].storage_elements


def padded_rows(dims, pad):
    """BHSD with each row of the last axis padded by `pad` elements."""
    b, h, s, d = dims
    return (h * s * (d + pad), s * (d + pad), d + pad, 1)


def interleaved_heads(dims):
    """Heads interleaved with another tensor's ([B, S, H, 2, D] with this one at index 0)."""
    b, h, s, d = dims
    return (s * h * 2 * d, 2 * d, h * 2 * d, 1)


@pytest.fixture(scope="module")
def packed():
    return M.materialize(make_case(make_graph(B=B, H_q=H, H_k=1, H_v=1, S_q=S_Q, S_kv=S_KV,
                                              D_qk=D, D_v=D)), "cpu")


def fresh(**kw) -> M.Materialized:
    sizes = dict(B=B, H_q=H, H_k=1, H_v=1, S_q=S_Q, S_kv=S_KV, D_qk=D, D_v=D)
    sizes.update(kw)
    return M.materialize(make_case(make_graph(**sizes)), "cpu")


# ----------------------------------------------------------------------------- clean runs
def test_a_clean_run_reports_nothing(packed):
    write_reference(packed)
    assert M.guard_violations(packed) == []
    assert M.modified_inputs(packed) == []
    assert M.nonfinite_outputs(packed) == []
    M.reset_outputs(packed)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_outputs_start_as_canary_and_reset_restores_it(dtype):
    m = fresh(dtype=dtype)
    bits_dtype, canary = M.BITS_DTYPES[dtype], M.OUTPUT_CANARY_BITS[dtype]
    for port in OUTPUT_PORTS:
        assert (m.storages[port].view(bits_dtype) == canary).all()
        assert torch.isnan(m.tensors[port]).all()
    write_reference(m)
    M.reset_outputs(m)
    for port in OUTPUT_PORTS:
        assert (m.storages[port].view(bits_dtype) == canary).all()
    # the canary is not a NaN that arithmetic produces
    assert canary not in (torch.tensor([math.nan], dtype=m.storages["dq"].dtype).view(bits_dtype).item(),
                          torch.tensor([-math.nan], dtype=m.storages["dq"].dtype).view(bits_dtype).item())


def test_views_have_declared_dims_strides_and_device(packed):
    for port in PORTS:
        spec = packed.case.graph.tensors[port]
        t = packed.tensors[port]
        assert tuple(t.shape) == spec.dims and tuple(t.stride()) == spec.strides
        assert t.storage_offset() == packed.origins[port] + spec.offset
        assert t.untyped_storage().data_ptr() == packed.storages[port].untyped_storage().data_ptr()
        assert t.device.type == "cpu"


# ----------------------------------------------------------------------------- canaries
@pytest.mark.parametrize("port", ["dq", "dk", "dv"])
def test_one_element_before_the_view_is_caught(port):
    m = fresh()
    write_reference(m)
    poke(m, port, view_start(m, port) - 1)
    assert M.guard_violations(m) == [port]


@pytest.mark.parametrize("port", ["dq", "dk", "dv"])
def test_one_element_after_the_view_is_caught(port):
    m = fresh()
    write_reference(m)
    poke(m, port, view_end(m, port))
    assert M.guard_violations(m) == [port]


def test_a_write_below_the_declared_offset_is_caught():
    m = fresh(offsets={"dv": 40})
    write_reference(m)
    assert M.guard_violations(m) == []
    poke(m, "dv", m.origins["dv"])  # declared element 0: in storage, before the offset
    assert M.guard_violations(m) == ["dv"]


def test_a_write_into_a_gap_of_a_padded_row_output_is_caught():
    dims = (B, H, S_Q, D)
    m = fresh(out_strides={"dq": padded_rows(dims, 3)})
    write_reference(m)
    assert M.guard_violations(m) == []
    poke(m, "dq", view_start(m, "dq") + D)  # the first pad element after row 0
    assert M.guard_violations(m) == ["dq"]


def test_a_write_into_a_gap_of_an_interleaved_output_is_caught():
    dims = (B, 2, S_KV, D)
    m = fresh(H_q=4, H_k=2, H_v=2, out_strides={"dk": interleaved_heads(dims)})
    write_reference(m)
    assert M.guard_violations(m) == []
    poke(m, "dk", view_start(m, "dk") + D)  # the other tensor's slot after head 0, row 0
    assert M.guard_violations(m) == ["dk"]


def test_a_nan_written_into_a_guard_is_caught():
    m = fresh()
    write_reference(m)
    poke(m, "dv", view_end(m, "dv") + 5, math.nan)
    assert M.guard_violations(m) == ["dv"]


def test_a_write_next_to_an_input_is_caught():
    m = fresh()
    poke(m, "k", view_end(m, "k"))
    assert M.guard_violations(m) == ["k"]
    assert M.modified_inputs(m) == ["k"]


@pytest.mark.parametrize("strides_of", [
    lambda dims: packed_strides(dims),
    lambda dims: packed_strides(dims, (0, 2, 1, 3)),
    lambda dims: padded_rows(dims, 5),
    lambda dims: interleaved_heads(dims),
    lambda dims: (0, dims[2] * dims[3], dims[3], 1),          # broadcast over batch
    lambda dims: (dims[3], dims[3], 1, 1),                     # overlapping strides
])
def test_unaddressed_is_exactly_what_the_view_never_reads(strides_of):
    dims = (B, H, S_KV, D)
    m = fresh(H_q=H, H_k=H, H_v=H, out_strides={"k": strides_of(dims), "dk": strides_of(dims)})
    for port in ("k", "dk"):
        spec = m.case.graph.tensors[port]
        arange = torch.arange(M.storage_size(spec))
        addressed = torch.zeros(M.storage_size(spec), dtype=torch.bool)
        addressed[M.view_of(arange, spec).reshape(-1)] = True
        assert torch.equal(m.unaddressed[port], ~addressed)


@pytest.mark.parametrize("strides_of, dense", [
    (lambda dims: packed_strides(dims), True),
    (lambda dims: packed_strides(dims, (0, 2, 1, 3)), True),
    (lambda dims: padded_rows(dims, 5), False),
    (lambda dims: interleaved_heads(dims), False),
    (lambda dims: (0, dims[2] * dims[3], dims[3], 1), True),   # broadcast over batch
    (lambda dims: (dims[2] * dims[3], 0, dims[3], 1), True),   # broadcast over heads
    (lambda dims: (dims[3], dims[3], 1, 1), False),            # overlapping: scanned by mask
])
def test_a_dense_view_leaves_exactly_its_two_ends_unaddressed(strides_of, dense):
    """The guard scan's shortcut: a view counts as dense only when everything outside its
    span is all it leaves unaddressed."""
    dims = (B, H, S_KV, D)
    m = fresh(H_q=H, H_k=H, H_v=H, out_strides={"k": strides_of(dims)})
    spec = m.case.graph.tensors["k"]
    assert M.is_dense(spec) == dense
    start, end = M.addressed_span(spec)
    outside = torch.ones(M.storage_size(spec), dtype=torch.bool)
    outside[start:end] = False
    if dense:
        assert torch.equal(m.unaddressed["k"], outside)


@pytest.mark.parametrize("pad", [0, 3])
def test_a_guard_write_is_caught_through_either_scan(pad):
    """Dense views (no pad) and views with gaps (pad) both catch a write just outside."""
    dims = (B, H, S_Q, D)
    m = fresh(out_strides={"dq": padded_rows(dims, pad)} if pad else {})
    assert M.is_dense(m.case.graph.tensors["dq"]) == (pad == 0)
    write_reference(m)
    assert M.guard_violations(m) == []
    poke(m, "dq", view_end(m, "dq") + M.GUARD_ELEMS - 1)   # the last element of the storage
    assert M.guard_violations(m) == ["dq"]
    M.reset_outputs(m)
    write_reference(m)
    poke(m, "dq", 0)                                        # the first
    assert M.guard_violations(m) == ["dq"]


def test_several_bad_ports_are_each_named():
    """Every bad port is named, no other, in port order."""
    m = fresh(out_strides={"dq": padded_rows((B, H, S_Q, D), 2)})
    write_reference(m)
    for port in ("k", "stats", "dv", "dq"):
        poke(m, port, 0)
    assert M.guard_violations(m) == ["k", "stats", "dq", "dv"]
    assert M.modified_inputs(m) == ["k", "stats"]
    m = fresh()
    for port in ("q", "do"):
        view = m.tensors[port]
        view[(0,) * view.dim()] = view[(0,) * view.dim()] + 1
    assert M.guard_violations(m) == [] and M.modified_inputs(m) == ["q", "do"]


def test_the_input_baselines_are_separate_copies_on_the_device():
    m = fresh()
    for port in INPUT_PORTS:
        assert m.baselines[port].device == m.storages[port].device
        assert m.baselines[port].untyped_storage().data_ptr() != m.storages[port].untyped_storage().data_ptr()
        assert torch.equal(bit_pattern(m.baselines[port]), bit_pattern(m.storages[port]))
    assert m.oracle_s > 0


# ----------------------------------------------------------------------------- inputs
def test_a_modified_input_element_is_caught():
    for port in ("q", "k", "v", "o", "do", "stats"):
        m = fresh()
        assert M.modified_inputs(m) == []
        view = m.tensors[port]
        view[(0,) * view.dim()] = view[(0,) * view.dim()] + 1
        assert M.modified_inputs(m) == [port]
        assert M.guard_violations(m) == []


def test_nan_in_an_output_is_detectable():
    m = fresh()
    write_reference(m)
    m.tensors["dk"][0, 0, 3, 1] = math.nan
    assert M.nonfinite_outputs(m) == ["dk"]
    m = fresh()
    write_reference(m)
    M.reset_outputs(m)
    m.tensors["dq"].copy_(m.reference.dq)
    m.tensors["dk"].copy_(m.reference.dk)
    assert M.nonfinite_outputs(m) == ["dv"]  # never written: still the canary


@pytest.mark.parametrize("distribution", ["randn", "small-int", "shifted-logits"])
def test_inputs_are_reproducible_and_layout_independent(distribution):
    graph = make_graph(B=B, H_q=4, H_k=2, H_v=1, S_q=S_Q, S_kv=S_KV, D_qk=D, D_v=12)
    a = M.materialize(make_case(graph, seed=7, distribution=distribution), "cpu")
    b = M.materialize(make_case(graph, seed=7, distribution=distribution), "cpu")
    for port in INPUT_PORTS:
        assert torch.equal(a.snapshots[port].view(torch.int16 if port != "stats" else torch.int32),
                           b.snapshots[port].view(torch.int16 if port != "stats" else torch.int32))
    bshd = M.materialize(make_case(make_graph(B=B, H_q=4, H_k=2, H_v=1, S_q=S_Q, S_kv=S_KV, D_qk=D,
                                              D_v=12, layout="bshd"), seed=7,
                                   distribution=distribution), "cpu")
    la, lb = M.logical_inputs(a), M.logical_inputs(bshd)
    for port in INPUT_PORTS:
        assert torch.equal(la[port], lb[port]), port
    other = M.materialize(make_case(graph, seed=8, distribution=distribution), "cpu")
    assert not torch.equal(M.logical_inputs(other)["q"], la["q"])


@pytest.mark.parametrize("distribution", ["randn", "small-int", "shifted-logits"])
def test_inputs_do_not_depend_on_the_thread_count(distribution, monkeypatch):
    """Chunks drawn on one thread and by the shared pool give the same bits; each chunk has
    its own stream (no two chunks repeat each other)."""
    monkeypatch.setattr(DIST, "THREADED_MIN_ELEMS", 0)
    graph = make_graph(B=2, H_q=4, H_k=2, H_v=1, S_q=37, S_kv=29, D_qk=24, D_v=8, dtype="fp16",
                       out_strides={"v": (0, 29 * 8, 8, 1)})  # v broadcast over batch
    monkeypatch.setattr(DIST, "default_threads", lambda: 4)  # a pool even on a 1-core machine
    runs = [DIST.generate_inputs(graph, distribution, 11, threads=t, chunk_elems=100) for t in (1, 4)]
    for port in DIST.GENERATED_PORTS:
        for other in runs[1:]:
            assert torch.equal(runs[0][port].view(torch.int16), other[port].view(torch.int16)), port
    q = runs[0]["q"].reshape(-1)
    step = 96 if distribution == "shifted-logits" else 100  # shifted-logits: whole rows of 24
    assert not torch.equal(q[:step], q[step:2 * step])
    assert runs[0]["v"].shape == (1, 1, 29, 8)
    other_seed = DIST.generate_inputs(graph, distribution, 12, chunk_elems=100)
    assert not torch.equal(other_seed["q"], runs[0]["q"])
    # the chunk size is part of the definition: another chunk size draws other values
    assert not torch.equal(DIST.generate_inputs(graph, distribution, 11, chunk_elems=1 << 20)["q"],
                           runs[0]["q"])


@pytest.mark.parametrize("distribution", ["randn", "small-int", "shifted-logits"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_materialized_inputs_are_the_generated_values(distribution, dtype):
    """materialize rounds the drawn values while writing them: the same bits as
    generate_inputs, through any layout (padded rows, broadcast)."""
    dims_q = (B, 4, S_Q, D)
    graph = make_graph(B=B, H_q=4, H_k=2, H_v=1, S_q=S_Q, S_kv=S_KV, D_qk=D, D_v=12, dtype=dtype,
                       out_strides={"q": padded_rows(dims_q, 3), "v": (0, 0, 12, 1)})
    m = M.materialize(make_case(graph, seed=5, distribution=distribution), "cpu")
    want = DIST.generate_inputs(graph, distribution, 5)
    logical = M.logical_inputs(m)
    for port in DIST.GENERATED_PORTS:
        assert torch.equal(bit_pattern(logical[port]), bit_pattern(want[port].expand(logical[port].shape))), port
    assert M.guard_violations(m) == []


def test_chunk_seeds_differ_by_seed_port_and_chunk():
    seeds = {DIST.chunk_seed(s, p, c) for s in (0, 1, 2**40) for p in range(4) for c in range(50)}
    assert len(seeds) == 3 * 4 * 50
    assert all(0 <= s < 2**63 for s in seeds)


def test_shifted_logits_rows_are_centred_across_chunk_boundaries():
    graph = make_graph(B=1, H_q=2, S_q=50, S_kv=40, D_qk=24, D_v=8, dtype="fp32")
    values = DIST.generate_inputs(graph, "shifted-logits", 3, threads=1, chunk_elems=100)
    scale, d = graph.attributes.attn_scale, graph.D_qk
    alpha = math.sqrt(DIST.SHIFTED_LOGIT / (scale * d))
    for port, sign in (("q", 1.0), ("k", -1.0)):
        row_mean = values[port].double().mean(-1)
        torch.testing.assert_close(row_mean, torch.full_like(row_mean, sign * alpha), rtol=1e-5, atol=1e-5)


def test_broadcast_inputs_hold_one_value_per_element():
    dims_k = (B, 1, S_KV, D)
    m = fresh(out_strides={"k": (0, S_KV * D, D, 1), "v": (0, 0, D, 1)})
    k = M.logical_inputs(m)["k"]
    assert torch.equal(k[0], k[1])
    assert M.view_of(m.snapshots["k"], m.case.graph.tensors["k"]).shape == dims_k
    # only batch 0 is addressed
    assert int((~m.unaddressed["k"]).sum()) == S_KV * D


def test_small_int_values_are_exact_small_and_sparse():
    m = M.materialize(make_case(make_graph(S_q=64, S_kv=64, D_qk=32, D_v=32), distribution="small-int"),
                      "cpu")
    for port in ("q", "k", "v", "do"):
        x = M.logical_inputs(m)[port].float()
        assert set(x.unique().tolist()) <= {-2.0, -1.0, 0.0, 1.0, 2.0}
        assert 0.4 < float((x == 0).float().mean()) < 0.6


@pytest.mark.parametrize("scale", [None, 0.5, 2.0])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_shifted_logits_put_every_lse_below_fp32_exp_range(scale, dtype):
    graph = make_graph(B=1, H_q=2, S_q=33, S_kv=300, D_qk=64, D_v=16, scale=scale, dtype=dtype,
                       right=0, alignment="BOTTOM_RIGHT")
    m = M.materialize(make_case(graph, distribution="shifted-logits"), "cpu")
    lse = m.forward.lse
    assert torch.isfinite(lse).all()
    assert float(lse.max()) < -88.7
    assert float(lse.min()) > -130.0
    assert torch.isfinite(m.reference.dq).all()


# ----------------------------------------------------------------------------- O and Stats
def test_o_and_stats_come_from_the_oracle_forward_with_declared_strides():
    dims_o = (B, H, S_Q, D)
    stats_strides = (H * (S_Q + 3), S_Q + 3, 1, 1)  # padded head stride
    m = fresh(H_k=2, H_v=1, out_strides={"o": padded_rows(dims_o, 2), "stats": stats_strides,
                                         "do": packed_strides(dims_o, (0, 2, 1, 3))})
    logical = M.logical_inputs(m)
    q, k, v, do = (logical[p] for p in ("q", "k", "v", "do"))
    attrs = m.case.graph.attributes
    fwd = oracle.forward(q, k, v, attrs)
    assert torch.equal(logical["o"], fwd.o.to(torch.bfloat16))
    assert torch.equal(logical["stats"], fwd.lse.float().unsqueeze(-1))
    assert torch.equal(m.forward.o, fwd.o)
    want = oracle.backward(q, k, v, do, attrs, fwd)
    for name in oracle.GRADIENT_FIELDS:
        got = getattr(m.reference, name)
        assert got.device.type == "cpu" and got.dtype == torch.float64
        assert torch.equal(got, getattr(want, name))
    # the stats padding is a gap: canary, and guarded
    assert M.guard_violations(m) == []
    poke(m, "stats", view_start(m, "stats") + S_Q)
    assert M.guard_violations(m) == ["stats"]


def test_fully_masked_rows_store_minus_inf_stats_and_zero_o():
    graph = make_graph(S_q=9, S_kv=4, alignment="BOTTOM_RIGHT", right=0)
    m = M.materialize(make_case(graph), "cpu")
    logical = M.logical_inputs(m)
    assert torch.isneginf(logical["stats"][:, :, :5]).all()
    assert (logical["o"][:, :, :5] == 0).all()
    assert not torch.isnan(m.reference.dq).any()


def test_a_broadcast_o_that_cannot_hold_the_forward_is_refused():
    case = make_case(make_graph(out_strides={"o": (0, 0, 16, 1)}))
    with pytest.raises(M.MaterializeError, match=f"case {case.id}: port o has stride 0 on axis 1"):
        M.materialize(case, "cpu")


def test_write_view_refuses_values_that_overlapping_strides_cannot_hold():
    from bundlegen.graph import TensorSpec
    spec = TensorSpec(dims=(1, 1, 4, 2), strides=(4, 4, 1, 1), dtype="fp32")  # rows overlap
    storage = torch.zeros(M.storage_size(spec))
    distinct = torch.arange(8, dtype=torch.float32).reshape(1, 1, 4, 2)
    with pytest.raises(M.MaterializeError, match="case c: port o: strides .* make elements overlap"):
        M.write_view(storage, spec, distinct, case_id="c", port="o")
    M.write_view(storage, spec, torch.ones(1, 1, 4, 2), case_id="c", port="o")  # equal values fit


def test_an_invalid_graph_is_refused():
    with pytest.raises(M.MaterializeError, match="gqa-not-divisible"):
        M.materialize(make_case(make_graph(H_q=3, H_k=2)), "cpu")


def test_oracle_device_may_differ_from_the_case_device():
    graph = make_graph(S_q=9, S_kv=12, left=4)
    a = M.materialize(make_case(graph), "cpu", oracle_device="cpu", max_block_elems=17)
    b = M.materialize(make_case(graph), "cpu")
    torch.testing.assert_close(a.reference.dq, b.reference.dq, rtol=1e-13, atol=1e-15)


def test_materialize_in_several_threads_gives_each_case_its_own_bits():
    """The reused draw (and staging) buffers are per thread: in-process runs on several
    devices (--no-isolation --devices) materialize from several threads at once."""
    import threading

    cases = [make_case(make_graph(B=1, H_q=2, H_k=2, H_v=2, S_q=64 + 8 * i, S_kv=64, D_qk=32, D_v=32),
                       seed=100 + i) for i in range(4)]
    want = {c.data.seed: {p: bit_pattern(M.materialize(c, "cpu").storages[p]).clone() for p in ("q", "k")}
            for c in cases}
    got, barrier = {}, threading.Barrier(len(cases))

    def one(case):
        barrier.wait()
        for _ in range(5):
            m = M.materialize(case, "cpu")
            got.setdefault(case.data.seed, []).append({p: bit_pattern(m.storages[p]) for p in ("q", "k")})

    threads = [threading.Thread(target=one, args=(c,)) for c in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for seed, runs in got.items():
        assert all(torch.equal(r[p], want[seed][p]) for r in runs for p in ("q", "k")), seed
