"""The Triton engine's declines: each arm has a graph that only it declines (the same graph
with that one thing fixed is accepted), with the exact reason code; plus accept cases for
what is served natively, and the per-arch block configs."""
import dataclasses
import os

import pytest

from bundlegen import reasons as R
from bundlegen.graph import Graph, dense_graph, packed_strides
from bundlegen.engines.triton import configs
from bundlegen.engines.triton.capabilities import INTERPRET_HINT, ROWS, Capabilities
from bundlegen.engines.triton.engine import TritonEngine
from tests.triton_reference import permuted
from bundlegen.engines.triton.aot import compile_env

GPU_ARCHS = ("sm90", "sm120", "gfx942")


def engine_for(arch: str) -> TritonEngine:
    """A CPU engine that answers as the `arch` row would (is_applicable reads only the graph,
    the device type and the arch)."""
    engine = TritonEngine("cpu")
    engine.arch = arch
    return engine


def with_strides(graph: Graph, port: str, strides) -> Graph:
    tensors = dict(graph.tensors)
    tensors[port] = dataclasses.replace(tensors[port], strides=tuple(strides))
    return Graph(tensors=tensors, attributes=graph.attributes)


def code(reason):
    return None if reason is None else R.code_of(reason)


BASE = dict(B=2, H_q=4, H_k=2, H_v=2, S_q=16, S_kv=24, D_qk=64, D_v=64, dtype="bf16")

# (name, the declined graph, the same graph with that one thing fixed, the code)
DECLINES = [
    ("d-qk-264", dense_graph(**dict(BASE, D_qk=264)), dense_graph(**dict(BASE, D_qk=256)),
     R.HEAD_DIM_TOO_LARGE),
    ("d-v-257", dense_graph(**dict(BASE, D_v=257)), dense_graph(**dict(BASE, D_v=256)),
     R.HEAD_DIM_TOO_LARGE),
    ("dq-batch-stride-0", with_strides(dense_graph(**BASE), "dq", (0, 16 * 64, 64, 1)),
     dense_graph(**BASE), R.ZERO_STRIDE_OUTPUT),
    ("dk-head-stride-0", with_strides(dense_graph(**BASE), "dk", (2 * 24 * 64, 0, 64, 1)),
     dense_graph(**BASE), R.ZERO_STRIDE_OUTPUT),
    ("dv-seq-stride-0", with_strides(dense_graph(**BASE), "dv", (2 * 64, 64, 0, 1)),
     dense_graph(**BASE), R.ZERO_STRIDE_OUTPUT),
    ("dk-batch-eq-head-stride", with_strides(dense_graph(**BASE), "dk", (24 * 64,) * 2 + (64, 1)),
     dense_graph(**BASE), R.OVERLAPPING_OUTPUT),
    ("dq-short-rows", with_strides(dense_graph(**BASE), "dq", (4 * 16 * 32, 16 * 32, 32, 1)),
     dense_graph(**BASE), R.OVERLAPPING_OUTPUT),
]


@pytest.mark.parametrize("arch", GPU_ARCHS + ("cpu",))
def test_a_drawn_mask_is_served_where_the_row_says(arch):
    """No dropout_mask port: the kernels draw the mask on rows with drawn_dropout, the others
    decline (p = 0 is the plain graph everywhere)."""
    drawn, plain = dense_graph(**dict(BASE, dropout=0.1)), dense_graph(**dict(BASE, dropout=0.0))
    assert engine_for(arch).is_applicable(plain) is None
    want = None if ROWS[arch].drawn_dropout and ROWS[arch].dropout_spill(drawn) is None else R.DROPOUT_NOT_SERVED
    assert code(engine_for(arch).is_applicable(drawn)) == want
    assert ROWS["cpu"].drawn_dropout


@pytest.mark.parametrize("arch", GPU_ARCHS + ("cpu",))
@pytest.mark.parametrize("name,declined,fixed,expected", DECLINES, ids=[d[0] for d in DECLINES])
def test_each_decline_arm(arch, name, declined, fixed, expected):
    engine = engine_for(arch)
    assert code(engine.is_applicable(declined)) == expected
    assert engine.is_applicable(fixed) is None


def _accepts():
    g = dict(BASE)
    dims = {p: t.dims for p, t in dense_graph(**g).tensors.items()}
    yield "packed-bf16", dense_graph(**g)
    yield "fp16", dense_graph(**dict(g, dtype="fp16"))
    yield "d-256-and-8", dense_graph(**dict(g, D_qk=256, D_v=8))
    yield "d-40-24-masks", dense_graph(**dict(g, D_qk=40, D_v=24, left=3, right=-1,
                                             alignment="BOTTOM_RIGHT"))
    yield "mqa-hv-ne-hk", dense_graph(**dict(g, H_k=1, H_v=4))
    yield "bshd", dense_graph(strides={p: permuted(d, (0, 2, 1, 3))
                                       for p, d in dims.items() if p != "stats"}, **g)
    yield "head-dim-stride-2-everywhere", dense_graph(
        strides={p: tuple(2 * s for s in packed_strides(d)) for p, d in dims.items()}, **g)
    yield "broadcast-inputs", dense_graph(strides={
        "q": (0, 0, 64, 1), "k": (0, 24 * 64, 64, 1), "v": (2 * 24 * 64, 0, 64, 1),
        "o": (0, 16 * 64, 64, 1), "do": (4 * 16 * 64, 0, 64, 1)}, **g)
    yield "stats-s-major", dense_graph(strides={"stats": (16 * 4, 1, 4, 1)}, **g)
    yield "stats-padded-head", dense_graph(strides={"stats": (4 * 21, 21, 1, 99)}, **g)
    g1 = dict(g, B=1, H_q=1, H_k=1, H_v=1)
    yield "zero-stride-on-length-1-output-axes", dense_graph(strides={
        "dq": (0, 0, 64, 1), "dk": (0, 0, 64, 1), "dv": (0, 0, 64, 1)}, **g1)
    yield "custom-scale", dense_graph(**dict(g, scale=3.5))


ACCEPTS = list(_accepts())


@pytest.mark.parametrize("arch", GPU_ARCHS + ("cpu",))
@pytest.mark.parametrize("name,graph", ACCEPTS, ids=[a[0] for a in ACCEPTS])
def test_served_natively(arch, name, graph):
    assert engine_for(arch).is_applicable(graph) is None


def test_arch_not_in_table():
    reason = engine_for("sm80").is_applicable(dense_graph(**BASE))
    assert code(reason) == R.ARCH_NOT_SERVED
    assert "sm80" in reason
    assert engine_for("sm90").is_applicable(dense_graph(**BASE)) is None


def test_cpu_without_interpreter(monkeypatch):
    engine = TritonEngine("cpu")
    graph = dense_graph(**BASE)
    assert engine.is_applicable(graph) is None
    monkeypatch.delenv("TRITON_INTERPRET")
    assert engine.is_applicable(graph) == f"device-not-served: {INTERPRET_HINT}"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert code(engine.is_applicable(graph)) == R.DEVICE_NOT_SERVED


def test_on_the_cpu_the_engine_selects_the_interpreter_itself(tmp_path):
    """No TRITON_INTERPRET in the environment: `bundlegen run --engine triton --device cpu`
    still runs the kernels (through the interpreter), it does not decline them all."""
    import subprocess
    import sys
    env = compile_env()
    out = subprocess.run([sys.executable, "-m", "bundlegen", "run", "--level", "quick", "--engine", "triton",
                          "--device", "cpu", "-k", "AX-HEAD-DIMS-D64 and AX-MASK-CAUSAL-TL and AX-BIAS-NONE and AX-SINKS-OFF "
                          "and AX-SOFTCAP-OFF", "--quiet",
                          "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    records = [line for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert records and all('"verdict": "pass"' in r for r in records)


def test_cpu_with_triton_imported_in_the_other_mode():
    """Triton decorates its library at import: a process that imported it without the
    interpreter and set TRITON_INTERPRET=1 later cannot run on the CPU, and says so."""
    import subprocess
    import sys
    code = ("import os; os.environ.pop('TRITON_INTERPRET', None); import triton.language; "
            "os.environ['TRITON_INTERPRET'] = '1'; "
            "from bundlegen.engines.triton.engine import TritonEngine; "
            "from bundlegen.graph import dense_graph; "
            "print(TritonEngine('cpu').is_applicable(dense_graph()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(
        "device-not-served: Triton was imported without TRITON_INTERPRET=1"), out.stdout


def test_decline_order_head_dim_first():
    """The first reason wins: an fp32 graph past sm90's fp32 head dims with a zero-stride
    output is a head-dim decline (every dtype is served)."""
    graph = with_strides(dense_graph(**dict(BASE, dtype="fp32", D_qk=192, D_v=192)), "dq",
                         (0, 16 * 192, 192, 1))
    assert code(engine_for("sm90").is_applicable(graph)) == R.HEAD_DIM_TOO_LARGE


def test_reason_codes_are_registered():
    for _, declined, _, expected in DECLINES:
        assert expected in R.ENGINE
    assert {R.ARCH_NOT_SERVED, R.DEVICE_NOT_SERVED} <= R.ENGINE


def test_engine_identity():
    engine = TritonEngine("cpu")
    assert engine.name == "triton" and engine.deterministic is True
    assert set(engine.archs()) == {"sm90", "sm120", "gfx942", "cpu"}
    assert all(isinstance(row, Capabilities) for row in ROWS.values())
    assert set(ROWS) == set(configs.ARCHS)
    assert [a for a, row in ROWS.items() if not row.run_here] == ["sm120", "gfx942"]


@pytest.mark.parametrize("arch", sorted(configs.ARCHS))
def test_every_head_dim_has_a_config(arch):
    """Every head-dim pair up to 256 maps to a config whose tiles are powers of two >= 16;
    only gfx942 passes the AMD launch options. (Shared memory against each arch's budget:
    test_triton_aot.py and `python -m bundlegen.engines.triton.aot`.)"""
    for d_qk in range(1, 257, 7):
        for d_v in (d_qk, 8, 256):
            cfg = configs.config_for(arch, d_qk, d_v)
            for b in (cfg.block_m1, cfg.block_n1, cfg.block_m2, cfg.block_n2):
                assert b >= 16 and b & (b - 1) == 0
            assert cfg.num_warps in (4, 8) and cfg.num_stages >= 1
    amd = set(configs.config_for(arch, 64, 64).launch_kwargs()) >= {"waves_per_eu",
                                                                    "matrix_instr_nonkdim"}
    assert amd == (arch == "gfx942")


def test_shrink_terminates_at_min_blocks():
    cfg = configs.config_for("sm90", 128, 128)
    seen = [cfg]
    while (cfg := configs.shrink(cfg)) is not None:
        seen.append(cfg)
        assert len(seen) < 20
    last = seen[-1]
    assert (last.block_m1, last.block_n1, last.block_m2, last.block_n2, last.num_stages) == \
        (16, 16, 16, 16, 1)


def _dropout_graph(form: str, tier: int, rows: str):
    """A graph of head dim `tier` with dropout in `form`, its io rows aligned or not (q's offset 1)."""
    from bundlegen.graph import with_modifiers
    g = dense_graph(**dict(BASE, D_qk=tier, D_v=tier, offsets={"q": 1} if rows == "unaligned" else {}))
    return with_modifiers(g, dropout=0.5, dropout_mask="full" if form == "port" else None)


@pytest.mark.parametrize("arch", GPU_ARCHS)
def test_dropout_is_declined_exactly_where_its_variants_spill(arch):
    """Each (form, tier, io rows) of the row's dropout_spills is declined, naming the report;
    every other combination of the row's tiers is served (the resource report covers them:
    tests/test_triton_resources.py)."""
    row = ROWS[arch]
    assert row.dropout and row.drawn_dropout
    tiers = [limit for limit, _ in configs.ARCHS[arch].tiers]
    for form in ("port", "drawn"):
        for tier in tiers:
            for rows in ("aligned", "unaligned"):
                reason = engine_for(arch).is_applicable(_dropout_graph(form, tier, rows))
                if (form, tier, rows) in row.dropout_spills:
                    assert code(reason) == R.DROPOUT_NOT_SERVED and "resources.json" in reason, reason
                else:
                    assert reason is None, (form, tier, rows, reason)


def _ragged(tier: int, **mods):
    from bundlegen.graph import ragged_graph, with_modifiers
    g = ragged_graph((0, 9, 16), (0, 12, 20), H_q=4, H_k=2, D_qk=tier, dtype="bf16",
                     seqused_q=(7, 6), seqused_kv=(10, 8))
    return with_modifiers(g, **mods)


@pytest.mark.parametrize("arch", GPU_ARCHS)
def test_alibi_ragged_modifiers_and_used_lengths_are_declined_exactly_where_their_variants_spill(arch):
    """ALiBi slopes (padded and ragged), every modifier on a ragged batch with used lengths:
    served at every tier, but dBias on a ragged batch below the row's ragged_dbias_min_d and
    ALiBi's variants with 64-bit tile offsets at the row's wide_alibi_spills tiers, each
    declined naming the report."""
    from bundlegen.engines.triton.resources import _widened
    from bundlegen.graph import with_modifiers
    row = ROWS[arch]
    for tier in [limit for limit, _ in configs.ARCHS[arch].tiers]:
        for graph in (_ragged(tier, softcap=5.0, sinks=True, dsinks=True, alibi_slopes="batch"),
                      _ragged(tier), with_modifiers(dense_graph(**dict(BASE, D_qk=tier, D_v=tier)),
                                                    alibi_slopes="head", softcap=5.0)):
            assert engine_for(arch).is_applicable(graph) is None, (tier, graph)
            wide = engine_for(arch).is_applicable(_widened(graph))
            if tier in row.wide_alibi_spills and graph.modifiers:
                assert code(wide) == R.MODIFIER_COMBINATION_NOT_SERVED and "resources.json" in wide
            else:
                assert wide is None, (tier, wide)
        reason = engine_for(arch).is_applicable(_ragged(tier, bias="full", dbias=True))
        if tier < (row.ragged_dbias_min_d or 0):
            assert code(reason) == R.MODIFIER_COMBINATION_NOT_SERVED and "resources.json" in reason
        else:
            assert reason is None, (tier, reason)
    assert any(ROWS[a].wide_alibi_spills for a in GPU_ARCHS)
    assert any(ROWS[a].ragged_dbias_min_d for a in GPU_ARCHS)


@pytest.mark.parametrize("arch", GPU_ARCHS + ("cpu",))
def test_ragged_dropout_is_served_where_the_row_says(arch):
    """Dropout on a ragged batch, either form, every tier: served on rows with ragged_dropout
    where the padded (form, tier, io rows) is not among dropout_spills, declined elsewhere."""
    row = ROWS[arch]
    for tier in [limit for limit, _ in configs.ARCHS[arch].tiers]:
        for mask in ("full", None):
            graph = _ragged(tier, dropout=0.5, dropout_mask=mask)
            reason = engine_for(arch).is_applicable(graph)
            if row.ragged_dropout and row.dropout_spill(graph) is None:
                assert reason is None, (tier, mask, reason)
            else:
                assert code(reason) == R.DROPOUT_NOT_SERVED, (tier, mask, reason)
    assert ROWS["cpu"].ragged_dropout
