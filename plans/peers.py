"""Peer grids: the published backward test grids of FlashAttention 2 and 3, PyTorch, the
cuDNN frontend, PyTorch's FlexAttention and TransformerEngine, as reference data (issue 17, item 2). Pure declarations: the peers' values
are facts read from the cited files (their code is not copied); the mapping rules below turn
them, and a case's own numbers, into value classes on the axes we share. The dry-run report
proves, per level, the share of each peer's distinct value pairs our cases cover
(generator/peer_coverage.py).

Axes we share: dtype, head_dims, seq, group, mask, layout.
Mapping rules (every one lives in this module):
- dtype: the io dtype name (`bf16`, `fp16`). fp32 is planned by entries of its own (SHP-FP32*,
  off the dtype axis) and fp8 has no backward in the peers read: neither is declared.
- head_dims: `d<D>` when D_qk = D_v, else `d<D_qk>-<D_v>`; a declared range (cuDNN's random
  draws) is its own class, held by every case whose dims fall in it (HEAD_DIM_RANGES).
- seq: the (S_q, S_kv) relation class (seq_class): `eq`, `q1` (S_q = 1 < S_kv), `kv1`
  (S_kv = 1 < S_q), else `lt` / `gt` with the ratio of the longer to the shorter (`x2` up to 2,
  `x8` up to 8, `wide` beyond); and `-tile` when both lengths are multiples of TILE, else
  `-tail`. A declared range holds every class a pair of lengths inside it can have.
- group: `r<H_q / H_k>` (MHA is r1, MQA with H_q heads is r<H_q>).
- mask: `none`, `causal`, `window` (left bound, right bound 0), `band` (left bound and a
  positive right bound), `left-only`, `right-only`, `strict-causal`, each with `-tl` / `-br`
  for the diagonal alignment; where S_q = S_kv the alignments coincide and a case holds both.
  FlashAttention (>= 2.1) aligns causal bottom-right; PyTorch's is_causal is top-left.
  FlashAttention 3's `local` draws a random (left, right) window: with causal it is a
  `window-br`, without a `band-br`.
- layout: the storage order of Q, K, V, O and dO (B, H, S by falling stride, D innermost:
  `bhsd`, `bshd`, `sbhd`, `hbsd`, `hsbd`, `shbd`; `mixed` when they differ), plus
  `qkv-packed` (Q, K, V slots of one buffer), `kv-packed` (K and V slots of one buffer) and
  `do-strides-differ` (dO's strides are not O's).
"""
from __future__ import annotations

from typing import Any, Mapping

from bundlegen.plans.records import PeerGrid, PeerPlan, PeerTest

PEER_AXES = ("dtype", "head_dims", "seq", "group", "mask", "layout")
TILE = 64                       # seq_class: lengths on a multiple of it are "tile"
PEER_TARGETS = {"pr": 0.80, "nightly": 0.95}    # least share of every peer's pairs by each level

# ============================================================================ mapping rules
def seq_class(S_q: int, S_kv: int) -> str:
    tile = "tile" if S_q % TILE == 0 and S_kv % TILE == 0 else "tail"
    if S_q == S_kv:
        return f"eq-{tile}"
    if S_q == 1:
        return "q1"
    if S_kv == 1:
        return "kv1"
    ratio = max(S_q, S_kv) / min(S_q, S_kv)
    spread = "x2" if ratio <= 2 else "x8" if ratio <= 8 else "wide"
    return f"{'lt' if S_q < S_kv else 'gt'}-{spread}-{tile}"


def head_dims_class(D_qk: int, D_v: int) -> str:
    return f"d{D_qk}" if D_qk == D_v else f"d{D_qk}-{D_v}"


def group_class(H_q: int, H_k: int) -> str:
    return f"r{H_q // H_k}"


def mask_class(left: int | None, right: int | None) -> str:
    if left is None and right is None:
        return "none"
    if left is None:
        return "causal" if right == 0 else "strict-causal" if right < 0 else "right-only"
    if right is None:
        return "left-only"
    return "window" if right == 0 else "band" if right > 0 else "strict-window"


# Declared ranges (a peer that draws values at random): name -> the (lo, hi) bounds of each side.
HEAD_DIM_RANGES = {      # name -> (bound on both dims, equal dims?)
    "rand-eq-le128": (128, True),
    "rand-ne-le128": (128, False),
}
SEQ_RANGES = {           # name -> (S_q bounds, S_kv bounds)
    "rand-1-1024": ((1, 1024), (1, 1024)),
}
GROUP_RANGES = {         # name -> most query heads; every ratio of H_k dividing H_q can be drawn
    "rand-hq-le8": 8,
}


def _seq_range_classes(name: str) -> frozenset:
    (q_lo, q_hi), (k_lo, k_hi) = SEQ_RANGES[name]
    # the class of a pair depends on the ratio, equality, the ones and TILE multiples: these
    # lengths reach every class a pair inside the bounds can have
    probe = {1, 2, 3, 5, 17, 63, TILE, TILE + 1, 100, 127, 2 * TILE, 3 * TILE, 255, 4 * TILE, 257,
             8 * TILE, 9 * TILE, 1000, 16 * TILE, 1023}
    qs = [s for s in probe if q_lo <= s <= q_hi]
    ks = [s for s in probe if k_lo <= s <= k_hi]
    return frozenset(seq_class(a, b) for a in qs for b in ks)


def peer_classes(axis: str, value: Any) -> frozenset:
    """The classes a peer's declared value maps to."""
    if axis == "head_dims":
        if value in HEAD_DIM_RANGES:
            return frozenset({value})
        return frozenset({head_dims_class(*value)})
    if axis == "seq":
        if value in SEQ_RANGES:
            return _seq_range_classes(value)
        return frozenset({seq_class(*value)})
    if axis == "group":
        if value in GROUP_RANGES:
            hq = GROUP_RANGES[value]
            return frozenset(group_class(h, k) for h in range(1, hq + 1) for k in range(1, h + 1) if h % k == 0)
        return frozenset({group_class(*value)})
    return frozenset({value})       # dtype, mask and layout are declared as classes


def case_classes(axis: str, facts: Mapping[str, Any]) -> frozenset:
    """The classes a case holds. Facts: dtype, D_qk, D_v, S_q, S_kv, H_q, H_k, left, right,
    alignment, order (storage order of q, k, v, o, do, or "mixed"), qkv_packed, kv_packed,
    do_differs."""
    f = facts
    if axis == "dtype":
        return frozenset({f["dtype"]})
    if axis == "head_dims":
        out = {head_dims_class(f["D_qk"], f["D_v"])}
        for name, (bound, equal) in HEAD_DIM_RANGES.items():
            if max(f["D_qk"], f["D_v"]) <= bound and (f["D_qk"] == f["D_v"]) == equal:
                out.add(name)
        return frozenset(out)
    if axis == "seq":
        return frozenset({seq_class(f["S_q"], f["S_kv"])})
    if axis == "group":
        return frozenset({group_class(f["H_q"], f["H_k"])})
    if axis == "mask":
        kind = mask_class(f["left"], f["right"])
        if kind == "none":
            return frozenset({kind})
        if f["S_q"] == f["S_kv"]:
            return frozenset({f"{kind}-tl", f"{kind}-br"})
        return frozenset({f"{kind}-{'br' if f['alignment'] == 'BOTTOM_RIGHT' else 'tl'}"})
    if axis == "layout":
        out = {f["order"]}
        out |= {name for name, flag in (("qkv-packed", f["qkv_packed"]), ("kv-packed", f["kv_packed"]),
                                        ("do-strides-differ", f["do_differs"])) if flag}
        return frozenset(out)
    raise KeyError(axis)


# ============================================================================ the grids
# FlashAttention 2: tests/test_flash_attn.py, the padded (non-varlen) tests that run a
# backward. Common to them: BSHD tensors, causal aligned bottom-right, dropout (gated here)
# not declared. The varlen tests are ragged (our ragged space), not declared here.
_FA2_D = tuple((d, d) for d in (32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256))
_FA2_PAIRS = ((113, 203), (128, 217), (113, 211), (108, 256), (256, 512), (512, 256), (1024, 1024),
              (1023, 1024), (1024, 1023), (2048, 2048))
_FA2_CAUSAL_PAIRS = ((1, 239), (3, 799), (127, 512), (127, 513), (113, 203), (128, 217), (113, 211),
                     (108, 256), (256, 512), (1023, 1024))
_FA2_SPLITKV_PAIRS = ((3, 1024), (1, 339), (3, 799), (64, 2048), (16, 20000), (16, 100000), (128, 128),
                      (256, 256))
_FA2_RACE_PAIRS = ((1, 239), (239, 1), (3, 799), (799, 3), (1024, 128), (97, 97), (128, 128), (200, 200),
                   (256, 256), (257, 257), (384, 384), (512, 512), (768, 768), (1024, 1024))
_FA2_QKV_SEQLENS = (97, 128, 200, 256, 257, 384, 512, 768, 1024, 1025, 2048)
_FP = ("fp16", "bf16")


def _swap(pairs):
    return tuple(pairs) + tuple((k, q) for q, k in pairs)


FLASH_ATTENTION_2 = PeerGrid(
    name="flash-attention-2",
    source="Dao-AILab/flash-attention tests/test_flash_attn.py @ 765fbd928364e298a38a5e4b5c540d30daa1aecb",
    tests=(
        PeerTest("test_flash_attn_qkvpacked", {
            "dtype": _FP, "head_dims": _FA2_D, "seq": tuple((s, s) for s in _FA2_QKV_SEQLENS),
            "group": ((9, 9),), "mask": ("none", "causal-br"), "layout": ("qkv-packed",)}),
        PeerTest("test_flash_attn_output", {           # nheads 9; nheads_k 9 / 1 (mqa) / 3 (gqa)
            "dtype": _FP, "head_dims": _FA2_D, "seq": _FA2_PAIRS,
            "group": ((9, 9), (9, 1), (9, 3)), "mask": ("none", "causal-br"), "layout": ("kv-packed", "bshd")}),
        PeerTest("test_flash_attn_causal", {           # swap_sq_sk: both orders of each pair
            "dtype": _FP, "head_dims": _FA2_D, "seq": _swap(_FA2_CAUSAL_PAIRS),
            "group": ((9, 9),), "mask": ("causal-br",), "layout": ("bshd",)}),
        PeerTest("test_flash_attn_splitkv", {
            "dtype": _FP, "head_dims": _FA2_D, "seq": _swap(_FA2_SPLITKV_PAIRS),
            "group": ((12, 12),), "mask": ("none", "causal-br"), "layout": ("bshd",)}),
        PeerTest("test_flash_attn_race_condition", {   # fp16 only; 250 re-runs, bitwise dK/dV
            "dtype": ("fp16",), "head_dims": _FA2_D, "seq": _FA2_RACE_PAIRS,
            "group": ((4, 4),), "mask": ("none", "causal-br"), "layout": ("bshd",)}),
        PeerTest("test_flash_attn_bwd_overflow", {
            "dtype": ("fp16",), "head_dims": ((16, 16), (32, 32), (64, 64)),
            "seq": tuple((s, s) for s in (1, 2, 5, 17, 128)),
            "group": ((5, 5),), "mask": ("none", "causal-br"), "layout": ("bshd",)}),
        PeerTest("test_flash_attn_bwd_transpose", {    # dO a strided [S, B, H, D] view
            "dtype": _FP, "head_dims": ((64, 64), (128, 128)), "seq": tuple((s, s) for s in (97, 128, 200, 256)),
            "group": ((2, 2),), "mask": ("none", "causal-br"), "layout": ("do-strides-differ",)}),
    ),
    missing=("local (sliding-window) and softcap tests of later versions: the stored version has none",
             "varlen tests: ragged graphs, our ragged space (not paired here)"),
    cases=158372,
)

# FlashAttention 3: hopper/test_flash_attn.py, test_flash_attn_output (the backward runs for
# fp16/bf16, dv <= 256, no qv, no attention chunk). nheads 6; nheads_kv 6 / 2 (gqa) / 1 (mqa).
# d in COMPILED_HDIMS (64, 96, 128, 192, 256); dv: 256, 512 and d for d <= 64 (512 has no
# backward), 128 and d for 128 < d <= 192, else d.
_FA3_D = ((64, 64), (64, 256), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256))
_FA3_PAIRS = ((1, 1), (64, 128), (128, 192), (256, 256), (239, 1), (799, 3), (113, 203), (113, 128),
              (128, 217), (113, 211), (108, 256), (256, 512), (384, 256), (640, 128), (512, 256),
              (1024, 1024), (1023, 1024), (1024, 1023), (4096, 4096), (4224, 4224))
FLASH_ATTENTION_3 = PeerGrid(
    name="flash-attention-3",
    source="Dao-AILab/flash-attention hopper/test_flash_attn.py @ e7f8a55c9840154965d620c16b3dab1209bbea2b",
    tests=(
        PeerTest("test_flash_attn_output", {
            "dtype": ("bf16", "fp16"), "head_dims": _FA3_D, "seq": _FA3_PAIRS,
            "group": ((6, 6), (6, 2), (6, 1)),
            "mask": ("none", "causal-br", "window-br", "band-br"), "layout": ("bshd",)}),
    ),
    missing=("test_flash_attn_varlen_output: ragged graphs, our ragged space (not paired here)",
             "softcap: our own softcap axis (AX-SOFTCAP, caps 30 and 5) is not paired with "
             "this grid's softcap values",
             "qv, pack_gqa, num_splits: no axis of ours"),
    cases=21864,
)

# PyTorch: test/test_transformers.py, the SDPA grads tests (BHSD tensors from torch.rand,
# n_heads 4, is_causal top-left). fp32 (mem-efficient) is left out: our fp32 entries are off the dtype axis.
_PT_SEQ = (4, 8, 64, 128, 256, 512, 1024, 2048)
_PT_D = tuple((d, d) for d in (8, 16, 32, 64, 72, 96, 128))
PYTORCH = PeerGrid(
    name="pytorch",
    source="pytorch/pytorch test/test_transformers.py @ 6ac86627d419394fc77fd09392046a4bbd44ec9e",
    tests=(
        PeerTest("test_mem_efficient_attention_vs_math_ref_grads", {
            "dtype": ("fp16", "bf16"), "head_dims": _PT_D, "seq": tuple((q, k) for q in _PT_SEQ for k in _PT_SEQ),
            "group": ((4, 4),), "mask": ("none", "causal-tl"), "layout": ("bhsd",)}),
        PeerTest("test_mem_efficient_attention_attn_mask_vs_math_ref_grads", {   # additive mask gated
            "dtype": ("fp16", "bf16"), "head_dims": _PT_D,
            "seq": tuple((q, k) for q in (4, 8, 64, 128, 256, 312, 512, 1024, 2048)
                         for k in (4, 8, 64, 65, 128, 256, 408, 512, 1024, 2048)),
            "group": ((4, 4),), "mask": ("none",), "layout": ("bhsd",)}),
        PeerTest("test_flash_attention_vs_math_ref_grads", {
            "dtype": ("fp16", "bf16"), "head_dims": _PT_D, "seq": tuple((q, k) for q in _PT_SEQ for k in _PT_SEQ),
            "group": ((4, 4),), "mask": ("none", "causal-tl"), "layout": ("bhsd",)}),
    ),
    missing=("the GQA variant (enable_gqa, n_heads) of test_flash_attention_vs_math_ref_grads: "
             "the stored version at this commit has none",
             "fp32 cases: our fp32 entries (SHP-FP32*) are not paired with this grid"),
    cases=8517,
)

# cuDNN frontend: test/python/test_mhas_v2.py, test_sdpa_random_bwd_L0 (128 random draws,
# seed 844): batches 1-8, s_q and s_kv 1-1024 (s_q = s_kv or random), d_qk and d_v 1-128
# (equal or random) with (64, 64), (128, 128), (192, 128) likely, heads 1-8 with MHA, GQA
# and MQA groups, fp16 / bf16, masks causal, left window only, right window only, band
# around the diagonal and none, each top-left or bottom-right. The draws' values are not
# enumerable without running its generator (mha_v2_utils.py), so the ranges are declared
# as range classes.
_CUDNN_MASKS = tuple(f"{m}-{a}" for m in ("causal", "left-only", "right-only", "band") for a in ("tl", "br"))
CUDNN_FRONTEND = PeerGrid(
    name="cudnn-frontend",
    source="NVIDIA/cudnn-frontend test/python/test_mhas_v2.py @ d48a60eb146eada7aee2e00b8f8c1d6ddcf96c51",
    tests=(
        PeerTest("test_sdpa_random_bwd_L0", {
            "dtype": ("fp16", "bf16"),
            "head_dims": ((64, 64), (128, 128), (192, 128), "rand-eq-le128", "rand-ne-le128"),
            "seq": ("rand-1-1024",), "group": ("rand-hq-le8",),
            "mask": ("none",) + _CUDNN_MASKS}),
    ),
    missing=("layout: the storage order each draw uses is chosen in mha_v2_utils.py (exec_cfg), "
             "which was not read; no layout is declared",
             "the exact draws: only their ranges are declared"),
    cases=768,
)

# PyTorch FlexAttention: test/inductor/test_flex_attention.py, the tests that run a backward
# through run_test (the compiled kernel against float64 and the eager reference): BHSD
# tensors from torch.randn, B 4, H 8 (MHA), S 2048, D 64; test_builtin_score_mods_different_seqlen
# takes S_q = S / 2. Score mods map to our mask classes where they are masks we have:
# _identity and score-only mods (x2, square, trig, silu, additive biases, ALiBi) are `none`,
# _causal and _rel_causal (m >= n) `causal-tl`, _inverse_causal (m <= n) `left-only-tl`.
# fp32 cases are entries of their own (SHP-FP32*), not pair-suite values; the gradchecks run float64 only.
_FLEX_MASKS = ("none", "causal-tl", "left-only-tl")
FLEX_ATTENTION = PeerGrid(
    name="flex-attention",
    source="pytorch/pytorch test/inductor/test_flex_attention.py @ 195dbb58a8a2f05c6f1e1d7d3b88785f6606da33",
    tests=(
        PeerTest("test_builtin_score_mods", {
            "dtype": ("fp16", "bf16"), "head_dims": ((64, 64),), "seq": ((2048, 2048),),
            "group": ((8, 8),), "mask": _FLEX_MASKS, "layout": ("bhsd",)}),
        PeerTest("test_builtin_score_mods_different_seqlen", {
            "dtype": ("fp16",), "head_dims": ((64, 64),), "seq": ((1024, 2048),),
            "group": ((8, 8),), "mask": _FLEX_MASKS, "layout": ("bhsd",)}),
    ),
    missing=("score and mask mods with no class of ours (odd keys skipped, document masks, natten, "
             "per-batch bidirectional prefixes): their shapes are the ones declared",
             "test_strided_inputs: forward only",
             "fp32 (our fp32 cases are entries of their own, not pair-suite values) and the float64 gradchecks"),
)

# TransformerEngine: tests/pytorch/attention/test_attention.py, the DotProductAttention tests
# (test_dot_product_attention and the tests that call it: mla, mask, bias, bias shapes, sliding
# window, ALiBi slopes, qkv layouts). ModelConfig(b, s_q, h, d, s_kv, h_kv groups, d_v, mask).
# TE's `causal` is top-left, `causal_bottom_right` bottom-right; a sliding window (2, 2)
# without a causal mask is a band (FlashAttention's alignment, bottom-right), with one a
# window. Default layouts: self-attention MHA sb3hd (Q, K, V packed, SBHD), GQA or MLA
# sbhd_sbhd_sbhd; cross-attention MHA bshd_bs2hd (K, V packed, BSHD), else bshd_bshd_bshd.
_TE_FP = ("fp16", "bf16")
_TE_LAYOUTS = {    # (self or cross, MHA with equal head dims or not) -> the default layout's classes
    ("self", True): ("qkv-packed", "sbhd"), ("self", False): ("sbhd",),
    ("cross", True): ("kv-packed", "bshd"), ("cross", False): ("bshd",),
}


def _te(name: str, dtypes, masks, configs, layouts=None) -> tuple[PeerTest, ...]:
    """One PeerTest per (self or cross, packable or not) group of TE model configs
    ((s_q, s_kv), (h, h_kv), (d_qk, d_v)); `layouts`: classes per group instead of the
    defaults (test_dpa_qkv_layout's list)."""
    groups: dict = {}
    for seq, heads, dims in configs:
        # TE packs Q, K, V (or K, V) only where every head count and head dim agree
        key = ("self" if seq[0] == seq[1] else "cross", heads[0] == heads[1] and dims[0] == dims[1])
        g = groups.setdefault(key, ([], [], []))
        for values, value in zip(g, (seq, heads, dims)):
            if value not in values:
                values.append(value)
    return tuple(PeerTest(f"{name} ({key[0]}, {'packed' if key[1] else 'GQA, MQA or MLA'})", {
        "dtype": dtypes, "head_dims": tuple(dims), "seq": tuple(seqs), "group": tuple(heads),
        "mask": masks, "layout": (layouts or _TE_LAYOUTS)[key]})
        for key, (seqs, heads, dims) in groups.items())


_TE_QKV_LAYOUTS = {   # test_dpa_qkv_layout: sb3hd ... bshd_bshd_bshd; "3" layouts skip cross
    ("self", True): ("qkv-packed", "kv-packed", "sbhd", "bshd"),
    ("cross", True): ("kv-packed", "sbhd", "bshd"),
}
TRANSFORMER_ENGINE = PeerGrid(
    name="transformer-engine",
    source="NVIDIA/TransformerEngine tests/pytorch/attention/test_attention.py @ "
           "368117b6945fa826406799cba71e72c3230613b7",
    tests=(
        *_te("test_dot_product_attention (base)", _TE_FP, ("none",), (
            ((128, 128), (16, 16), (64, 64)), ((128, 256), (16, 16), (64, 64)),
            ((2048, 2048), (24, 24), (128, 128)), ((2048, 4096), (24, 24), (128, 128)),
            ((1, 2048), (16, 16), (128, 128)), ((1, 2048), (16, 16), (256, 256)),
            ((1, 2048), (16, 16), (192, 192)), ((128, 2048), (16, 16), (192, 192)))),
        *_te("test_dpa_mla", _TE_FP, ("none", "causal-tl"), (
            ((128, 128), (16, 16), (64, 128)), ((128, 256), (16, 16), (64, 128)),
            ((128, 256), (16, 16), (192, 128)), ((2048, 2048), (24, 24), (128, 64)),
            ((2048, 4096), (24, 24), (128, 64)), ((2048, 4096), (24, 24), (192, 128)),
            ((1, 2048), (16, 16), (128, 64)), ((1, 2048), (16, 16), (256, 128)),
            ((1, 2048), (16, 16), (192, 128)))),
        *_te("test_dpa_mask", ("bf16",), ("causal-tl", "causal-br"), (
            ((2048, 2048), (16, 16), (64, 64)), ((2048, 2048), (24, 1), (128, 128)),
            ((2048, 4096), (24, 24), (128, 128)), ((1, 2048), (16, 16), (128, 128)),
            ((1, 2048), (16, 16), (256, 256)))),
        *_te("test_dpa_bias, test_dpa_bias_shapes", ("bf16",), ("none", "causal-tl"), (
            ((128, 128), (16, 16), (64, 64)), ((128, 256), (16, 16), (64, 64)),
            ((2048, 2048), (24, 24), (128, 128)), ((2048, 4096), (24, 24), (128, 128)))),
        *_te("test_dpa_sliding_window", ("bf16",), ("band-br", "window-tl", "window-br"), (
            ((2048, 2048), (16, 16), (64, 64)), ((2048, 2048), (24, 4), (128, 128)),
            ((2048, 4096), (24, 24), (128, 128)))),
        *_te("test_dpa_alibi_slopes", ("bf16",), ("causal-tl",), (
            ((128, 128), (16, 16), (64, 64)), ((128, 256), (16, 16), (64, 64)),
            ((1024, 1024), (24, 24), (128, 128)), ((1024, 2048), (24, 24), (128, 128)))),
        *_te("test_dpa_qkv_layout", ("bf16",), ("none", "causal-tl"), (
            ((128, 128), (16, 16), (64, 64)), ((128, 256), (16, 16), (64, 64)),
            ((2048, 2048), (24, 24), (128, 128)), ((2048, 4096), (24, 24), (128, 128)),
            ((1, 2048), (16, 16), (256, 256)), ((2048, 2048), (24, 24), (256, 256))),
            layouts=_TE_QKV_LAYOUTS),
    ),
    missing=("padding masks (padding, padding_causal, padding_causal_bottom_right) and the THD "
             "layouts: ragged graphs, our ragged space (not paired here)",
             "head dims 512 and 1024 (base_5_*, base_6_*): run for inference only, no backward",
             "test_transformer_layer, test_te_layer_*: a whole layer's backward, not attention's",
             "the FP8 tests: no fp8 backward is declared",
             "bias values (post_scale_bias in its shapes, ALiBi slopes): our bias axis, not paired here"),
)

# ============================================================================ GPU-sized value classes
# The sizes the peers' long tests run and our nightly and full levels sweep (plans/sdpa_bwd.py,
# SWP-PEER-*): every class crossed with every layout, mask, dtype and head configuration there.
#: sequence lengths, multiples of 64 and 128 from 256 to 4096: FlashAttention 2's race and
#: qkvpacked lengths (384, 512, 768, 1024, 2048), PyTorch's (256 to 2048), TransformerEngine's
#: (2048, 4096) and FlashAttention 3's (4096); 1536 and 3072 fill the multiples of 512 between
PEER_SEQLENS = (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
#: past 4096 to 16k: FlashAttention 2's split-KV test draws 20000 and 100000 keys for 16
#: queries; these are the long self-attention lengths long-context training runs at, each
#: a multiple of 2048 (the peers' largest tile)
PEER_LONG_SEQLENS = (6144, 8192, 12288, 16384)
#: training shapes (B, S, H_q, H_k, D_qk, D_v): B x S from 16k to 64k tokens, 8 to 64 query
#: heads, head dims 64 to 256, GQA ratios 4 to 8 (TransformerEngine's 24-head, 128-dim
#: configs at S 2048-4096; Llama- and Mistral-like GQA 32/8, 64/8; D 192 with 24 heads)
PEER_TRAINING_SHAPES = (
    (4, 4096, 32, 8, 128, 128), (8, 4096, 32, 4, 128, 128), (2, 16384, 16, 4, 128, 128),
    (4, 8192, 64, 8, 128, 128), (16, 2048, 32, 8, 64, 64), (8, 8192, 16, 2, 256, 256),
    (4, 4096, 8, 2, 256, 256), (16, 4096, 16, 4, 128, 128), (32, 2048, 32, 4, 64, 64),
    (1, 16384, 64, 8, 128, 128), (8, 4096, 40, 8, 128, 128), (4, 4096, 24, 6, 192, 192),
    (8, 8192, 32, 4, 128, 128), (16, 4096, 64, 8, 64, 64),
)
#: the storage orders of those tests: BSHD (FlashAttention), SBHD (Megatron, TransformerEngine),
#: BHSD (PyTorch), K and V packed (TransformerEngine's bs2hd / FlashAttention's kvpacked)
PEER_SWEEP_LAYOUTS = ("bhsd", "bshd", "sbhd", "kv-packed")
#: their masks: none, causal both ways, a sliding window and a band (bottom-right as
#: FlashAttention aligns them)
PEER_SWEEP_MASKS = ("none", "causal-tl", "causal-br", "window-br", "band-br")

PEER_GRIDS = (FLASH_ATTENTION_2, FLASH_ATTENTION_3, PYTORCH, CUDNN_FRONTEND, FLEX_ATTENTION,
              TRANSFORMER_ENGINE)

PEERS = PeerPlan(grids=PEER_GRIDS, axes=PEER_AXES, peer_classes=peer_classes, case_classes=case_classes,
                 targets=PEER_TARGETS)
