"""The SDPA backward test plan: pure declarations, no I/O.

Everything the generator writes (bundles, their manifest, the dry-run report) is
derived from the names in this module. Sections:
  axes and their value tables, legality rules, the shape catalog and sweeps,
  regressions, rejection probes, gated items, levels, the cost model, tolerance classes.
Item IDs are stable handles: renaming one renames a support-matrix row.
"""
from __future__ import annotations

import math

from bundlegen.plans.records import (
    Axis, BiasKind, BoundaryClass, DropoutForm, FocusPairs, BoundaryPlan, BoundarySet, CatalogEntry, CostCoefficients, Gated, Measured, HeadConfig, HeadDims, Layout, Lengths, Level,
    MaskSpec, ModifierSet, Offsets, PairSuite, Plan, Probe, RaggedShape, Regression, RiskPlan, Rule, SeqPair, SeqUsed,
    Shape, Space,
    Spec, Sweep, TokenStorage, Tolerance, attr, dims, drop, dtype, reshape, stride,
    PADDED as PADDED_STORAGE, RAGGED as RAGGED_STORAGE,
)

from bundlegen.plans.peers import (PEER_LONG_SEQLENS, PEER_SEQLENS, PEER_SWEEP_LAYOUTS, PEER_SWEEP_MASKS,
                                   PEER_TRAINING_SHAPES, PEERS)
from bundlegen.tolerance_rule import class_for, longest_reduction  # noqa: F401 (the plan's rule)

PLAN_NAME = "sdpa_bwd"

# ============================================================================ value tables
DTYPES = ("bf16", "fp16")             # the dtype axis (its pair suites' rows are fixed)
#: every io dtype a Spec may name: fp32 is planned by its own entries (FP32_CATALOG), not
#: as a third dtype-axis value, which would redraw every pair suite's rows
IO_DTYPES = DTYPES + ("fp32",)

HEADS = {                             # H_k and H_v each divide H_q; H_kv > 1 where it can
    "mha": HeadConfig(2, 2, 2),
    "gqa2": HeadConfig(4, 2, 2),
    "gqa4": HeadConfig(8, 2, 2),
    "gqa8": HeadConfig(16, 2, 2),
    "mqa": HeadConfig(4, 1, 1),
    "hk2-hv1": HeadConfig(4, 2, 1),
    "hk1-hv2": HeadConfig(4, 1, 2),
    "hk4-hv2": HeadConfig(4, 4, 2),   # H_k = H_q > H_v: the dV-past-its-buffer class
    # group ratios the peer grids use (plans/peers.py): 3 (FA2 9/3, FA3 6/2), 6 (FA3 MQA 6/1),
    # 9 (FA2 MQA 9/1); 5 and 7 (cuDNN FE draws at most 8 query heads: only MQA reaches them)
    "gqa3": HeadConfig(6, 2, 2),
    "mqa5": HeadConfig(5, 1, 1),
    "mqa6": HeadConfig(6, 1, 1),
    "mqa7": HeadConfig(7, 1, 1),
    "mqa9": HeadConfig(9, 1, 1),
    "mqa24": HeadConfig(24, 1, 1),   # TransformerEngine's MQA (24 query heads, one kv head)
}

SEQS = {
    **{f"eq-{s}": SeqPair(s, s) for s in (1, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256)},
    "lt-1-128": SeqPair(1, 128),      # one query row (decode)
    "lt-16-65": SeqPair(16, 65),
    "lt-17-129": SeqPair(17, 129),
    "lt-63-256": SeqPair(63, 256),
    "lt-128-255": SeqPair(128, 255),
    "gt-65-16": SeqPair(65, 16),
    "gt-128-1": SeqPair(128, 1),      # one key: bottom-right masks leave most rows empty
    "gt-129-64": SeqPair(129, 64),
    "gt-256-63": SeqPair(256, 63),
    # S_q >> S_kv and S_q << S_kv, on and off the 64 tile (the peer grids' sequence classes)
    # (small representatives of each class, so the quick value cases fit the CPU budget)
    "gt-128-64": SeqPair(128, 64),
    "gt-217-128": SeqPair(217, 128),
    "gt-192-64": SeqPair(192, 64),
    "gt-576-64": SeqPair(576, 64),
    "gt-799-3": SeqPair(799, 3),
    "lt-64-128": SeqPair(64, 128),
    "lt-64-192": SeqPair(64, 192),
    "lt-64-576": SeqPair(64, 576),
    "lt-32-400": SeqPair(32, 400),
}

HEAD_DIMS = {
    **{f"d{d}": HeadDims(d, d) for d in (32, 40, 64, 72, 80, 96, 128, 160, 192, 256)},
    "d192-128": HeadDims(192, 128),   # MLA
    "d96-8": HeadDims(96, 8),         # tiny D_v (cudnn-frontend#666 rejected it)
    "d128-64": HeadDims(128, 64),
    "d64-128": HeadDims(64, 128),     # D_v > D_qk
    # head dims the peer grids use (plans/peers.py) and we did not
    **{f"d{d}": HeadDims(d, d) for d in (8, 15, 16, 48, 59, 88, 111, 120, 144, 184, 203, 224)},
    "d64-256": HeadDims(64, 256),
    "d40-24": HeadDims(40, 24),
    "d144-8": HeadDims(144, 8),
    "d256-64": HeadDims(256, 64),
    "d256-128": HeadDims(256, 128),   # TransformerEngine's MLA decode dims
}

BATCHES = {"b1": 1, "b2": 2, "b3": 3}

# Per-port storage kinds (generator/layouts.py implements each kind).
_ALL_PORTS = ("q", "k", "v", "o", "do", "dq", "dk", "dv")


def _every_port(kind: str, **overrides: str) -> dict[str, str]:
    return {**{p: kind for p in _ALL_PORTS}, **overrides}


LAYOUTS = {
    "bhsd": Layout(_every_port("bhsd")),
    "bshd": Layout(_every_port("bshd")),
    "pad1": Layout(_every_port("pad1")),              # rows D+1
    "pad8": Layout(_every_port("pad8")),              # rows D+8
    "odd-pitch": Layout(_every_port("odd-pitch")),    # BSHD rows H*D+1 apart
    "bcast-kv-batch": Layout(_every_port("bhsd", k="bcast-batch", v="bcast-batch")),
    "bcast-kv-head": Layout(_every_port("bhsd", k="bcast-head", v="bcast-head")),
    "bcast-all-batch": Layout(_every_port("bhsd", q="bcast-batch", k="bcast-batch", v="bcast-batch",
                                          o="bcast-batch", do="bcast-batch"),
                              stats_batch_broadcast=True),
    "do-strides-differ": Layout(_every_port("bhsd", do="bshd")),
    "qkv-interleaved": Layout(_every_port("bshd", q="qkv-0", k="qkv-1", v="qkv-2",
                                          dq="qkv-0", dk="qkv-1", dv="qkv-2")),
    "mixed": Layout({"q": "bshd", "k": "pad8", "v": "odd-pitch", "o": "pad1", "do": "sbhd",
                     "dq": "pad8", "dk": "bshd", "dv": "bhsd+7"}),
    # storage orders and packed buffers the peers and their users use (Megatron trains in SBHD)
    "sbhd": Layout(_every_port("sbhd")),
    "hbsd": Layout(_every_port("hbsd")),
    "hsbd": Layout(_every_port("hsbd")),
    "shbd": Layout(_every_port("shbd")),
    "kv-packed": Layout(_every_port("bshd", k="kv-0", v="kv-1", dk="kv-0", dv="kv-1")),
}

STATS_LAYOUTS = {                     # name -> stats storage kind
    "packed": "stats-packed",
    "padded-head": "stats-padded-head",   # head stride S_q + 64
    "s-major": "stats-s-major",           # [B, S, H, 1] storage
    "seq-stride-2": "stats-seq-stride-2",
    "padded-batch": "stats-padded-batch",
}

WINDOW = 24        # keys left of the diagonal, diagonal included (left_bound)
BAND_RIGHT = 9     # keys right of the diagonal a band keeps (right_bound)
MASKS = {
    "none": MaskSpec(None, None),
    "causal-tl": MaskSpec(None, 0, "TOP_LEFT"),
    "causal-br": MaskSpec(None, 0, "BOTTOM_RIGHT"),
    "strict-causal-tl": MaskSpec(None, -1, "TOP_LEFT"),       # diagonal excluded
    "strict-causal-br": MaskSpec(None, -1, "BOTTOM_RIGHT"),
    "window-tl": MaskSpec(WINDOW, 0, "TOP_LEFT"),
    "window-br": MaskSpec(WINDOW, 0, "BOTTOM_RIGHT"),
    "band-tl": MaskSpec(WINDOW, BAND_RIGHT, "TOP_LEFT"),
    "band-br": MaskSpec(WINDOW, BAND_RIGHT, "BOTTOM_RIGHT"),
    # catalog-only masks
    "window-256-br": MaskSpec(256, 0, "BOTTOM_RIGHT"),
    "diagonal-only": MaskSpec(1, 0, "TOP_LEFT"),
    "lookahead-16": MaskSpec(None, 16, "TOP_LEFT"),
    # one-sided bands (the cuDNN FE draws' left-window-only and right-window-only masks)
    "left-only-tl": MaskSpec(WINDOW, None, "TOP_LEFT"),
    "left-only-br": MaskSpec(WINDOW, None, "BOTTOM_RIGHT"),
    "right-only-tl": MaskSpec(None, BAND_RIGHT, "TOP_LEFT"),
    "right-only-br": MaskSpec(None, BAND_RIGHT, "BOTTOM_RIGHT"),
}

AXIS_MASKS = ("none", "causal-tl", "causal-br", "strict-causal-tl", "strict-causal-br",
              "window-tl", "window-br", "band-tl", "band-br",
              "left-only-tl", "left-only-br", "right-only-tl", "right-only-br")

SCALES = {"default": None, "custom": 0.3, "large": 1.0}   # None: 1/sqrt(D_qk)
# l2-grad: dO = O - target (an L2 loss), so Delta = rowsum(dO * O) is far from zero;
# large-do: |dO| ~ 1e3, dP towards fp16's range; overflow-dp: dP past fp16's range with
# every gradient inside it (harness/distributions.py defines each)
DISTRIBUTIONS = ("randn", "small-int", "shifted-logits", "l2-grad", "large-do", "overflow-dp")
#: overflow-dp keeps dS = P (dP - Delta) inside fp16's range only where P is spread over
#: many keys: no mask, no bias, S_kv >= OVERFLOW_DP_MIN_KEYS
OVERFLOW_DP_MIN_KEYS = 64

# score modifiers (docs/CONTRACTS.md, "Score modifiers")
BIASES = {                            # [B, H_q, S_q, S_kv], broadcast by zero strides
    "none": None,
    "full": BiasKind("full"),
    "batch": BiasKind("batch"),       # one [H_q, S_q, S_kv] for every batch
    "head": BiasKind("head"),         # one [B, S_q, S_kv] for every head
    "both": BiasKind("both"),         # one [S_q, S_kv]
    "alibi": BiasKind("batch", "alibi"),   # per-head slopes, the diagonal's alignment
}
SWITCHES = {"off": False, "on": True}
SOFTCAPS = {"off": None, "cap30": 30.0, "cap5": 5.0}   # 30: Gemma-like, rarely bends; 5 bends most scores
# dropout (docs/CONTRACTS.md, "Dropout"): p small, a half, close to 1; the mask port's
# broadcast kinds (zero strides on batch and / or heads), or none (the engine draws its own)
DROPOUTS = {"off": None, "p0.1": 0.1, "p0.5": 0.5, "p0.9": 0.9}
DROPOUT_MASKS = {"full": "full", "batch": "batch", "head": "head", "both": "both", "drawn": None}
# ALiBi as slopes (docs/CONTRACTS.md, "Score modifiers"): the alibi_slopes port, [H_q] or [B, H_q]
ALIBI_SLOPES = {"off": None, "head": "head", "batch": "batch"}
# the dropout_form axis: p small and close to 1 with a full mask port, and p 0.5 with every
# other form the port takes (broadcast over the batch, the heads, both; no port: the engine draws)
DROPOUT_FORMS = {
    "off": DropoutForm(),
    **{p: DropoutForm(p, "full") for p in ("p0.1", "p0.9")},
    **{f"p0.5-{m}": DropoutForm("p0.5", m) for m in ("batch", "head", "both", "drawn")},
}
_BATCH_BROADCAST_DROPOUT = ("p0.5-batch", "p0.5-both")

# ============================================================================ axes
# Pair-suite passes (Axis.joined, Axis.values_joined): 0 the first axes, 1 the score
# modifiers, 2 the deterministic flag and the gradient distributions. Each
# later pass only adds rows, so every earlier case keeps its id.
RISK_VALUES_PASS = 2
#: pass 3: every port form as an axis value (ALiBi slopes, dropout forms) and fp32 io, so
#: each meets every other axis's values by pr (the form vocabulary: tests/test_port_forms.py)
PORT_FORMS_PASS = 3
AXIS_DTYPES = DTYPES + ("fp32",)
#: the values the suites' first two passes knew; any other value of these axes joins pass 2
FIRST_VALUES = {
    "heads": ("mha", "gqa2", "gqa4", "gqa8", "mqa", "hk2-hv1", "hk1-hv2", "hk4-hv2", "gqa3", "mqa5", "mqa6",
              "mqa7", "mqa9"),
    "head_dims": ("d32", "d40", "d64", "d72", "d80", "d96", "d128", "d160", "d192", "d256", "d192-128", "d96-8",
                  "d128-64", "d64-128", "d8", "d15", "d16", "d48", "d59", "d88", "d111", "d120", "d144", "d184",
                  "d203", "d224", "d64-256", "d40-24", "d144-8", "d256-64"),
    "distribution": ("randn", "small-int", "shifted-logits"),
}


def _joined_later(axis: str, values) -> dict[str, int]:
    return {v: RISK_VALUES_PASS for v in values if v not in FIRST_VALUES[axis]}


AXES = (
    Axis("dtype", "io dtype", AXIS_DTYPES, "bf16", core=True, values_joined={"fp32": PORT_FORMS_PASS}),
    Axis("heads", "head configuration (MHA, GQA, MQA, H_k != H_v)", tuple(HEADS), "mha", core=True,
         values_joined=_joined_later("heads", HEADS)),
    Axis("seq", "sequence pair S_q, S_kv", tuple(SEQS), "eq-64", core=True),
    Axis("head_dims", "head dims D_qk, D_v", tuple(HEAD_DIMS), "d64", core=True,
         values_joined=_joined_later("head_dims", HEAD_DIMS)),
    Axis("mask", "mask kind and diagonal alignment", AXIS_MASKS, "none", core=True),
    Axis("layout", "per-tensor layout", tuple(LAYOUTS), "bhsd"),
    Axis("stats_layout", "stats (LSE) layout", ("packed", "padded-head", "s-major"), "packed"),
    Axis("scale", "attention scale", tuple(SCALES), "default"),
    Axis("distribution", "input distribution", DISTRIBUTIONS, "randn",
         values_joined=_joined_later("distribution", DISTRIBUTIONS)),
    Axis("batch", "batch size", tuple(BATCHES), "b1"),
    # core: paired at pr with every head configuration, sequence pair, head dim and mask;
    # extension: the pair suites' earlier rows (and case ids) stay, rows are added for these
    Axis("bias", "additive bias (broadcast kinds, ALiBi)", tuple(BIASES), "none", core=True, extension=True),
    Axis("dbias", "dBias output (summed over the bias's broadcast axes)", tuple(SWITCHES), "off", core=True, extension=True),
    Axis("sinks", "attention sinks: a per-head sink logit and its dSinks", tuple(SWITCHES), "off", core=True, extension=True),
    Axis("softcap", "softcap cap * tanh(s / cap) on the scaled scores", tuple(SOFTCAPS), "off", core=True, extension=True),
    # core: paired by pr with MHA/GQA, every head-dim tier up to 256, masks and modifiers
    Axis("deterministic", "the deterministic backward asked for (re-run, compared bitwise)", tuple(SWITCHES),
         "off", core=True, joined=RISK_VALUES_PASS),
    Axis("alibi_slopes", "ALiBi slopes port: [H_q] or [B, H_q]", tuple(ALIBI_SLOPES), "off", core=True,
         extension=True, joined=PORT_FORMS_PASS),
    Axis("dropout_form", "dropout: p with the mask port's form (full, broadcast, drawn by the engine)",
         tuple(DROPOUT_FORMS), "off", core=True, extension=True, joined=PORT_FORMS_PASS),
)

# ============================================================================ legality
_EQUAL_HEADS = tuple(n for n, h in HEADS.items() if h.H_q == h.H_k == h.H_v)
_EQUAL_HEAD_DIMS = tuple(n for n, d in HEAD_DIMS.items() if d.D_qk == d.D_v)
_EQUAL_SEQS = tuple(n for n, s in SEQS.items() if s.S_q == s.S_kv)
_MULTI_KV_HEADS = tuple(n for n, h in HEADS.items() if h.H_k > 1 and h.H_v > 1)
_KV_EQUAL_HEADS = tuple(n for n, h in HEADS.items() if h.H_k == h.H_v)

RULES = (
    Rule("qkv-interleaved-needs-equal-heads",
         "Q, K and V are views into one [B, S, 3, H, D] buffer, so they share H",
         when={"layout": ("qkv-interleaved",)}, require={"heads": _EQUAL_HEADS}),
    Rule("qkv-interleaved-needs-equal-head-dims",
         "Q, K and V are views into one [B, S, 3, H, D] buffer, so they share D",
         when={"layout": ("qkv-interleaved",)}, require={"head_dims": _EQUAL_HEAD_DIMS}),
    Rule("qkv-interleaved-needs-equal-seq",
         "Q, K and V are views into one [B, S, 3, H, D] buffer, so S_q = S_kv",
         when={"layout": ("qkv-interleaved",)}, require={"seq": _EQUAL_SEQS}),
    Rule("kv-packed-needs-equal-kv-heads",
         "K and V are views into one [B, S, 2, H_k, D] buffer, so H_k = H_v",
         when={"layout": ("kv-packed",)}, require={"heads": _KV_EQUAL_HEADS}),
    Rule("kv-packed-needs-equal-head-dims",
         "K and V are views into one [B, S, 2, H_k, D] buffer, so D_qk = D_v",
         when={"layout": ("kv-packed",)}, require={"head_dims": _EQUAL_HEAD_DIMS}),
    Rule("batch-broadcast-needs-batch",
         "a zero batch stride at B = 1 broadcasts nothing: the case would test plain BHSD",
         when={"layout": ("bcast-kv-batch", "bcast-all-batch")}, require={"batch": ("b2", "b3")}),
    Rule("head-broadcast-needs-kv-heads",
         "a zero head stride on K/V with H_k = 1 or H_v = 1 broadcasts nothing",
         when={"layout": ("bcast-kv-head",)}, require={"heads": _MULTI_KV_HEADS}),
    Rule("dbias-needs-bias", "a dBias output is the gradient of a bias input",
         when={"dbias": ("on",)}, require={"bias": tuple(n for n in BIASES if n != "none")}),
    Rule("bias-batch-broadcast-needs-batch",
         "a zero batch stride on the bias at B = 1 broadcasts nothing",
         when={"bias": ("batch", "both", "alibi")}, require={"batch": ("b2", "b3")}),
    Rule("overflow-dp-needs-spread-p",
         "overflow-dp's dP is past fp16's range; dS = P (dP - Delta) stays inside it only where "
         "P is spread over many keys (no mask or bias, enough keys)",
         when={"distribution": ("overflow-dp",)},
         require={"mask": ("none",), "bias": ("none",), "alibi_slopes": ("off",), "dropout_form": ("off",),
                  "seq": tuple(n for n, s in SEQS.items() if s.S_kv >= OVERFLOW_DP_MIN_KEYS)}),
    Rule("batch-broadcast-stats-needs-batch-broadcast-bias",
         "stats broadcast over the batch hold one LSE for every batch: a bias that differs "
         "per batch would give each batch its own",
         when={"layout": ("bcast-all-batch",)}, require={"bias": ("none", "batch", "both", "alibi")}),
    Rule("batch-broadcast-stats-needs-batch-invariant-ports",
         "stats broadcast over the batch hold one LSE for every batch: slopes or a dropout mask "
         "that differ per batch would give each batch its own",
         when={"layout": ("bcast-all-batch",)},
         require={"alibi_slopes": ("off", "head"), "dropout_form": ("off",) + _BATCH_BROADCAST_DROPOUT}),
    Rule("dropout-batch-broadcast-needs-batch", "a zero batch stride on the dropout mask at B = 1 broadcasts nothing",
         when={"dropout_form": _BATCH_BROADCAST_DROPOUT}, require={"batch": ("b2", "b3")}),
)

# ============================================================================ suites
VALUE_SUITE_ITEM = "AXIS-VALUES"       # each axis value once, others at defaults (quick)
PAIR_SUITES = (
    PairSuite("PAIR-CORE", "every legal pair of core-axis values", "pairs-core", "core", "pr"),
    PairSuite("PAIR-ALL", "every legal pair of values of all axes", "pairs-all", "all", "nightly"),
)


# ============================================================================ shape catalog
INT64_BATCH_STRIDE = 2 ** 31 + 64      # SHP-INT64-OFFSETS: batch 1 begins past int32's range
def _shape(B=1, H=2, S=64, D=64, *, H_k=None, H_v=None, S_kv=None, D_v=None) -> Shape:
    return Shape(B, H, H if H_k is None else H_k, (H if H_k is None else H_k) if H_v is None else H_v,
                 S, S if S_kv is None else S_kv, D, D if D_v is None else D_v)


#: a graph that asks the engine for its deterministic backward (DESIGN section 5: re-run many times,
#: compared bitwise; an engine without such a mode declines)
_DETERMINISTIC = attr("deterministic_algorithm", True)

CATALOG = (
    CatalogEntry("SHP-S1", "the smallest problem: one query, one key, one head",
                 (Spec(_shape(H=1, S=1)), Spec(_shape(H=1, S=1), mask="causal-br"))),
    CatalogEntry("SHP-DECODE", "S_q = 1 against a long, non-multiple-of-64 key sequence",
                 (Spec(_shape(B=2, H=8, H_k=2, S=1, S_kv=1000, D=128), mask="causal-br"),
                  Spec(_shape(B=2, H=8, H_k=2, S=1, S_kv=1000, D=128))), level="pr"),
    CatalogEntry("SHP-B2-H2", "B and H above 1 where derived LSE strides are discriminated",
                 (Spec(_shape(B=2, H=2, S=256, D=128)),
                  Spec(_shape(B=2, H=2, S=256, D=128), mask="causal-tl"),
                  Spec(_shape(B=2, H=2, S=256, D=128), layout="bshd", stats_layout="padded-head"))),
    CatalogEntry("SHP-MANY-PROGRAMS", "B x H large: grid mapping of batch and head (256 programs of 64 rows)",
                 (Spec(_shape(B=4, H=16, S=256, D=64)),
                  Spec(_shape(B=4, H=16, H_k=4, S=256, D=96), mask="causal-br")), level="pr"),
    CatalogEntry("SHP-DETERMINISTIC-MODE",
                 "the deterministic backward asked for, 50 runs bitwise: many KV blocks, GQA",
                 (Spec(_shape(B=1, H=8, H_k=2, S=1024, D=128), mutations=(_DETERMINISTIC,)),
                  Spec(_shape(B=1, H=4, H_k=1, S=2048, D=64), dtype="fp16", mask="causal-br",
                       mutations=(_DETERMINISTIC,))), level="pr"),
    CatalogEntry("SHP-DETERMINISTIC-MODE-LONG",
                 "the deterministic backward at the headline size (S 4096, GQA 4:1)",
                 (Spec(_shape(B=2, H=16, H_k=4, S=4096, D=128), mask="causal-tl",
                       mutations=(_DETERMINISTIC,)),), level="nightly"),
    CatalogEntry("SHP-NONPOW2", "nothing a power of two: B 3, H 6/3, S 1000/1234, D 72",
                 (Spec(_shape(B=3, H=6, H_k=3, S=1000, S_kv=1234, D=72)),
                  Spec(_shape(B=3, H=6, H_k=3, S=1000, S_kv=1234, D=72), mask="window-br")), level="pr"),
    CatalogEntry("SHP-LONG-1K", "multi-block loops at S = 1024",
                 (Spec(_shape(B=2, H=8, S=1024, D=128)),
                  Spec(_shape(B=2, H=8, S=1024, D=128), mask="causal-tl", dtype="fp16")), level="nightly"),
    CatalogEntry("SHP-LONG-2K", "S = 2048 with GQA and bottom-right causal",
                 (Spec(_shape(B=2, H=8, H_k=2, S=2048, D=64), mask="causal-br"),
                  Spec(_shape(B=2, H=8, H_k=2, S=2048, D=64), layout="bshd")), level="nightly"),
    CatalogEntry("SHP-LONG-4K", "S = 4096, d128, GQA 8/2 (the published-speed shape)",
                 (Spec(_shape(B=1, H=8, H_k=2, S=4096, D=128)),
                  Spec(_shape(B=1, H=8, H_k=2, S=4096, D=128), mask="causal-br")), level="nightly"),
    CatalogEntry("SHP-LONG-SQ-LT-SKV", "S_q < S_kv long: chunked prefill",
                 (Spec(_shape(B=1, H=8, S=512, S_kv=4096, D=128), mask="causal-br"),
                  Spec(_shape(B=1, H=8, S=512, S_kv=4096, D=128), mask="window-256-br")), level="nightly"),
    CatalogEntry("SHP-LONG-SQ-GT-SKV", "S_q > S_kv long: bottom-right leaves whole blocks of rows empty",
                 (Spec(_shape(B=1, H=4, S=4096, S_kv=1000, D=64), mask="causal-br"),
                  Spec(_shape(B=1, H=4, S=4096, S_kv=1000, D=64), mask="causal-tl")), level="nightly"),
    CatalogEntry("SHP-LONG-D256", "d256 at a long sequence with B 2",
                 (Spec(_shape(B=2, H=4, S=2048, D=256), mask="causal-tl"),), level="nightly"),
    CatalogEntry("SHP-LONG-MLA", "MLA head dims 192/128 at S = 2048",
                 (Spec(_shape(B=2, H=16, S=2048, D=192, D_v=128), mask="causal-br"),), level="nightly"),
    CatalogEntry("SHP-LONG-8K", "S = 8192 with a sliding window",
                 (Spec(_shape(B=1, H=4, S=8192, D=128), mask="window-256-br"),
                  Spec(_shape(B=1, H=4, S=8192, D=128), mask="causal-tl")), level="full"),
    CatalogEntry("SHP-LONG-16K", "S = 16384: the longest sequence in the plan",
                 (Spec(_shape(B=1, H=4, S=16384, D=128)),
                  Spec(_shape(B=1, H=4, S=16384, D=128), mask="causal-br", dtype="fp16"),
                  Spec(_shape(B=1, H=8, H_k=1, S=16384, D=64), mask="causal-tl")), level="full"),
    # K's (and dV's) batch stride 2^31 + 64: batch 1 starts past the int32 range, so 32-bit
    # offset arithmetic wraps to a negative index. Few elements are addressed (the problem is
    # B 2, H 2, S 64, D 64); the storage is allocated whole (~4 GiB), so the CPU skips it.
    CatalogEntry("SHP-INT64-OFFSETS", "one tensor's addressed span past 2^31 elements: 32-bit offsets wrap",
                 (Spec(_shape(B=2, H=2, S=64, D=64), mutations=(stride("k", 0, INT64_BATCH_STRIDE),)),
                  Spec(_shape(B=2, H=2, S=64, D=64), mask="causal-br",
                       mutations=(stride("dv", 0, INT64_BATCH_STRIDE),))), level="full"),
    CatalogEntry("SHP-MASK-EDGES", "masks with one bound only, or one key per row",
                 (Spec(_shape(H=2, S=128, S_kv=200), mask="lookahead-16"),
                  Spec(_shape(H=2, S=128, S_kv=200), mask="diagonal-only"))),
)

SWEEPS = (
    Sweep("SWP-MASK-SEQ-DTYPE", "every mask x S_q vs S_kv relation x dtype at S ~ 1-2k (3-way)",
          Spec(_shape(B=2, H=4, H_k=2, S=1024, D=64)),
          (("mask", AXIS_MASKS),
           ("shape", (_shape(B=2, H=4, H_k=2, S=1024, D=64),
                      _shape(B=2, H=4, H_k=2, S=777, S_kv=2048, D=64),
                      _shape(B=2, H=4, H_k=2, S=2048, S_kv=777, D=64))),
           ("dtype", DTYPES)),
          level="full"),
    Sweep("SWP-HEAD-DIMS-LONG", "every head-dim pair x dtype at S = 1536 (several KV blocks)",
          Spec(_shape(B=1, H=4, S=1536, D=64), mask="causal-tl"),
          (("shape", tuple(_shape(B=1, H=4, S=1536, D=d.D_qk, D_v=d.D_v) for d in HEAD_DIMS.values())),
           ("dtype", DTYPES)),
          level="nightly"),
)

# The GPU levels' share of the peers' sizes (plans/peers.py, "GPU-sized value classes"): each
# length with MHA, GQA 4, GQA 8 (D 96), MQA (D 64), S_q < S_kv and S_q > S_kv (D 256),
# crossed with every layout, mask and io dtype (_peer_sweeps says which products). Sizes: no case's predicted bytes (io storages
# plus the oracle's float64 copy of every port and its score blocks, bundlegen/cost.py) pass
# 29 GiB; the oracle never holds an S_q x S_kv matrix whole (its score blocks are 2^24
# float64 elements, 128 MiB, whatever S is), so a 16k x 16k case needs no 2 GiB per head
# slice and the largest fits one H200 (~140 GB) with the engine's own buffers beside it.
# Nightly's all stay under its 8 GiB per case; larger ones are full's (GPU-only levels).
_PEER_DTYPES = AXIS_DTYPES
#: the batch of each peer length at nightly: about 16k tokens (B 4 to 32), a training batch,
#: whose largest case (D 256, S_q = 1.5 S) stays under nightly's 8 GiB
_PEER_TOKENS, _PEER_BATCH_RANGE = 16384, (4, 32)
_PEER_BATCH = {S: min(max(_PEER_TOKENS // S, _PEER_BATCH_RANGE[0]), _PEER_BATCH_RANGE[1]) for S in PEER_SEQLENS}
#: the long lengths whose B 2 cases stay under nightly's 8 GiB run there; the rest at full
_NIGHTLY_LONG_SEQLENS = tuple(S for S in PEER_LONG_SEQLENS if S <= 8192)
_FULL_LONG_SEQLENS = tuple(S for S in PEER_LONG_SEQLENS if S > 8192)


def _peer_shapes(S: int, B: int) -> tuple[Shape, ...]:
    return (_shape(B=B, H=16, S=S, D=128), _shape(B=B, H=16, H_k=4, S=S, D=128), _shape(B=B, H=16, H_k=2, S=S, D=96),
            _shape(B=B, H=16, H_k=1, S=S, D=64),
            _shape(B=B, H=16, H_k=2, S=S // 2, S_kv=S, D=128), _shape(B=B, H=12, H_k=4, S=S + S // 2, S_kv=S, D=256))


def _peer_long_shapes(lengths: tuple[int, ...]) -> tuple[Shape, ...]:
    return tuple(sh for S in lengths for sh in (
        _shape(B=2, H=16, S=S, D=128), _shape(B=2, H=16, H_k=4, S=S, D=128), _shape(B=2, H=16, H_k=1, S=S, D=64),
        _shape(B=2, H=16, H_k=2, S=S // 2, S_kv=S, D=128), _shape(B=2, H=8, H_k=2, S=S, D=256)))


def _peer_sweeps(item: str, purpose: str, shapes: tuple[Shape, ...], level: str,
                 layouts_crossed_with: str) -> tuple[Sweep, Sweep]:
    """A peer size class as two products: every shape x mask x dtype in BHSD, and every
    shape x layout with the masks (`layouts_crossed_with` "mask") or with no mask (None),
    in bf16. Each shape meets every mask, dtype and layout and the triple shape x mask x
    dtype (where size meets accumulation and masking) is whole; left out at these sizes:
    layout x dtype, and at nightly layout x mask (the pair suites hold both at small sizes).
    The whole products would pass both GPU levels' budgets (nightly's 2.7 times)."""
    layout_axes = (("shape", shapes), ("layout", PEER_SWEEP_LAYOUTS))
    if layouts_crossed_with == "mask":
        layout_axes += (("mask", PEER_SWEEP_MASKS),)
    return (Sweep(item, f"{purpose} x every mask and dtype (BHSD)", Spec(shapes[0]),
                  (("shape", shapes), ("mask", PEER_SWEEP_MASKS), ("dtype", _PEER_DTYPES)), level=level),
            Sweep(f"{item}-LAYOUTS", f"{purpose} x every layout"
                  + (" and mask (bf16)" if layouts_crossed_with == "mask" else " (no mask, bf16)"),
                  Spec(shapes[0]), layout_axes, level=level))


SWEEPS += (
    *_peer_sweeps("SWP-PEER-SEQS", "S 256-4096 (multiples of 64 and 128; about 16k tokens, B 4-32) x MHA / GQA / "
                  "MQA / S_q != S_kv (the peers' long tests)",
                  tuple(sh for S in PEER_SEQLENS for sh in _peer_shapes(S, _PEER_BATCH[S])), "nightly", None),
    Sweep("SWP-PEER-SEQS-QKV-PACKED", "S 256-4096 with Q, K, V packed (MHA, S_q = S_kv) x every mask and dtype",
          Spec(_shape(B=4, H=16, S=256, D=128), layout="qkv-interleaved"),
          (("shape", tuple(_shape(B=4, H=16, S=S, D=128) for S in PEER_SEQLENS)), ("mask", PEER_SWEEP_MASKS),
           ("dtype", _PEER_DTYPES)), level="nightly"),
    *_peer_sweeps("SWP-PEER-LONG-SEQS-8K", "S 6k-8k x MHA / GQA / MQA / S_q < S_kv / D 256",
                  _peer_long_shapes(_NIGHTLY_LONG_SEQLENS), "nightly", None),
    *_peer_sweeps("SWP-PEER-LONG-SEQS", "S 12k-16k x MHA / GQA / MQA / S_q < S_kv / D 256",
                  _peer_long_shapes(_FULL_LONG_SEQLENS), "full", "mask"),
    *_peer_sweeps("SWP-TRAINING-SHAPES", "training shapes: B x S 16k-64k tokens, H 8-64, D 64-256, GQA 4-8",
                  tuple(_shape(B=b, H=h, H_k=hk, S=s, D=d, D_v=dv) for b, s, h, hk, d, dv in PEER_TRAINING_SHAPES),
                  "full", "mask"),
)

# ============================================================================ regressions
_PRS = "ROCm/rocm-libraries#14684"
REGRESSIONS = (
    Regression("REG-HV-LT-HK", "H_k = H_q > H_v: dV written for every Q head, past its buffer",
               f"{_PRS} (ALMIOPEN-3039)",
               (Spec(_shape(H=4, H_k=4, H_v=2, S=128)),
                Spec(_shape(B=2, H=4, H_k=4, H_v=1, S=64), mask="causal-tl"))),
    Regression("REG-ODD-ROW-PITCH", "odd row pitch (D+1) read one element early",
               f"{_PRS} (ALMIOPEN-3038)",
               (Spec(_shape(B=2, H=2, S=128), layout="pad1"),
                Spec(_shape(B=2, H=2, S=128), port_kinds={"do": "pad1"}),
                Spec(_shape(B=1, H=2, S=128, D=192), port_kinds={"k": "pad1", "dk": "pad1"}))),
    Regression("REG-STATS-PADDED-HEAD", "stats head stride S_q + 64 ignored (derived from Q's dims)",
               f"{_PRS} (ALMIOPEN-3037)",
               (Spec(_shape(B=2, H=2, S=128), stats_layout="padded-head"),)),
    Regression("REG-STATS-NONPACKED", "non-packed stats: [B, S, H] storage, seq stride 2, padded batch",
               f"{_PRS} (ALMIOPEN-3037)",
               (Spec(_shape(B=2, H=2, S=128), stats_layout="s-major"),
                Spec(_shape(B=2, H=2, S=128), stats_layout="seq-stride-2"),
                Spec(_shape(B=2, H=2, S=128), stats_layout="padded-batch"))),
    Regression("REG-BR-SQ-GT-SKV", "bottom-right with S_q > S_kv: fully masked rows (LSE = -inf)",
               "docs/DESIGN.md section 11 (fully masked rows)",
               (Spec(_shape(H=2, S=128, S_kv=48), mask="causal-br"),
                Spec(_shape(H=2, S=200, S_kv=64), mask="window-br"),
                Spec(_shape(H=2, S=65, S_kv=1), mask="strict-causal-br"),
                Spec(_shape(H=2, S=64, S_kv=64), mask="strict-causal-tl"))),
    Regression("REG-ZERO-STRIDE-OUTPUT-LEN1", "zero stride on a length-1 output axis stays accepted",
               f"{_PRS} (ALMIOPEN-3040)",
               (Spec(_shape(B=1, H=2), mutations=(stride("dq", 0, 0), stride("dk", 0, 0), stride("dv", 0, 0))),
                Spec(_shape(B=2, H=1), mutations=(stride("dq", 1, 0), stride("dk", 1, 0), stride("dv", 1, 0))))),
    Regression("REG-TAIL-S-MOD-128-64", "S mod 128 = 64 tails (NaN / wrong dV under GQA)",
               "docs/DESIGN.md section 11 (tails)",
               (Spec(_shape(H=2, S=192)),
                Spec(_shape(H=4, H_k=2, S=320), mask="causal-br"),
                Spec(_shape(H=2, S=64, S_kv=320), mask="causal-br"))),
    Regression("REG-EXTREME-LSE", "LSE below -88.7 with tile-remainder padding gave NaN",
               "docs/DESIGN.md section 11 (very negative LSE)",
               (Spec(_shape(H=2, S=192), distribution="shifted-logits"),
                Spec(_shape(H=2, S=65, S_kv=320), distribution="shifted-logits", mask="causal-br"),
                Spec(_shape(H=2, S=192), distribution="shifted-logits", dtype="fp16"))),
    # The shifted-logits offset grows as 1/sqrt(scale): at 1e-10 Q and K hold ~2.7e5, legal
    # in bf16 (fp32's exponent range) and far past fp16's 65504; S_kv = 128 takes dQ over
    # two key blocks, whose partial sums do not cancel until the end.
    Regression("REG-BF16-BEYOND-FP16-RANGE",
               "bf16 inputs beyond fp16's range: an fp16 intermediate (a dQ accumulator) overflows",
               "bundlegen mutate: mutant dq-accumulated-fp16 (issue 6)",
               (Spec(_shape(H=2, S=128), distribution="shifted-logits",
                     mutations=(attr("attn_scale", 1e-10),)),)),
    Regression("REG-B2-H2-DERIVED-STRIDES", "B = H = 1 hid swapped LSE batch/head strides",
               f"{_PRS} (review follow-up)",
               (Spec(_shape(B=2, H=2, S=128), port_kinds={"q": "bshd", "k": "bshd", "v": "bshd", "do": "bshd",
                                                          "o": "pad1", "dq": "pad1"}),
                Spec(_shape(B=2, H=2, S=128), mask="causal-tl",
                     port_kinds={"q": "bshd", "k": "bshd", "v": "bshd", "do": "bshd", "o": "pad1", "dq": "pad1"}))),
    Regression("REG-HEAD-DIM-STRIDE", "head-dim stride other than 1 read as 1",
               f"{_PRS} (ALMIOPEN-3036)",
               (Spec(_shape(H=2, S=64), port_kinds={"q": "bhds"}),
                Spec(_shape(H=2, S=64), port_kinds={"dq": "bhds"}))),
    Regression("REG-S1-SHORT-SEQ-STRIDE", "sequence stride below D on a length-1 sequence axis",
               f"{_PRS} (ALMIOPEN-3038)",
               (Spec(_shape(H=2, S=1, S_kv=64), mutations=(stride("q", 2, 1), stride("dq", 2, 1))),)),
    Regression("REG-GQA-RATIO-3", "GQA head mapping wrong for a ratio that is not a power of two",
               "docs/DESIGN.md section 11 (GQA head mapping)",
               (Spec(_shape(H=12, H_k=4, S=64)), Spec(_shape(H=6, H_k=3, H_v=2, S=65)))),
    Regression("REG-D256-B2-GQA-CAUSAL", "d256 with batch >= 2, GQA and causal",
               "docs/DESIGN.md section 12 (escaped defects)",
               (Spec(_shape(B=2, H=8, H_k=2, S=256, D=256), mask="causal-br"),), level="pr"),
    Regression("REG-DO-STRIDES-DIFFER", "dO with strides different from O's",
               "docs/DESIGN.md section 12 (escaped defects)",
               (Spec(_shape(B=2, H=2, S=128), layout="do-strides-differ"),
                Spec(_shape(B=2, H=2, S=128), port_kinds={"do": "bcast-batch"}))),
    Regression("REG-BROADCAST-INPUTS", "zero-stride (broadcast) inputs stay accepted and correct",
               f"{_PRS} (ALMIOPEN-3040)",
               (Spec(_shape(B=2, H=2, S=64), layout="bcast-kv-batch"),
                Spec(_shape(B=2, H=2, S=64), layout="bcast-kv-head"),
                Spec(_shape(B=2, H=2, S=64), layout="bcast-all-batch"))),
    Regression("REG-UNEQUAL-HEAD-DIMS", "D_qk != D_v: 96/8 declined, MLA 192/128",
               "NVIDIA/cudnn-frontend#666",
               (Spec(_shape(H=2, S=128, D=96, D_v=8)), Spec(_shape(H=2, S=128, D=192, D_v=128), mask="causal-br"))),
)

# ============================================================================ probes
_PROBE_SHAPE = _shape(B=2, H=2, S=64, D=64)


def _probe(item, title, by, reason, *mutations, shape=_PROBE_SHAPE, **spec) -> Probe:
    return Probe(item, title, by, reason, Spec(shape, mutations=tuple(mutations), **spec))


PROBES = (
    _probe("PRB-DIMS-O", "O head dim != D_v", "frontend", "o-dims-mismatch", dims("o", 3, 32)),
    _probe("PRB-DIMS-DO", "dO sequence length != S_q", "frontend", "o-dims-mismatch", dims("do", 2, 63)),
    _probe("PRB-DIMS-DQ", "dQ heads != H_q", "frontend", "o-dims-mismatch", dims("dq", 1, 1)),
    _probe("PRB-DIMS-V", "V sequence length != S_kv", "frontend", "kv-dims-mismatch", dims("v", 2, 65)),
    _probe("PRB-DIMS-DK", "dK head dim != D_qk", "frontend", "kv-dims-mismatch", dims("dk", 3, 32)),
    _probe("PRB-DIMS-DV", "dV heads != H_v", "frontend", "kv-dims-mismatch", dims("dv", 1, 1)),
    _probe("PRB-BATCH-K", "K batch != Q batch", "frontend", "batch-mismatch", dims("k", 0, 1), dims("dk", 0, 1)),
    _probe("PRB-GQA-NOT-DIVISIBLE", "H_k does not divide H_q", "frontend", "gqa-not-divisible",
           dims("k", 1, 3), dims("dk", 1, 3), dims("v", 1, 3), dims("dv", 1, 3), shape=_shape(B=2, H=4)),
    _probe("PRB-DTYPE-O", "O dtype != Q dtype", "frontend", "dtype-mismatch", dtype("o", "fp16")),
    _probe("PRB-DTYPE-DV", "dV dtype != Q dtype", "frontend", "dtype-mismatch", dtype("dv", "bf16"), dtype="fp16"),
    _probe("PRB-STATS-DTYPE", "stats not fp32", "frontend", "stats-dtype", dtype("stats", "bf16")),
    _probe("PRB-STATS-DIMS", "stats dims != [B, H_q, S_q, 1]", "frontend", "stats-dims-mismatch",
           dims("stats", 2, 32)),
    _probe("PRB-RIGHT-BOUND", "right_bound < -1", "frontend", "right-bound-below-minus-one", attr("right_bound", -2)),
    _probe("PRB-LEFT-BOUND-ZERO", "left_bound = 0", "frontend", "left-bound-nonpositive",
           attr("left_bound", 0), attr("right_bound", 0)),
    _probe("PRB-LEFT-BOUND-NEGATIVE", "left_bound < 0", "frontend", "left-bound-nonpositive", attr("left_bound", -4)),
    _probe("PRB-SCALE-ZERO", "attn_scale = 0", "frontend", "scale-nonpositive", attr("attn_scale", 0.0)),
    _probe("PRB-SCALE-NEGATIVE", "attn_scale < 0", "frontend", "scale-nonpositive", attr("attn_scale", -0.125)),
    _probe("PRB-ZERO-STRIDE-DQ", "dQ batch stride 0 with B = 2", "engine", "zero-stride-output",
           stride("dq", 0, 0)),
    _probe("PRB-ZERO-STRIDE-DK", "dK head stride 0 with H_k = 2", "engine", "zero-stride-output",
           stride("dk", 1, 0)),
    _probe("PRB-ZERO-STRIDE-DV", "dV batch and head stride 0 (a broadcast input's strides)", "engine",
           "zero-stride-output", stride("dv", 0, 0), stride("dv", 1, 0)),
    _probe("PRB-OVERLAP-DKDV", "dK and dV with equal batch and head strides", "engine", "overlapping-output",
           stride("dk", 0, 64 * 64), stride("dv", 0, 64 * 64)),
    _probe("PRB-OVERLAP-DQ-ROWS", "dQ sequence stride D/2: rows overlap", "engine", "overlapping-output",
           stride("dq", 2, 32)),
)

# ============================================================================ boundary values (issue 17)
# Real backward defects are conditional on a size or offset that is not a multiple of a
# kernel's tile. The tile sizes that matter, by where each number comes from; the Triton
# engine's are copied from engines/triton/configs.py (a plan imports no engine).
TILES = {
    "mma": (16, 32, 64, 128),                 # the tile sizes attention kernels commonly use
    "triton-blocks": (16, 32, 64, 128),       # BLOCK_M1/N1/M2/N2 over sm90, sm120, gfx942, cpu; MIN_BLOCK 16
    "triton-head-dim-tiers": (64, 128, 256),  # BLOCK_D tiers (the next power of two >= max(16, D))
    "group": (4, 8),                          # GQA group sizes a kernel may unroll or pack heads by
    "grid": (64, 128),                        # programs: where a grid's waves and schedules turn over
}
SEQ_TILES = tuple(sorted(set(TILES["mma"]) | set(TILES["triton-blocks"])))
HEAD_DIM_TILES = tuple(sorted(set(SEQ_TILES) | set(TILES["triton-head-dim-tiers"])))
HEAD_DIM_CAP = 256        # the largest head dim an engine serves: D 257 would only be declined
GRID_ROWS = 64            # BND-GRID counts B x H_q x ceil(S_q / 64) programs
LARGE_GRID = 1040         # more than 1024 programs


def _bset(shape, *, values=None, level="pr", **spec) -> BoundarySet:
    return BoundarySet(Spec(shape, **spec), values, level)


# Quick holds a few values of every class on the smallest graphs (the CPU quick budget);
# pr holds every value on two or three bases (GQA, B 2, masks, both alignments).
# A base's varied size is a placeholder (the class sets it).
BOUNDARY_CLASSES = (
    BoundaryClass("BND-SQ-TAIL", "S_q just below, at and just above a tile", "S_q", SEQ_TILES, (
        _bset(_shape(H=1, S=1, S_kv=40, D=16), values=(15, 17, 63), level="quick"),
        _bset(_shape(H=2, S=1, S_kv=80, D=32)),
        _bset(_shape(B=2, H=4, H_k=2, S=1, S_kv=96, D=64), mask="causal-tl"))),
    BoundaryClass("BND-SKV-TAIL", "S_kv just below, at and just above a tile", "S_kv", SEQ_TILES, (
        _bset(_shape(H=1, S=24, S_kv=1, D=16), values=(15, 65), level="quick"),
        _bset(_shape(H=2, S=48, S_kv=1, D=32)),
        _bset(_shape(B=2, H=4, H_k=1, S=33, S_kv=1, D=64), mask="causal-br"))),
    BoundaryClass("BND-BR-OFFSET", "BOTTOM_RIGHT diagonal offset S_kv - S_q around a tile, and S_q > S_kv",
                  "br-offset", SEQ_TILES, (
        _bset(_shape(H=1, S=48, D=16), values=(15, 63, 65, -17), level="quick", mask="causal-br"),
        _bset(_shape(H=2, S=48, D=32), mask="causal-br"),
        _bset(_shape(B=2, H=4, H_k=2, S=70, D=64), mask="window-br")), extras=(-1, -17, -47)),
    BoundaryClass("BND-WINDOW-LEFT", "left_bound around a tile, with and without a right bound", "left-bound",
                  SEQ_TILES, (
        _bset(_shape(H=1, S=80, D=16), values=(15, 17, 63), level="quick"),          # no right bound
        _bset(_shape(H=1, S=80, D=16), values=(33,), level="quick", mask="causal-tl"),
        _bset(_shape(H=2, S=160, D=32)),
        _bset(_shape(H=2, S=160, D=32), mask="causal-tl"),
        _bset(_shape(B=2, H=4, H_k=2, S=150, S_kv=200, D=64), mask="band-br"))),
    BoundaryClass("BND-WINDOW-RIGHT", "a right bound alone (a one-sided band, lookahead) around a tile",
                  "right-bound", SEQ_TILES, (
        _bset(_shape(H=1, S=80, D=16), values=(15, 17), level="quick"),
        _bset(_shape(H=2, S=160, D=32)),
        _bset(_shape(B=2, H=4, H_k=2, S=100, S_kv=200, D=64), mask="causal-br"))),
    BoundaryClass("BND-HEAD-DIM", "D_qk = D_v around a tile and the head-dim tiers", "head-dim",
                  HEAD_DIM_TILES, (
        _bset(_shape(H=1, S=40, D=1), values=(17, 63, 129), level="quick"),
        _bset(_shape(H=2, S=80, D=1)),
        _bset(_shape(B=2, H=4, H_k=2, S=65, S_kv=130, D=1), mask="causal-br")), cap=HEAD_DIM_CAP),
    BoundaryClass("BND-GROUP", "GQA group ratio H_q / H_k not a power of two, and 8 or more", "group",
                  TILES["group"], (
        _bset(_shape(H=2, H_k=2, S=40, D=16), values=(5, 7), level="quick"),
        _bset(_shape(H=2, H_k=2, S=64, D=32)),
        _bset(_shape(B=2, H=1, S=65, D=64), mask="causal-br")), extras=(6, 16)),
    BoundaryClass("BND-GRID", "B x H_q x ceil(S_q / 64) programs around 64 and 128, and a large grid", "grid",
                  TILES["grid"], (
        _bset(_shape(H=1, S=16, D=16), values=(65,), level="quick"),
        _bset(_shape(H=1, S=16, D=16)),
        _bset(_shape(H=8, H_k=2, S=128, D=32), values=(64, 128, LARGE_GRID)),
        _bset(_shape(H=3, S=64, D=64), values=(63, 129), mask="causal-tl"),
        _bset(_shape(H=13, S=64, D=32), values=(65,))), extras=(LARGE_GRID,)),
)

BOUNDARIES = BoundaryPlan(tiles=TILES, classes=BOUNDARY_CLASSES, each_class_by="quick", every_value_by="pr",
                          grid_rows=GRID_ROWS)

# ============================================================================ review gaps (issue 17)
# fp16 Q and K near fp16's range: shifted-logits at a tiny scale puts alpha ~ 1.7e4 into every
# element (alpha = sqrt(110 / (scale * D)), the spread c = 1 / sqrt(scale * sqrt(D)) keeps
# 7 sigma under 65504), so the unscaled dS K and dS^T Q partial sums over a key block reach
# ~1e4 before they cancel: an fp16 intermediate overflows. The second one is pr-sized.
GAP_REGRESSIONS = (
    Regression("REG-FP16-INTERMEDIATE-RANGE",
               "fp16 inputs near fp16's range: fp16 dS / dQ / dK partial sums overflow",
               "issue 17 (review: only bf16 carried such magnitudes)",
               (Spec(_shape(H=1, S=128, D=64), dtype="fp16", distribution="shifted-logits",
                     mutations=(attr("attn_scale", 6e-9),)),
                Spec(_shape(B=2, H=4, H_k=2, S=200, S_kv=256, D=128), dtype="fp16", distribution="shifted-logits",
                     mask="causal-br", mutations=(attr("attn_scale", 3.5e-9),)))),
    # the head-dim stride arm of every port (REG-HEAD-DIM-STRIDE holds q and dq)
    Regression("REG-HEAD-DIM-STRIDE-EVERY-PORT", "head-dim stride other than 1 on k, v, o, do, dk or dv",
               f"{_PRS} (ALMIOPEN-3036)",
               tuple(Spec(_shape(H=1, S=48, D=32), port_kinds={port: "bhds"})
                     for port in ("k", "v", "o", "do", "dk", "dv"))),
)

# every layout where it is no other layout's memory (B, H, S >= 2), with a head
# dim of each tail class (D % 32 = 16, D % 16 != 0) at every gradient port
_LAYOUT_DISTINCT = tuple(Spec(_shape(B=2, H=2, S=33, D=d), layout=name) for name in LAYOUTS for d in (48, 40))

GAP_CATALOG = (
    CatalogEntry("SHP-LAYOUT-DISTINCT", "every layout at B, H, S >= 2 (no other layout's memory) with D 48 and 40",
                 _LAYOUT_DISTINCT, level="pr"),
    # the deterministic backward where the CPU gate runs it (GQA, fp16, bottom-right
    # tails; a batch-broadcast bias with dBias and sinks, where atomics would live)
    CatalogEntry("SHP-DETERMINISTIC-CPU", "the deterministic backward at CPU size: GQA fp16 causal-br tails, dBias + dSinks",
                 (Spec(_shape(B=2, H=4, H_k=2, S=24, S_kv=40, D=16), dtype="fp16", mask="causal-br", bias="batch",
                       dbias="on", sinks="on", deterministic="on"),)),
    # fp16 and the risky values early (quick: CPU-sized; pr: the 512 x 256 pairs)
    CatalogEntry("SHP-RISK-EARLY-QUICK", "fp16 with extreme LSE x band at an S_kv half tile; sinks x B 2 x decode",
                 (Spec(_shape(B=2, H=4, H_k=2, S=17, S_kv=96, D=40), dtype="fp16", mask="band-br",
                       distribution="shifted-logits"),
                  Spec(_shape(B=2, H=2, S=1, S_kv=96, D=48), dtype="fp16", mask="causal-br", sinks="on"),
                  Spec(_shape(B=2, H=2, S=33, S_kv=96, D=24), dtype="fp16", mask="window-br", layout="bshd"))),
    CatalogEntry("SHP-RISK-EARLY", "S_q 512 x S_kv 256 both ways; extreme LSE x band/window at S_kv half tiles; "
                 "sinks x B >= 2 x decode-like S_q",
                 (Spec(_shape(B=2, H=4, H_k=2, S=512, S_kv=256, D=64), mask="causal-br"),
                  Spec(_shape(B=2, H=4, H_k=2, S=256, S_kv=512, D=64), mask="causal-br", dtype="fp16"),
                  Spec(_shape(B=2, H=4, S=512, S_kv=256, D=128), mask="window-br", distribution="shifted-logits"),
                  Spec(_shape(B=2, H=4, H_k=1, S=256, S_kv=512, D=128), mask="band-tl", dtype="fp16",
                       distribution="shifted-logits"),
                  Spec(_shape(B=2, H=2, S=192, D=64), mask="band-br", distribution="shifted-logits"),
                  Spec(_shape(B=2, H=4, H_k=2, S=100, S_kv=320, D=128), mask="window-tl", dtype="fp16",
                       distribution="shifted-logits"),
                  Spec(_shape(B=3, H=8, H_k=2, S=1, S_kv=192, D=128), mask="causal-br", sinks="on"),
                  Spec(_shape(B=2, H=4, S=3, S_kv=320, D=64), dtype="fp16", sinks="on")), level="pr"),
    # gradients with a realistic range and correlation, in fp16 at quick
    CatalogEntry("SHP-GRAD-RANGE",
                 "dO correlated with O (L2 loss), and |dO| ~ 1e3 driving dP towards and past fp16's range",
                 (Spec(_shape(B=2, H=2, S=64, D=64), dtype="fp16", distribution="l2-grad", mask="causal-br"),
                  Spec(_shape(B=2, H=4, H_k=2, S=48, S_kv=80, D=64), distribution="l2-grad"),
                  Spec(_shape(B=2, H=2, S=64, D=64), dtype="fp16", distribution="large-do"),
                  Spec(_shape(B=1, H=2, S=63, D=128), dtype="fp16", distribution="large-do", mask="causal-tl"),
                  Spec(_shape(B=2, H=2, S=64, D=64), dtype="fp16", distribution="overflow-dp"))),
    # long coherent sums: dO correlated with O over 512 rows, sinks with B 2 (dSinks sums 1024
    # rows of one sign): a dV or dSinks sum kept in bf16 is outside the bound here
    CatalogEntry("SHP-GRAD-RANGE-LONG", "dO correlated with O over long sums: dV and dSinks (B 2, sinks)",
                 (Spec(_shape(B=2, H=2, S=512, D=64), distribution="l2-grad", sinks="on"),), level="pr"),
    # a bias broadcast over batch and heads: dBias sums B x H = 128 copies of dS, correlated
    # by an L2 loss. The bound adds the copies in quadrature (grows as sqrt(128)), a sum kept
    # in bf16 errs with the running total (grows as 128): outside the bound only with many
    # copies; small rows keep it CPU-cheap
    CatalogEntry("SHP-DBIAS-MANY-COPIES", "dBias of a bias broadcast over B 8 x H 16: 128 correlated copies summed",
                 (Spec(_shape(B=8, H=16, S=16, D=16), distribution="l2-grad", bias="both", dbias="on"),)),
    # SHP-MANY-PROGRAMS's first shapes, too large for pr's per-case bytes: kept (and claimed) at nightly
    CatalogEntry("SHP-MANY-PROGRAMS-D128", "B 8 x H 16 at d128: 512 programs of 64 rows",
                 (Spec(_shape(B=8, H=16, S=256, D=128)),
                  Spec(_shape(B=8, H=16, H_k=4, S=256, D=128), mask="causal-br")), level="nightly"),
    CatalogEntry("SHP-D256-B2-CAUSAL", "d256 with B 2 under a causal mask, small enough for quick (TL, and BR GQA)",
                 (Spec(_shape(B=2, H=1, S=40, D=256), mask="causal-tl"),
                  Spec(_shape(B=2, H=2, H_k=1, S=33, S_kv=47, D=256), mask="causal-br"))),
    # broadcast inputs with a zero head stride: valid graphs (an engine may decline them).
    # O can be broadcast over heads only when every head's O is the same: all of q, k, v,
    # do and stats broadcast too.
    CatalogEntry("SHP-BROADCAST-HEAD-INPUTS", "zero head stride on q, do, and o (with every input) ",
                 (Spec(_shape(B=2, H=2, S=48, D=32), port_kinds={"q": "bcast-head"}),
                  Spec(_shape(B=2, H=2, S=48, D=32), port_kinds={"do": "bcast-head"}),
                  Spec(_shape(B=2, H=2, S=48, D=32),
                       port_kinds={p: "bcast-head" for p in ("q", "k", "v", "o", "do")},
                       mutations=(stride("stats", 1, 0),)))),
    # sequence strides below D at S > 1: rows overlap; reads of overlapping rows are valid
    CatalogEntry("SHP-OVERLAPPING-INPUT-ROWS", "input sequence stride below D at S > 1: q, k, v, do rows overlap",
                 (Spec(_shape(H=2, S=48, D=32), mutations=(stride("q", 2, 16),)),
                  Spec(_shape(H=2, S=48, D=32), mutations=(stride("k", 2, 1), stride("v", 2, 8))),
                  Spec(_shape(H=2, S=48, D=32), mask="causal-br", mutations=(stride("do", 2, 8),)))),
)

#: a probe of the score modifiers' rules: a full bias with its dbias, sinks with dsinks
_MOD = dict(bias="full", dbias="on", sinks="on")
MODIFIER_PROBES = (
    _probe("PRB-BIAS-DIMS", "bias S_kv != S_kv", "frontend", "bias-dims-mismatch", dims("bias", 3, 63), **_MOD),
    _probe("PRB-BIAS-HEADS-NOT-BROADCAST", "bias [B, 1, S_q, S_kv] with a head stride: dims, not a broadcast",
           "frontend", "bias-dims-mismatch", dims("bias", 1, 1), bias="full"),
    _probe("PRB-BIAS-DTYPE", "bias dtype != io dtype", "frontend", "dtype-mismatch", dtype("bias", "fp16"), **_MOD),
    _probe("PRB-BIAS-ROW-BROADCAST", "bias stride 0 on S_q (only batch and heads may broadcast)", "frontend",
           "bias-broadcast-axis", stride("bias", 2, 0), bias="full"),
    _probe("PRB-DBIAS-WITHOUT-BIAS", "dbias output without a bias input", "frontend", "dbias-without-bias",
           drop("bias"), **_MOD),
    _probe("PRB-DBIAS-NOT-REDUCED", "dbias keeps the batch axis a batch-broadcast bias sums over", "frontend",
           "dbias-dims-mismatch", dims("dbias", 0, 2), bias="batch", dbias="on"),
    _probe("PRB-DBIAS-DTYPE", "dbias dtype != io dtype", "frontend", "dtype-mismatch", dtype("dbias", "fp16"),
           **_MOD),
    _probe("PRB-DBIAS-OVERLAP", "dbias rows overlap: a layout that cannot be written", "frontend",
           "dbias-overlap", stride("dbias", 2, 32), **_MOD),
    _probe("PRB-DBIAS-ZERO-STRIDE", "dbias head stride 0 with H_q = 2", "frontend", "dbias-overlap",
           stride("dbias", 1, 0), **_MOD),
    _probe("PRB-SINKS-DTYPE", "sinks not fp32", "frontend", "sinks-dtype", dtype("sinks", "bf16"), sinks="on"),
    _probe("PRB-SINKS-DIMS", "sinks [1] for H_q = 2", "frontend", "sinks-dims-mismatch", dims("sinks", 0, 1),
           sinks="on"),
    _probe("PRB-DSINKS-WITHOUT-SINKS", "dsinks output without a sinks input", "frontend", "dsinks-without-sinks",
           drop("sinks"), sinks="on"),
    _probe("PRB-DSINKS-OVERLAP", "dsinks stride 0 with H_q = 2", "frontend", "dsinks-overlap",
           stride("dsinks", 0, 0), sinks="on"),
    _probe("PRB-SOFTCAP-ZERO", "softcap = 0", "frontend", "softcap-nonpositive", attr("softcap", 0.0)),
    _probe("PRB-SOFTCAP-NEGATIVE", "softcap < 0", "frontend", "softcap-nonpositive", attr("softcap", -30.0)),
)

PROBE_ARMS = (
    _probe("PRB-ZERO-STRIDE-DQ-HEAD", "dQ head stride 0 with H_q = 2 (batch stride kept)", "engine",
           "zero-stride-output", stride("dq", 1, 0)),
    _probe("PRB-ZERO-STRIDE-DK-BATCH", "dK batch stride 0 with B = 2 (head stride kept)", "engine",
           "zero-stride-output", stride("dk", 0, 0)),
    _probe("PRB-STATS-RANK-3", "stats of rank 3 [B, H_q, S_q]", "frontend", "bad-rank",
           reshape("stats", (2, 2, 64), (128, 64, 1))),
)

# score-modifier shapes: the combinations the axis values alone do not reach
MODIFIER_CATALOG = (
    CatalogEntry("SHP-ALIBI-CAUSAL", "ALiBi with GQA and bottom-right causal, S_q != S_kv (FlashAttention's alibi test)",
                 (Spec(_shape(B=2, H=4, H_k=2, S=48, S_kv=80, D=64), mask="causal-br", bias="alibi", dbias="on"),
                  Spec(_shape(B=2, H=4, S=80, S_kv=48, D=64), mask="causal-tl", bias="alibi"))),
    CatalogEntry("SHP-SINKS-EMPTY-ROWS", "sinks where rows keep no key (their LSE is the sink, dQ 0)",
                 (Spec(_shape(H=2, S=96, S_kv=32, D=32), mask="causal-br", sinks="on"),
                  Spec(_shape(H=4, H_k=1, S=64, D=32), mask="strict-causal-tl", sinks="on", softcap="cap5"))),
    CatalogEntry("SHP-SINKS-FROZEN", "sinks without their gradient (no dsinks output)",
                 (Spec(_shape(B=2, H=4, H_k=2, S=64, D=64), sinks="on", mutations=(drop("dsinks"),)),),
                 level="pr"),
    CatalogEntry("SHP-MODIFIERS-ALL", "bias + dBias + sinks + softcap at once, GQA, causal",
                 (Spec(_shape(B=2, H=4, H_k=2, S=64, D=64), mask="causal-br", bias="head", dbias="on",
                       sinks="on", softcap="cap5"),
                  Spec(_shape(B=2, H=8, H_k=2, S=256, S_kv=384, D=128), mask="window-br", bias="both",
                       dbias="on", sinks="on", softcap="cap30"),
                  Spec(_shape(B=2, H=8, H_k=2, S=512, D=64), mask="causal-tl", bias="batch",
                       dbias="on", sinks="on", softcap="cap5")), level="pr"),
    CatalogEntry("SHP-BIAS-STRIDED", "bias and dBias in padded and transposed layouts (any strides)",
                 (Spec(_shape(B=2, H=2, S=64, S_kv=72, D=64), bias="full", dbias="on",
                       mutations=(reshape("bias", (2, 2, 64, 72), (2 * 64 * 80, 64 * 80, 80, 1)),
                                  reshape("dbias", (2, 2, 64, 72), (1, 2, 4 * 72, 4)))),
                  Spec(_shape(B=2, H=2, S=64, S_kv=72, D=64), bias="head", dbias="on",
                       mutations=(reshape("bias", (2, 2, 64, 72), (64 * 72, 0, 1, 64)),))), level="pr"),
    CatalogEntry("SHP-SOFTCAP-GEMMA", "softcap 30 with a sliding window at S = 1k (Gemma 2's attention)",
                 (Spec(_shape(B=1, H=8, H_k=4, S=1024, D=128), mask="window-256-br", softcap="cap30"),
                  Spec(_shape(B=2, H=8, H_k=4, S=1024, D=128), mask="window-256-br", softcap="cap5",
                       bias="alibi")),
                 level="nightly"),
    CatalogEntry("SHP-MODIFIERS-LONG", "bias + dBias + sinks at S = 2k (dBias summed over 16 heads)",
                 (Spec(_shape(B=1, H=16, H_k=4, S=2048, D=64), mask="causal-br", bias="both", dbias="on",
                       sinks="on"),), level="nightly"),
)

# fp32 io (true fp32 products: no TF32). Every case is also a TF32 detector: TF32 rounds the
# products' inputs to 10 mantissa bits, a relative error near 2^-11, some 60 times the fp32
# classes' rtol.
FP32_CATALOG = (
    CatalogEntry("SHP-FP32", "fp32 io: MHA, GQA with tails under bottom-right causal, a window, shifted logits",
                 (Spec(_shape(H=1, S=48, D=32), dtype="fp32"),
                  Spec(_shape(H=2, H_k=1, S=17, S_kv=33, D=40), dtype="fp32", mask="causal-br"),
                  Spec(_shape(H=1, S=40, D=16), dtype="fp32", mask="window-tl", layout="bshd"),
                  Spec(_shape(H=1, S=48, D=32), dtype="fp32", distribution="shifted-logits"))),
    CatalogEntry("SHP-FP32-PR", "fp32 io at S 256-384: GQA 8/2 d128 causal, MLA head dims, a band, a bias",
                 (Spec(_shape(B=2, H=8, H_k=2, S=256, D=128), dtype="fp32", mask="causal-tl"),
                  Spec(_shape(B=1, H=4, S=200, S_kv=384, D=96, D_v=64), dtype="fp32", mask="band-br"),
                  Spec(_shape(B=2, H=4, S=128, D=64), dtype="fp32", bias="full", dbias="on"),
                  Spec(_shape(B=1, H=4, H_k=1, S=256, D=128), dtype="fp32", distribution="small-int")),
                 level="pr"),
    CatalogEntry("SHP-FP32-LONG", "fp32 io at S = 2048 (several KV blocks), GQA, causal",
                 (Spec(_shape(B=1, H=8, H_k=2, S=2048, D=128), dtype="fp32", mask="causal-br"),
                  Spec(_shape(B=2, H=4, S=1024, S_kv=1536, D=64), dtype="fp32")), level="nightly"),
)

# dropout through the dropout_mask port. fp32 cases judge the mask's arithmetic sharply (the
# fp32 classes are ~1000 times tighter than bf16's); 16-bit ones the engines' usual path.
_DROP = dict(dropout="p0.5")
DROPOUT_CATALOG = (
    CatalogEntry("SHP-DROPOUT", "dropout p 0.1 / 0.5 / 0.9 through the mask port: GQA with tails under "
                 "bottom-right causal, a window, a head-broadcast mask, fp32",
                 (Spec(_shape(H=1, S=32, D=16), dropout="p0.1"),
                  Spec(_shape(H=2, H_k=1, S=17, S_kv=33, D=16), mask="causal-br", **_DROP),
                  Spec(_shape(H=1, S=40, D=16), mask="window-tl", dropout="p0.9"),
                  Spec(_shape(B=2, H=2, S=24, D=16), dropout_mask="head", **_DROP),
                  Spec(_shape(H=2, H_k=1, S=33, S_kv=20, D=32), dtype="fp32", mask="causal-tl", **_DROP))),
    CatalogEntry("SHP-DROPOUT-ZERO", "dropout_probability = 0 set explicitly: the plain graph (GATE-DROPOUT-ZERO)",
                 (Spec(_shape(H=1, S=32, D=16), mutations=(attr("dropout_probability", 0.0),)),)),
    CatalogEntry("SHP-DROPOUT-PR", "dropout at S 128-384: GQA 8/2 d128 causal, a band, p 0.9 with S_q < S_kv, "
                 "every modifier, a mask broadcast over batch and heads",
                 (Spec(_shape(B=2, H=8, H_k=2, S=256, D=128), mask="causal-tl", dropout="p0.1"),
                  Spec(_shape(B=1, H=4, S=200, S_kv=384, D=64), mask="band-br", dropout="p0.9"),
                  Spec(_shape(B=2, H=4, H_k=2, S=128, D=64), mask="causal-br", bias="head", sinks="on",
                       softcap="cap5", **_DROP),
                  Spec(_shape(B=2, H=4, S=128, S_kv=160, D=64), dropout_mask="both", **_DROP),
                  Spec(_shape(B=1, H=4, H_k=1, S=256, D=128), dtype="fp32", mask="window-br", **_DROP)),
                 level="pr"),
    CatalogEntry("SHP-DROPOUT-LONG", "dropout at S = 1024-2048 (several KV blocks), GQA, causal, a window",
                 (Spec(_shape(B=1, H=8, H_k=2, S=2048, D=128), mask="causal-br", dropout="p0.1"),
                  Spec(_shape(B=2, H=4, S=1024, D=64), mask="window-256-br", **_DROP)), level="nightly"),
    # no mask port: the engine draws its own mask from a counter-based generator and tells it
    # (docs/CONTRACTS.md, "Dropout"); the dK/dV and dQ passes must draw the same bits
    CatalogEntry("SHP-DROPOUT-DRAWN", "dropout with a mask the engine draws: GQA with tails under a "
                 "bottom-right causal band",
                 (Spec(_shape(H=2, H_k=1, S=17, S_kv=33, D=16), mask="causal-br", dropout_mask="drawn", **_DROP),)),
    CatalogEntry("SHP-DROPOUT-DRAWN-PR", "engine-drawn dropout at S 64-200: GQA 4/2 causal with tails, p 0.1 "
                 "and 0.9, H_k != H_v, S_q > S_kv, fp32",
                 (Spec(_shape(B=2, H=4, H_k=2, S=100, S_kv=130, D=64), mask="causal-tl", dropout="p0.1",
                       dropout_mask="drawn"),
                  Spec(_shape(B=1, H=4, H_k=2, H_v=1, S=200, S_kv=77, D=32), mask="band-br", dropout="p0.9",
                       dropout_mask="drawn"),
                  Spec(_shape(B=2, H=2, S=64, D=40), dtype="fp32", dropout_mask="drawn", **_DROP)),
                 level="pr"),
)

_DROP_PROBE = dict(shape=_shape(B=2, H=2, S=32, D=16), **_DROP)
DROPOUT_PROBES = (
    _probe("PRB-DROPOUT-NEGATIVE", "dropout_probability < 0", "frontend", "dropout-probability-range",
           attr("dropout_probability", -0.1), **_DROP_PROBE),
    _probe("PRB-DROPOUT-ONE", "dropout_probability = 1 (every entry dropped, scale 1 / 0)", "frontend",
           "dropout-probability-range", attr("dropout_probability", 1.0), **_DROP_PROBE),
    _probe("PRB-DROPOUT-MASK-DIMS", "dropout mask S_kv != S_kv", "frontend", "dropout-mask-dims-mismatch",
           dims("dropout_mask", 3, 31), **_DROP_PROBE),
    _probe("PRB-DROPOUT-MASK-DTYPE", "dropout mask dtype != io dtype", "frontend", "dtype-mismatch",
           dtype("dropout_mask", "fp16"), **_DROP_PROBE),
    _probe("PRB-DROPOUT-MASK-ROW-BROADCAST", "dropout mask stride 0 on S_q (only batch and heads may broadcast)",
           "frontend", "dropout-mask-broadcast-axis", stride("dropout_mask", 2, 0), **_DROP_PROBE),
    _probe("PRB-DROPOUT-MASK-WITHOUT-P", "a dropout mask without dropout_probability", "frontend",
           "dropout-mask-without-probability", attr("dropout_probability", None), **_DROP_PROBE),
    _probe("PRB-DROPOUT-MASK-P-ZERO", "a dropout mask with dropout_probability = 0", "frontend",
           "dropout-mask-without-probability", attr("dropout_probability", 0.0), **_DROP_PROBE),
)

# ALiBi as slopes (the alibi_slopes port): the query head's slope under GQA / MQA (MQA 4/1
# tells a slope read by the K head at once), the diagonal shifted per alignment, both forms
ALIBI_SLOPES_CATALOG = (
    CatalogEntry("SHP-ALIBI-SLOPES", "ALiBi slopes [H_q] under MQA, bottom-right causal, S_q < S_kv; "
                 "[B, H_q] slopes with a head-broadcast bias and its dBias, S_q > S_kv",
                 (Spec(_shape(B=2, H=4, H_k=1, S=24, S_kv=40, D=32), mask="causal-br", alibi_slopes="head"),
                  Spec(_shape(B=2, H=4, H_k=2, S=40, S_kv=24, D=32), alibi_slopes="batch", bias="head",
                       dbias="on"))),
    CatalogEntry("SHP-ALIBI-SLOPES-PR", "ALiBi slopes at S 256-384: GQA 8/2 d128 causal-br; [B, H_q] slopes "
                 "with a window, sinks and a softcap; fp16 top-left",
                 (Spec(_shape(B=2, H=8, H_k=2, S=256, S_kv=384, D=128), mask="causal-br", alibi_slopes="head"),
                  Spec(_shape(B=2, H=4, H_k=1, S=300, D=64), mask="window-br", alibi_slopes="batch",
                       sinks="on", softcap="cap5"),
                  Spec(_shape(B=3, H=4, S=129, S_kv=65, D=64), dtype="fp16", mask="causal-tl",
                       alibi_slopes="head")), level="pr"),
)
ALIBI_SLOPES_PROBES = (
    _probe("PRB-ALIBI-SLOPES-DIMS", "alibi_slopes [3] for H_q = 2", "frontend", "alibi-slopes-dims-mismatch",
           dims("alibi_slopes", 0, 3), alibi_slopes="head"),
    _probe("PRB-ALIBI-SLOPES-BATCH-DIMS", "alibi_slopes [3, H_q] for B = 2", "frontend",
           "alibi-slopes-dims-mismatch", dims("alibi_slopes", 0, 3), alibi_slopes="batch"),
    _probe("PRB-ALIBI-SLOPES-DTYPE", "alibi_slopes not fp32", "frontend", "alibi-slopes-dtype",
           dtype("alibi_slopes", "bf16"), alibi_slopes="head"),
    _probe("PRB-ALIBI-SLOPES-RANK", "alibi_slopes of rank 3 [1, B, H_q]", "frontend", "bad-rank",
           reshape("alibi_slopes", (1, 2, 2), (4, 2, 1)), alibi_slopes="batch"),
)

# ============================================================================ ragged (THD / varlen)
# A separate axis space, pair-proved on its own (DESIGN section 10): a ragged graph has no
# padded storage kind, sequence pair or batch size, so "batch kind" as one more padded axis
# would pair every padded-only value with "ragged" through repair cases that cannot exist.
RAGGED_LENGTHS = {                    # per-sequence lengths, q side then kv side (None: same)
    "mixed": Lengths((40, 1, 17, 30), (40, 9, 17, 48)),
    "equal": Lengths((32, 32, 32)),                           # a padded batch, packed
    "single": Lengths((50,), (70,)),                          # B = 1
    "zero-q": Lengths((24, 0, 33), (24, 20, 33)),             # a sequence with no query rows
    "zero-kv": Lengths((24, 20, 33), (24, 0, 33)),            # query rows with no keys: LSE -inf
    "zero-first": Lengths((0, 24, 9), (0, 30, 9)),            # cu[0] = cu[1] on both sides
    "len-1": Lengths((1, 1, 1, 1)),
    "decode": Lengths((1, 1, 1), (47, 1, 16)),
    "tile-tails": Lengths((63, 65, 127, 129)),                # each side of the 64 and 128 tiles
    "q-longer": Lengths((65, 48, 30), (16, 1, 29)),           # S_q_b > S_kv_b
    "kv-longer": Lengths((16, 1, 29), (65, 48, 30)),          # S_q_b < S_kv_b
}

RAGGED_STORAGES = {                   # token-major storage of every port (generator/layouts.py)
    "thd": TokenStorage(),                                    # packed [T, H, D], stats [H, T]
    "htd": TokenStorage("htd"),                               # head by head [H, T, D]
    "thd-pad16": TokenStorage("thd-pad16"),                   # token stride H*D + 16
    "thd-offset24": TokenStorage(offset=24),                  # every view 24 elements in
    "spare-rows": TokenStorage(lead=5, tail=7),               # rows before cu[0], after cu[B]
    "stats-th": TokenStorage(stats="stats-th"),               # stats token-major [T, H]
    # one buffer for Q, K, V ([T, 3, H, D]) or K, V ([T, 2, H, D]), gradients likewise:
    # FlashAttention's varlen qkvpacked / kvpacked inputs
    "qkv-packed": TokenStorage(packed="qkv"),
    "kv-packed": TokenStorage(packed="kv"),
}
RAGGED_PACKED_STORAGES = ("qkv-packed", "kv-packed")

# padded varlen (FlashAttention 3's seqused_q / seqused_k): each sequence's last rows of its
# cu_seqlens range are padding (NaN canaries the engine must not read, output rows it must
# not write); 7 rows, so a used length crosses the 64-row tiles of the 65-, 127- and
# 129-row sequences and short sequences use none of their rows
RAGGED_SEQUSED = {
    "off": None,
    "kv": SeqUsed(kv_pad=7),               # keys padded (FA3's seqused_k alone)
    "both": SeqUsed(q_pad=7, kv_pad=7),
    "q": SeqUsed(q_pad=7),                 # query rows padded alone (the port's third form)
}

RAGGED_MASKS = ("none", "causal-tl", "causal-br", "strict-causal-br", "window-tl", "window-br", "band-br")

# score modifiers per sequence (docs/CONTRACTS.md, "Score modifiers"): the bias in the padded
# [B, H_q, max_seqlen_q, max_seqlen_kv] layout, its dBias per sequence (batch-broadcast: summed
# over the sequences), sinks and their dSinks over the sequences' rows, ALiBi slopes with each
# sequence's own diagonal shift
RAGGED_MODIFIER_SETS = {
    "none": ModifierSet(),
    "softcap": ModifierSet(softcap="cap5"),
    "sinks": ModifierSet(sinks="on"),
    "bias": ModifierSet(bias="full"),
    "bias-dbias": ModifierSet(bias="full", dbias="on"),
    "bias-batch-dbias": ModifierSet(bias="batch", dbias="on"),
    "alibi-slopes": ModifierSet(alibi_slopes="head"),
    "alibi-slopes-batch": ModifierSet(alibi_slopes="batch"),
    # the bias's other broadcasts (pass 3: every port form an axis value)
    "bias-head": ModifierSet(bias="head"),
    "bias-both-dbias": ModifierSet(bias="both", dbias="on"),
}
#: the ragged suites' pass the modifiers axis joined: after pass 1 (deterministic, l2-grad)
RAGGED_MODIFIERS_PASS = 2
# The ragged suites' third pass: the largest head-dim tier (D256) and a group ratio that is
# no power of two (GQA 3) as axis values (each costs the quick CPU budget a case; the other
# tiers and ratios of the padded plan are SHP-RAGGED-HEAD-TIERS, at pr), the packed token
# storages and the used lengths of padded varlen batches
RAGGED_BREADTH_PASS = 2
RAGGED_LATER_HEADS = ("gqa3",)
RAGGED_LATER_HEAD_DIMS = ("d256",)
#: heads only the ragged space draws: three equal heads, so Q, K and V can share one packed
#: buffer with a head count other than two (pass 3)
RAGGED_ONLY_HEADS = {"mha3": HeadConfig(3, 3, 3)}
#: the ragged suites' fourth pass: fp32 io, the dropout forms and seqused_q alone
RAGGED_PORT_FORMS_PASS = 3

RAGGED_AXES = (
    Axis("dtype", "io dtype", AXIS_DTYPES, "bf16", core=True, values_joined={"fp32": RAGGED_PORT_FORMS_PASS}),
    Axis("heads", "head configuration", ("mha", "gqa2", "mqa", "hk2-hv1") + RAGGED_LATER_HEADS + tuple(RAGGED_ONLY_HEADS),
         "mha", core=True, values_joined={**dict.fromkeys(RAGGED_LATER_HEADS, RAGGED_BREADTH_PASS),
                                          **dict.fromkeys(RAGGED_ONLY_HEADS, RAGGED_PORT_FORMS_PASS)}),
    Axis("lengths", "sequence lengths (q, kv) per sequence", tuple(RAGGED_LENGTHS), "mixed", core=True),
    Axis("head_dims", "head dims D_qk, D_v", ("d64", "d128", "d72", "d192-128") + RAGGED_LATER_HEAD_DIMS, "d64",
         core=True, values_joined=dict.fromkeys(RAGGED_LATER_HEAD_DIMS, RAGGED_BREADTH_PASS)),
    Axis("mask", "mask kind, aligned per sequence", RAGGED_MASKS, "none", core=True),
    Axis("storage", "token-major storage", tuple(RAGGED_STORAGES), "thd",
         values_joined=dict.fromkeys(RAGGED_PACKED_STORAGES, RAGGED_BREADTH_PASS)),
    Axis("scale", "attention scale", tuple(SCALES), "default"),
    Axis("distribution", "input distribution", ("randn", "small-int", "shifted-logits", "l2-grad"), "randn",
         values_joined={"l2-grad": 1}),
    # the ragged suites' second pass: the deterministic backward of ragged graphs
    Axis("deterministic", "the deterministic backward asked for", tuple(SWITCHES), "off", core=True, joined=1),
    Axis("modifiers", "score modifiers per sequence (bias, dBias, sinks, softcap, ALiBi slopes)",
         tuple(RAGGED_MODIFIER_SETS), "none", core=True, joined=RAGGED_MODIFIERS_PASS,
         values_joined={"bias-head": RAGGED_PORT_FORMS_PASS, "bias-both-dbias": RAGGED_PORT_FORMS_PASS}),
    Axis("seqused", "per-sequence used lengths (padded varlen)", tuple(RAGGED_SEQUSED), "off", core=True,
         joined=RAGGED_BREADTH_PASS, values_joined={"q": RAGGED_PORT_FORMS_PASS}),
    Axis("dropout_form", "dropout: p with the mask port's form (padded to the max lengths, or drawn)",
         tuple(DROPOUT_FORMS), "off", core=True, joined=RAGGED_PORT_FORMS_PASS),
)

_BR_MASKS = tuple(n for n in RAGGED_MASKS if MASKS[n].alignment == "BOTTOM_RIGHT")
_UNEQUAL_LENGTHS = tuple(n for n, ln in RAGGED_LENGTHS.items() if ln.q != ln.kv_lengths)
_WINDOW_MASKS = tuple(n for n in RAGGED_MASKS if MASKS[n].left_bound is not None)
_PAST_WINDOW = tuple(n for n, ln in RAGGED_LENGTHS.items() if max(ln.kv_lengths) > WINDOW)

_RAGGED_HEADS = next(a for a in RAGGED_AXES if a.name == "heads").values
_RAGGED_HEAD_CONFIGS = {**HEADS, **RAGGED_ONLY_HEADS}
_RAGGED_HEAD_DIMS = next(a for a in RAGGED_AXES if a.name == "head_dims").values
_SAME_LENGTHS = tuple(n for n, ln in RAGGED_LENGTHS.items() if ln.q == ln.kv_lengths)

_MANY_SEQUENCES = tuple(n for n, ln in RAGGED_LENGTHS.items() if len(ln.q) > 1)
_USED_PAD = RAGGED_SEQUSED["both"]
#: lengths where some sequence keeps a key (a query row) past the used lengths' padding
_KEEPS_A_KEY = tuple(n for n, ln in RAGGED_LENGTHS.items() if max(ln.kv_lengths) > _USED_PAD.kv_pad)
_KEEPS_A_QUERY = tuple(n for n, ln in RAGGED_LENGTHS.items() if max(ln.q) > _USED_PAD.q_pad)
RAGGED_RULES = (
    Rule("ragged-used-keys-need-a-kept-key",
         "used key lengths over sequences no longer than their padding use no key at all: every "
         "gradient is zero, and each pair the case holds is held only vacuously",
         when={"seqused": ("kv", "both")}, require={"lengths": _KEEPS_A_KEY}),
    Rule("ragged-used-queries-need-a-kept-query",
         "used query lengths over sequences no longer than their padding use no query row: every "
         "gradient is zero, and each pair the case holds is held only vacuously",
         when={"seqused": ("q", "both")}, require={"lengths": _KEEPS_A_QUERY}),
    Rule("ragged-dropout-batch-broadcast-needs-sequences",
         "a zero batch stride on the dropout mask over one sequence broadcasts nothing",
         when={"dropout_form": _BATCH_BROADCAST_DROPOUT}, require={"lengths": _MANY_SEQUENCES}),
    Rule("ragged-bottom-right-needs-unequal-lengths",
         "BOTTOM_RIGHT aligns each sequence's own lengths: where every S_q_b = S_kv_b it is "
         "TOP_LEFT, and the case would test the TOP_LEFT mask again",
         when={"mask": _BR_MASKS}, require={"lengths": _UNEQUAL_LENGTHS}),
    Rule("ragged-window-needs-longer-sequences",
         f"a window of {WINDOW} keys over sequences of at most {WINDOW} keys keeps what causal keeps",
         when={"mask": _WINDOW_MASKS}, require={"lengths": _PAST_WINDOW}),
    Rule("ragged-qkv-packed-needs-equal-heads-dims-and-lengths",
         "Q, K and V are the slots of one [T, 3, H, D] buffer: they share T (so every sequence "
         "has as many keys as queries), H and D",
         when={"storage": ("qkv-packed",)},
         require={"heads": tuple(n for n in _RAGGED_HEADS
                                 if _RAGGED_HEAD_CONFIGS[n].H_q == _RAGGED_HEAD_CONFIGS[n].H_k == _RAGGED_HEAD_CONFIGS[n].H_v),
                  "head_dims": tuple(n for n in _RAGGED_HEAD_DIMS if n in _EQUAL_HEAD_DIMS),
                  "lengths": _SAME_LENGTHS}),
    Rule("ragged-kv-packed-needs-equal-kv-heads-and-dims",
         "K and V are the slots of one [T, 2, H, D] buffer: they share H and D",
         when={"storage": ("kv-packed",)},
         require={"heads": tuple(n for n in _RAGGED_HEADS if _RAGGED_HEAD_CONFIGS[n].H_k == _RAGGED_HEAD_CONFIGS[n].H_v),
                  "head_dims": tuple(n for n in _RAGGED_HEAD_DIMS if n in _EQUAL_HEAD_DIMS)}),
)


def _rspec(H=2, D=64, lengths=RAGGED_LENGTHS["mixed"], *, H_k=None, H_v=None, D_v=None, layout="thd",
           **names) -> Spec:
    H_k = H if H_k is None else H_k
    return Spec(RaggedShape(HeadConfig(H, H_k, H_k if H_v is None else H_v), HeadDims(D, D if D_v is None else D_v),
                            lengths), layout=layout, **names)


RAGGED_CATALOG = (
    CatalogEntry("SHP-RAGGED-MAX-ABOVE-LONGEST",
                 "max_seqlen above every length (valid: engines size grids by the bound)",
                 (_rspec(lengths=Offsets((0, 30, 47, 80), (0, 50, 51, 90), max_q=128, max_kv=200)),
                  _rspec(lengths=Offsets((0, 30, 47, 80), (0, 50, 51, 90), max_q=128, max_kv=200),
                         mask="causal-br"))),
    # the quick pairs of packed varlen QKV with head counts other than 2 fall on dropout rows,
    # which engines without ragged dropout (the CPU gate's Triton engine) decline
    CatalogEntry("SHP-RAGGED-QKV-PACKED-HEADS", "Q, K and V in one packed varlen buffer with 3 heads, no "
                 "dropout: the packed head stride at a head count other than the common 2",
                 (_rspec(H=3, D=32, lengths=RAGGED_LENGTHS["equal"], layout="qkv-packed", mask="causal-br"),)),
    CatalogEntry("SHP-RAGGED-MANY-SEQS", "32 sequences of 1-71 query and 0-96 key rows, GQA, causal-br",
                 (_rspec(H=8, H_k=2, lengths=Lengths(tuple(i * 37 % 71 + 1 for i in range(32)),
                                                     tuple(i * 53 % 97 for i in range(32))),
                         mask="causal-br"),), level="pr"),
    CatalogEntry("SHP-RAGGED-LONG", "sequences up to 2048 with GQA 8/2, d128: multi-block loops per sequence",
                 (_rspec(H=8, H_k=2, D=128, lengths=Lengths((1500, 700, 2048, 333), (1500, 1200, 2048, 100)),
                         mask="causal-br"),
                  _rspec(H=8, H_k=2, D=128, lengths=Lengths((1500, 700, 2048, 333), (1500, 1200, 2048, 100)),
                         mask="window-br", layout="htd")), level="nightly"),
    CatalogEntry("SHP-RAGGED-SKEWED", "one query against 4096 keys beside 3000 queries against 64",
                 (_rspec(lengths=Lengths((1, 3000, 17), (4096, 64, 0)), mask="causal-tl"),), level="nightly"),
    # dropout on ragged batches (docs/CONTRACTS.md, "Dropout"): the mask port padded to the
    # max lengths, each sequence its corner; and the mask an engine draws, sequence-local
    CatalogEntry("SHP-RAGGED-DROPOUT", "dropout on ragged batches: the padded mask port (full and "
                 "head-broadcast) and an engine-drawn mask, GQA, tails, causal-br, an empty sequence",
                 (_rspec(H=4, H_k=2, D=32, lengths=RAGGED_LENGTHS["mixed"], mask="causal-br", dropout="p0.5"),
                  _rspec(H=2, H_k=1, D=16, lengths=RAGGED_LENGTHS["zero-kv"], dropout="p0.1",
                         dropout_mask="head"),
                  _rspec(H=4, H_k=1, D=40, lengths=RAGGED_LENGTHS["q-longer"], mask="causal-br",
                         dropout="p0.9", dropout_mask="drawn")), level="pr"),
)

# the padded plan's head-dim tiers and group ratios the ragged axes leave out, one spec each
_TIER_SPECS = (
    _rspec(D=32), _rspec(D=96, mask="causal-br"), _rspec(D=160, mask="window-br"), _rspec(D=192),
    _rspec(D=128, D_v=64, mask="causal-tl"), _rspec(D=64, D_v=128, mask="window-br"), _rspec(D=59, mask="causal-br"), _rspec(D=256, D_v=128),
    _rspec(H=8, H_k=2, mask="causal-br"), _rspec(H=6, H_k=1, D=128), _rspec(H=9, H_k=1, mask="causal-br"),
    _rspec(H=4, H_k=1, H_v=2, D=96), _rspec(H=4, H_k=4, H_v=2), _rspec(H=8, H_k=1, D=192, D_v=128, mask="causal-br"),
    _rspec(H=16, H_k=2, D=256, mask="causal-br", layout="htd"),
)
RAGGED_CATALOG += (
    CatalogEntry("SHP-RAGGED-HEAD-TIERS",
                 "the padded plan's other head-dim tiers (32, 96, 160, 192, a 59 tail, 128/64, 64/128, 256/128) "
                 "and group ratios (4, 6, 9, H_k < H_v, H_k > H_v, MQA 8/1 with MLA dims, 16/2 at D256) on packed batches",
                 _TIER_SPECS, level="pr"),
)

_SEED_001 = "ROCm/rocm-libraries#15045 (AICK-3016): THD token base unbounded"
RAGGED_REGRESSIONS = (
    Regression("REG-RAGGED-BASE-AT-END", "a sequence whose token base is the storage's end (cu[b] = T)",
               _SEED_001,
               (_rspec(lengths=Offsets((0, 40, 64, 64, 64), (0, 48, 80, 80, 80))),
                _rspec(lengths=Offsets((0, 40, 64, 64, 64), (0, 48, 80, 80, 80)), layout="thd-offset24",
                       mask="causal-br"))),
    Regression("REG-RAGGED-LAST-ENDS-AT-T", "the last sequence ends exactly at T, on a partial tile",
               _SEED_001,
               (_rspec(lengths=Lengths((40, 63), (64, 65))),
                _rspec(lengths=Lengths((40, 63), (64, 65)), layout="htd", mask="causal-br"))),
    Regression("REG-RAGGED-ZERO-LAST", "a zero-length last sequence: both sides, q only, kv only",
               _SEED_001,
               (_rspec(lengths=Lengths((30, 45, 0), (50, 27, 0))),
                _rspec(lengths=Lengths((30, 45, 0), (50, 27, 20))),
                _rspec(lengths=Lengths((30, 45, 20), (50, 27, 0)), mask="causal-br"))),
)

# Device probes are run: an engine without the token-base bound reads and writes every row
# a bad sequence claims, so each is sized (H <= 2, D = 16) for those rows to stay within the
# harness's guard band (validate.GUARD_ELEMS; the generator checks every probe's reach).
_DEV = dict(H=1, D=16)
RAGGED_PROBES = (
    Probe("PRB-RAGGED-OFFSETS-DECREASE", "cu_seqlens_q not monotonic", "frontend", "ragged-offsets-decrease",
          _rspec(lengths=Offsets((0, 40, 20, 64), (0, 30, 50, 64)))),
    Probe("PRB-RAGGED-NEGATIVE-OFFSET", "cu_seqlens_kv[0] < 0", "frontend", "ragged-negative-offset",
          _rspec(lengths=Offsets((0, 30, 64), (-8, 30, 64), T_kv=64))),
    Probe("PRB-RAGGED-PAST-STORAGE", "cu_seqlens_q[B] past the q storage", "frontend",
          "ragged-offset-past-storage", _rspec(lengths=Offsets((0, 30, 70), (0, 30, 64), T_q=64))),
    Probe("PRB-RAGGED-LENGTH-OVER-MAX", "a query sequence longer than max_seqlen_q", "frontend",
          "ragged-length-over-max", _rspec(lengths=Offsets((0, 40, 64), max_q=32))),
    Probe("PRB-RAGGED-OFFSETS-COUNT", "cu_seqlens_kv with fewer entries than cu_seqlens_q", "frontend",
          "ragged-offsets-count", _rspec(lengths=Offsets((0, 30, 64), (0, 64)))),
    # seed 001: a negative token base (q side, GQA), a sequence based at T running past it
    Probe("PRB-RAGGED-DEVICE-NEGATIVE-Q", "q side: the first sequence starts 12 rows before the storage",
          "device", "ragged-negative-offset",
          _rspec(H=2, H_k=1, D=16, lengths=Offsets((-12, 20, 40), (0, 24, 48)))),
    Probe("PRB-RAGGED-DEVICE-NEGATIVE-KV", "kv side: the first sequence starts 16 rows before the storage",
          "device", "ragged-negative-offset",
          _rspec(**_DEV, lengths=Offsets((0, 24, 40), (-16, 16, 48)), layout="thd-offset24")),
    Probe("PRB-RAGGED-DEVICE-PAST-Q", "q side: a sequence based at T claims 20 rows past the storage",
          "device", "ragged-offset-past-storage",
          _rspec(**_DEV, lengths=Offsets((0, 24, 40, 60), (0, 30, 50, 64), T_q=40), mask="causal-br")),
    Probe("PRB-RAGGED-DEVICE-PAST-KV", "kv side: the last sequence ends 10 rows past the storage",
          "device", "ragged-offset-past-storage",
          _rspec(**_DEV, lengths=Offsets((0, 20, 36), (0, 30, 58), T_kv=48))),
    Probe("PRB-RAGGED-DEVICE-DECREASE-Q", "q side: offsets go back (lengths 16, -8, 8, 24)",
          "device", "ragged-offsets-decrease",
          _rspec(**_DEV, lengths=Offsets((0, 16, 8, 16, 40), (0, 10, 20, 30, 40)))),
    Probe("PRB-RAGGED-DEVICE-OVER-MAX-KV", "kv side: a sequence of 36 keys with max_seqlen_kv 24",
          "device", "ragged-length-over-max",
          _rspec(**_DEV, lengths=Offsets((0, 20, 40), (0, 24, 60), max_kv=24))),
    # padded varlen: used lengths the frontend sees, then ones only device code sees (a
    # used length past its range reads the next sequence's rows, or past the storage); one
    # device probe per rule at quick (the CPU budget), the others at pr
    Probe("PRB-RAGGED-SEQUSED-COUNT", "seqused_kv with one length for two sequences", "frontend",
          "ragged-seqused-count", _rspec(lengths=Offsets((0, 30, 64), used_kv=(20,)))),
    Probe("PRB-RAGGED-SEQUSED-NEGATIVE", "seqused_q[1] < 0", "frontend", "ragged-seqused-negative",
          _rspec(lengths=Offsets((0, 30, 64), used_q=(30, -4)))),
    Probe("PRB-RAGGED-SEQUSED-PAST-RANGE", "seqused_kv[0] past its sequence's range", "frontend",
          "ragged-seqused-past-range", _rspec(lengths=Offsets((0, 30, 64), used_kv=(36, 20)))),
    Probe("PRB-RAGGED-DEVICE-SEQUSED-INTO-NEXT-Q", "q side: the first sequence claims 12 rows of the next one",
          "device", "ragged-seqused-past-range",
          _rspec(**_DEV, lengths=Offsets((0, 16, 40), (0, 24, 48), used_q=(28, 20), used_kv=(20, 24), max_q=28)),
          level="pr"),
    Probe("PRB-RAGGED-DEVICE-SEQUSED-PAST-Q-END", "q side: the last sequence's used length runs 6 rows past "
          "the storage", "device", "ragged-seqused-past-range",
          _rspec(**_DEV, lengths=Offsets((0, 16, 40), (0, 24, 48), used_q=(16, 30), max_q=30))),
    Probe("PRB-RAGGED-DEVICE-SEQUSED-PAST-KV-END", "kv side: the last sequence's used length runs 10 rows "
          "past the storage", "device", "ragged-seqused-past-range",
          _rspec(**_DEV, lengths=Offsets((0, 20, 36), (0, 30, 48), used_kv=(30, 28), max_kv=40)), level="pr"),
    Probe("PRB-RAGGED-DEVICE-SEQUSED-NEGATIVE-KV", "kv side: a used length of -8", "device",
          "ragged-seqused-negative",
          _rspec(**_DEV, lengths=Offsets((0, 20, 36), (0, 30, 48), used_kv=(-8, 14)))),
)

RAGGED_MODIFIER_CATALOG = (
    CatalogEntry("SHP-RAGGED-MODIFIERS-ALL", "every modifier at once per sequence: a batch-broadcast bias "
                 "and its dBias, sinks, softcap, [B, H_q] ALiBi slopes, GQA 4/1, causal-br; sinks over "
                 "sequences with no keys",
                 (_rspec(H=4, H_k=1, mask="causal-br", bias="batch", dbias="on", sinks="on", softcap="cap5",
                         alibi_slopes="batch"),
                  _rspec(lengths=RAGGED_LENGTHS["zero-kv"], sinks="on", alibi_slopes="head")), level="pr"),
)
RAGGED_MODIFIER_PROBES = (
    Probe("PRB-RAGGED-BIAS-DIMS", "a ragged bias whose S_q axis is not max_seqlen_q", "frontend",
          "bias-dims-mismatch", _rspec(bias="full", mutations=(dims("bias", 2, 41),))),
    Probe("PRB-RAGGED-ALIBI-SLOPES-DIMS", "ragged alibi_slopes [B + 1, H_q]", "frontend",
          "alibi-slopes-dims-mismatch", _rspec(alibi_slopes="batch", mutations=(dims("alibi_slopes", 0, 5),))),
)

RAGGED = Space(
    RAGGED_STORAGE, axes=RAGGED_AXES, rules=RAGGED_RULES, lengths=RAGGED_LENGTHS, storages=RAGGED_STORAGES,
    modifiers=RAGGED_MODIFIER_SETS,
    seqused=RAGGED_SEQUSED,
    value_suite_item="RAGGED-AXIS-VALUES",
    pair_suites=(
        PairSuite("RAGGED-PAIR-CORE", "every legal pair of ragged core-axis values", "ragged-pairs-core", "core", "pr"),
        PairSuite("RAGGED-PAIR-ALL", "every legal pair of values of all ragged axes", "ragged-pairs-all", "all",
                  "nightly"),
    ),
    catalog=RAGGED_CATALOG + RAGGED_MODIFIER_CATALOG, regressions=RAGGED_REGRESSIONS,
    probes=RAGGED_PROBES + RAGGED_MODIFIER_PROBES,
)

# ============================================================================ risk interactions
# Held-out backward defects (public reports against FlashAttention, PyTorch, cuDNN,
# TransformerEngine, aiter, CK, vLLM) need a *combination* of conditions: a data
# distribution and a mask and a tile tail; an output layout and a head-dim tail. The risky
# values of each axis below, and every legal triple of them (generator/risks.py) by nightly.
# Ranks: 1 where such a report's smallest reproducer needed the value (extreme LSE or a
# large gradient, a band/window or bottom-right mask, S_kv on a half tile, a D % 16 or
# D % 32 tail, a non-power-of-two GQA ratio, a packed or heads-interleaved layout, fp16,
# B >= 2 reductions, sinks), 2 a neighbour of the same class (the other alignment, the
# other tail side), 3 the class's further values. The rank-1 triples are due at pr, the
# cheapest rows holding them at quick.
_RISKY_DISTRIBUTIONS = {"shifted-logits": 1, "l2-grad": 1, "large-do": 1, "overflow-dp": 2}
RISKS = RiskPlan(
    "RISK-TRIPLES", "every legal triple of risky values of three axes",
    values={
        "dtype": {"fp16": 1, "fp32": 2},
        "heads": {"gqa3": 1, "gqa4": 2, "mqa": 2, "hk2-hv1": 3, "mqa7": 3},
        "seq": {"lt-64-192": 1, "gt-129-64": 1, "lt-1-128": 1, "lt-17-129": 2, "eq-65": 2, "gt-192-64": 2,
                "lt-16-65": 3, "eq-129": 3, "gt-65-16": 3, "lt-32-400": 3, "gt-217-128": 3},
        "head_dims": {"d40": 1, "d48": 1, "d72": 2, "d80": 2, "d144": 3, "d59": 3, "d111": 3},
        "mask": {"band-br": 1, "window-br": 1, "causal-br": 1, "band-tl": 2, "window-tl": 2,
                 "strict-causal-br": 2, "left-only-br": 3, "right-only-br": 3},
        # layouts that are never another's memory (BSHD at B = 1 is SBHD's: the storage
        # orders' B >= 2 cases are the layout-distinct proof's, SHP-LAYOUT-DISTINCT)
        "layout": {"qkv-interleaved": 1, "kv-packed": 1, "odd-pitch": 2, "mixed": 3},
        "distribution": {d: rank for d, rank in _RISKY_DISTRIBUTIONS.items() if d in DISTRIBUTIONS},
        "batch": {"b2": 1, "b3": 2},
        "sinks": {"on": 1},
        "dbias": {"on": 2},
        # the newest features (pass 3) and the modifiers they meet: modifiers x masks x
        # alignment (ALiBi slopes, softcap, an ALiBi bias with bottom-right masks and S_q !=
        # S_kv), dropout form x heads x mask (a batch-only mask broadcast, a drawn mask)
        "softcap": {"cap5": 1},
        "bias": {"alibi": 2, "batch": 3},
        "alibi_slopes": {"batch": 1, "head": 2},
        "dropout_form": {"p0.5-batch": 1, "p0.5-drawn": 2, "p0.1": 3},
    },
    ranking="1: a value a public report's smallest reproducer needed; 2: its neighbour in the same "
            "class (other alignment or tail side); 3: the class's further values",
    top_rank=1, every_by="nightly", top_by="pr", sample_at="quick", sample=6)

# ============================================================================ focused pairs
# Every port form (docs/CONTRACTS.md: the bias's broadcasts and ALiBi values, the dropout
# mask's forms, the ALiBi slopes' two forms, sinks, dBias; packed and broadcast storages) meets
# the other axes' risky values by pr: GQA / MQA and head counts that are not powers of two,
# each head-dim tier, fp16 and fp32, bottom-right masks with S_q != S_kv. The contract's
# vocabulary is checked against these subjects (tests/test_port_forms.py).
_RISKY_HEADS = ("gqa3", "gqa4", "mqa", "mqa5", "mqa7", "hk2-hv1", "hk1-hv2")
_RISKY_TIERS = ("d40", "d128", "d192-128", "d256")
_RISKY_MASKS = ("causal-br", "band-br", "window-br", "strict-causal-br")
_UNEQUAL_SEQS = ("lt-17-129", "gt-129-64")
_NEW_DROPOUT_FORMS = tuple(n for n in DROPOUT_FORMS if n != "off")
PORT_FORM_FOCUS = FocusPairs(
    "FOCUS-PORT-FORMS", "every port form with every risky value of the other axes", PADDED_STORAGE,
    subjects={"bias": tuple(n for n in BIASES if n != "none"), "dbias": ("on",), "sinks": ("on",),
              "alibi_slopes": ("head", "batch"), "dropout_form": _NEW_DROPOUT_FORMS,
              "layout": ("qkv-interleaved", "kv-packed", "bcast-kv-batch", "bcast-kv-head", "bcast-all-batch")},
    partners={"heads": _RISKY_HEADS, "head_dims": _RISKY_TIERS, "dtype": ("fp16", "fp32"), "mask": _RISKY_MASKS,
              "seq": _UNEQUAL_SEQS, "batch": ("b2",)},
    level="pr")
RAGGED_PORT_FORM_FOCUS = FocusPairs(
    "FOCUS-RAGGED-PORT-FORMS", "every ragged port form (storages, used lengths, modifiers, dropout forms) "
    "with every risky value of the other ragged axes", RAGGED_STORAGE,
    subjects={"storage": ("htd", "qkv-packed", "kv-packed", "thd-offset24", "spare-rows", "stats-th"),
              "seqused": ("kv", "both", "q"), "modifiers": tuple(n for n in RAGGED_MODIFIER_SETS if n != "none"),
              "dropout_form": _NEW_DROPOUT_FORMS},
    partners={"heads": ("mqa", "gqa2", "gqa3", "hk2-hv1", "mha3"), "head_dims": ("d128", "d192-128", "d256"),
              "dtype": ("fp16", "fp32"), "mask": ("causal-br", "band-br", "window-br"),
              "lengths": ("zero-kv", "q-longer", "tile-tails", "equal")},
    level="pr")
# The newest values (the last two passes of each space) with each other and with the core
# axes' risky values at quick, on small graphs: a bug in one new feature that shows only
# beside another, or beside GQA, a D % 16 tail, fp16 or a bottom-right mask, is caught on the CPU.
_QUICK_LEFT_OUT = {
    "deterministic=on": "priced at its 50 re-runs on the cpu class: its pairs are pr's (PAIR-CORE)",
    "heads=mqa24": "24 query heads cost the quick CPU budget a case per pair: its pairs are pr's",
    "head_dims=d256-128": "D 256 costs the quick CPU budget a case per pair: its pairs are pr's",
}
NEWEST_QUICK_FOCUS = FocusPairs(
    "FOCUS-NEWEST-QUICK", "the newest values (passes 2 and 3) pairwise with each other and with the core "
    "axes' risky values, at quick", PADDED_STORAGE,
    subjects={"dtype": ("fp32",), "alibi_slopes": ("head", "batch"), "dropout_form": _NEW_DROPOUT_FORMS,
              "distribution": ("l2-grad", "large-do", "overflow-dp")},
    partners={"heads": ("gqa3", "mqa"), "head_dims": ("d40", "d48"), "dtype": ("fp16",),
              "mask": ("causal-br", "band-br"), "seq": ("lt-17-129", "gt-65-16"), "bias": ("alibi", "head"),
              "softcap": ("cap5",), "sinks": ("on",), "batch": ("b2",)},
    level="quick", left_out=_QUICK_LEFT_OUT)
# a ragged row holds one modifiers value and one dropout form: every pair of the two would be
# 63 rows (~0.24 s each on the cpu class), past quick's CPU budget; quick keeps one value of
# each kind (sinks, a batch-broadcast bias with dBias, [B, H_q] slopes, a head-broadcast bias;
# a full mask, a batch-only broadcast, a drawn mask), the others pair by pr
_RAGGED_QUICK_MODIFIERS = ("sinks", "bias-batch-dbias", "alibi-slopes-batch", "bias-head")
_RAGGED_QUICK_DROPOUT_FORMS = ("p0.1", "p0.5-batch", "p0.5-drawn")
_RAGGED_QUICK_WHY = ("one ragged row per modifiers x dropout-form pair is past quick's CPU budget: its pairs are "
                     "pr's (RAGGED-PAIR-CORE, FOCUS-RAGGED-PORT-FORMS)")
RAGGED_NEWEST_QUICK_FOCUS = FocusPairs(
    "FOCUS-RAGGED-NEWEST-QUICK", "the newest ragged values (passes 2 and 3) pairwise with each other and "
    "with the core axes' risky values, at quick", RAGGED_STORAGE,
    subjects={"dtype": ("fp32",), "heads": RAGGED_LATER_HEADS + tuple(RAGGED_ONLY_HEADS), "storage": RAGGED_PACKED_STORAGES,
              "modifiers": _RAGGED_QUICK_MODIFIERS, "seqused": ("kv", "both", "q"),
              "dropout_form": _RAGGED_QUICK_DROPOUT_FORMS},
    # short lengths among the partners keep the rows small (decode, a leading empty sequence, length 1)
    partners={"heads": ("mqa",), "dtype": ("fp16",), "mask": ("causal-br",),
              "lengths": ("q-longer", "zero-kv", "decode", "zero-first", "len-1")},
    level="quick", left_out={
        "head_dims=d256": "D 256 costs the quick CPU budget a case per pair: its pairs are pr's",
        **{f"modifiers={m}": _RAGGED_QUICK_WHY for m in RAGGED_MODIFIER_SETS
           if m != "none" and m not in _RAGGED_QUICK_MODIFIERS},
        **{f"dropout_form={d}": _RAGGED_QUICK_WHY for d in _NEW_DROPOUT_FORMS if d not in _RAGGED_QUICK_DROPOUT_FORMS}})
PORT_FORMS_LEFT_OUT = {
    "padded sinks: without dsinks": "a frozen sink differs from a trained one only in an output left unwritten: "
                                    "SHP-SINKS-FROZEN holds it at pr, GQA with two KV heads",
    "ragged sinks: without dsinks": "as the padded one: a frozen sink is the same graph without its dsinks "
                                    "output (SHP-SINKS-FROZEN)",
    "ragged bias values: alibi": "ALiBi on ragged batches is the alibi_slopes port's (each sequence's own "
                                 "diagonal, modifiers alibi-slopes*): a padded bias of ALiBi values has no "
                                 "per-sequence diagonal to hold",
}
FOCUS = (PORT_FORM_FOCUS, RAGGED_PORT_FORM_FOCUS, NEWEST_QUICK_FOCUS, RAGGED_NEWEST_QUICK_FOCUS)

# ============================================================================ gated
GATED = (
    Gated("GATE-PAGED-KV", "paged K/V with a block table (incl. bad block-table probes)",
          "waiting on paged K/V storage in materialize", 6),
)

# ============================================================================ levels
MiB = 1 << 20
GiB = 1 << 30
# quick holds the deterministic backward (three cases, each priced at its 50 runs:
# bundlegen.cost), the gradient distributions, fp16, the risk triples' first sample, and
# each ragged value once: score modifiers, ALiBi slopes, used lengths, packed buffers
CPU_QUICK_BUDGET_S = 100.0
#: the ragged space's most of quick's CPU budget: it carries most of the newest values
#: crossed at quick (packed varlen storages, used lengths, ragged modifiers, dropout forms,
#: fp32), each ragged case priced with its sequences' programs
RAGGED_QUICK_CPU_SHARE = 0.4
LEVELS = (
    # quick's CPU budget: every axis value (the peers' head dims, layouts and ratios among
    # them), every boundary class and the ragged space once, through the Triton interpreter
    # on a 2-core CPU in under two minutes (CPU_QUICK_BUDGET_S), one worker per core as the
    # main job and the CPU lanes run it
    Level("quick", per_case_seconds=0.25, per_case_bytes=16 * MiB, budget_seconds=20.0,
          per_case_cpu_seconds=10.0, cpu_budget_seconds=CPU_QUICK_BUDGET_S, cpu_workers=2, pair_scope="values"),
    Level("pr", per_case_seconds=1.0, per_case_bytes=256 * MiB, budget_seconds=120.0, pair_scope="core"),
    Level("nightly", per_case_seconds=10.0, per_case_bytes=8 * GiB, budget_seconds=900.0, pair_scope="all"),
    Level("full", per_case_seconds=120.0, per_case_bytes=64 * GiB, budget_seconds=3600.0, pair_scope="all"),
)

# ============================================================================ cost model
# per case and phase (bundlegen/cost.py): materialize = io bytes / rate + fixed; oracle =
# oracle FLOPs / rate + fixed; engine = FLOPs / rate + tile pairs x tile_s + launches x
# launch_s; check = re-runs x (engine + rerun_s) + io bytes per run / rate + fixed; plus the
# worker's round trip (overhead_s). One class per device and, where an engine costs
# otherwise, per engine on it ("h200/torch-cudnn"); the runs are the engine's own
# (Engine.determinism_runs: 1 and 2 in the Triton interpreter, 2 and 3 for a CPU engine, 2
# and 50 on a GPU; 1 for an engine that is not deterministic).
# h200 and h200/<engine>: `bundlegen calibrate --device-class CLASS --write` on the two runs
# of all four levels per engine in evidence/h200/ (each case at its least over the runs).
# cpu: the Triton interpreter, and cpu/torch-math: rates from the main job's run before the
# phases were modelled (34.9 s then on an idle 2-core machine); recalibrate both from an idle
# run (`bundlegen calibrate out/triton-quick --device-class cpu --write`).
COST_MODEL = {
    "h200": CostCoefficients(engine_flops_per_s=31.8e12, oracle_flops_per_s=9.95e12,
                             bytes_per_s=984e9, overhead_s=0.00227,
                             run_start_s=65.3,
                             materialize_s=0.00274, oracle_s=0.003, tile_s=0.0,
                             launch_s=721e-6, check_bytes_per_s=1e12, rerun_s=839e-6,
                             check_s=0.00322, ordinary_runs=2, requested_runs=50,
                             program_s=0.0,
                             drawn_bytes_per_s=1.44e9, dbias_tile_s=0.0, deterministic_s=0.00222,
                             drawn_tile_s=228e-6),
    "cpu": CostCoefficients(engine_flops_per_s=5e9, oracle_flops_per_s=21.3e9,
                            bytes_per_s=769e6, overhead_s=0.00153,
                            run_start_s=4.2, ordinary_runs=1, requested_runs=2,
                            materialize_s=0.00123, oracle_s=0.00288, tile_s=0.00186,
                            launch_s=0.0, program_s=0.0117, check_bytes_per_s=88.1e6,
                            rerun_s=0.0144, check_s=882e-6,
                            drawn_bytes_per_s=14e9, dbias_tile_s=0.0197, deterministic_s=0.0338,
                            drawn_tile_s=0.0172),
    "cpu/torch-math": CostCoefficients(engine_flops_per_s=27.1e9, oracle_flops_per_s=13.3e9,
                                       bytes_per_s=3.19e9, overhead_s=0.00186,
                                       run_start_s=1.88, ordinary_runs=2, requested_runs=3,
                                       materialize_s=0.00118, oracle_s=0.00412, tile_s=0.0,
                                       launch_s=472e-6, program_s=9.29e-6, check_bytes_per_s=111e6,
                                       rerun_s=634e-6, check_s=0.00138,
                                       drawn_bytes_per_s=339e6, dbias_tile_s=0.0, deterministic_s=0.0,
                                       drawn_tile_s=0.0),
    "h200/torch-flash": CostCoefficients(engine_flops_per_s=226e12, oracle_flops_per_s=20.8e12,
                                         bytes_per_s=1.48e12, overhead_s=0.00179,
                                         run_start_s=3.9, ordinary_runs=1,
                                         materialize_s=0.00308, oracle_s=0.00137, tile_s=0.0,
                                         launch_s=274e-6, check_bytes_per_s=442e9, rerun_s=0.00295,
                                         check_s=0.00267, requested_runs=50,
                                         program_s=0.0,
                                         drawn_bytes_per_s=1.62e9, dbias_tile_s=0.0, deterministic_s=0.0016,
                                         drawn_tile_s=144e-6),
    "h200/torch-efficient": CostCoefficients(engine_flops_per_s=143e12, oracle_flops_per_s=21.3e12,
                                             bytes_per_s=1.37e12, overhead_s=0.00158,
                                             run_start_s=4.4, ordinary_runs=1,
                                             materialize_s=0.00281, oracle_s=0.00148, tile_s=144e-12,
                                             launch_s=278e-6, check_bytes_per_s=525e9, rerun_s=0.00194,
                                             check_s=0.00256, requested_runs=50,
                                             program_s=766e-9,
                                             drawn_bytes_per_s=1.56e9, dbias_tile_s=0.0, deterministic_s=0.0297,
                                             drawn_tile_s=96.9e-6),
    "h200/torch-cudnn": CostCoefficients(engine_flops_per_s=115e12, oracle_flops_per_s=21.5e12,
                                         bytes_per_s=2.06e12, overhead_s=0.00124,
                                         run_start_s=3.59, ordinary_runs=1,
                                         materialize_s=0.00171, oracle_s=0.00175, tile_s=0.0,
                                         launch_s=0.0144, check_bytes_per_s=686e9, rerun_s=0.0,
                                         check_s=0.00227, requested_runs=50,
                                         program_s=7.34e-6,
                                         drawn_bytes_per_s=1.65e9, dbias_tile_s=0.0, deterministic_s=0.0,
                                         drawn_tile_s=0.0),
    "h200/torch-math": CostCoefficients(bytes_per_s=89.7e9, materialize_s=0.00378, oracle_flops_per_s=15.3e12,
                                        oracle_s=0.00159, engine_flops_per_s=12.1e12, tile_s=0.0,
                                        launch_s=684e-6, check_bytes_per_s=312e9, rerun_s=0.00364,
                                        check_s=0.0015, overhead_s=0.00143, run_start_s=3.11,
                                        ordinary_runs=2, requested_runs=50,
                                        program_s=2.26e-6,
                                        drawn_bytes_per_s=1.39e9, dbias_tile_s=0.0, deterministic_s=818e-6,
                                        drawn_tile_s=0.0),
}
# what each class's last calibration measured, per level (written by calibrate --write)
COST_MEASURED = {
    "h200": Measured(
        "evidence/h200/triton-full-1.results.jsonl.gz evidence/h200/triton-full-2.results.jsonl.gz",
        (("quick", 351, 5.2, 5.26),
         ("pr", 1772, 44.12, 44),
         ("nightly", 2412, 53.28, 52.52),
         ("full", 85, 3.13, 3.57))),
    "h200/torch-math": Measured(
        "evidence/h200/torch-math-full-1.results.jsonl.gz evidence/h200/torch-math-full-2.results.jsonl.gz",
        (("quick", 351, 5.86, 5.57),
         ("pr", 1770, 54.36, 55.99),
         ("nightly", 2413, 62.48, 61.64),
         ("full", 85, 3.52, 3.82))),
    "h200/torch-flash": Measured(
        "evidence/h200/torch-flash-full-1.results.jsonl.gz evidence/h200/torch-flash-full-2.results.jsonl.gz",
        (("quick", 249, 2.52, 2.22),
         ("pr", 487, 10.17, 10.88),
         ("nightly", 326, 6.2, 5.11),
         ("full", 20, 1.12, 1.04))),
    "h200/torch-efficient": Measured(
        "evidence/h200/torch-efficient-full-1.results.jsonl.gz evidence/h200/torch-efficient-full-2.results.jsonl.gz",
        (("quick", 243, 2.12, 2.04),
         ("pr", 247, 6.36, 4.87),
         ("nightly", 308, 4.76, 4.32),
         ("full", 5, 0.65, 0.63))),
    "h200/torch-cudnn": Measured(
        "evidence/h200/torch-cudnn-full-1.results.jsonl.gz evidence/h200/torch-cudnn-full-2.results.jsonl.gz",
        (("quick", 185, 5.14, 5.92),
         ("pr", 506, 29.04, 25.77),
         ("nightly", 273, 13.22, 14.49),
         ("full", 20, 1.94, 1.96))),
    "cpu": Measured(
        "out/cal-cpu-1 out/cal-cpu-2 out/cal-cpu-drawn",
        (("quick", 352, 69.22, 70.22),
         ("pr", 4, 6.5, 4.2))),
    "cpu/torch-math": Measured(
        "out/cal-tm",
        (("quick", 351, 5.55, 5.51),)),
}
CPU_CASE_LIMIT_S = 30.0     # the harness skips a case on CPU when predict(graph, "cpu") exceeds it

# ============================================================================ tolerance
# |out - ref| <= atol + rtol * mag (docs/CONTRACTS.md). rtol = unit roundoff x a factor
# that grows with the longest reduction; every number is derived in this block, and
# `bundlegen generate` writes them to the tolerance TOML the harness reads them from.
UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "fp32": 2.0 ** -24}
REDUCTION_BUCKETS = (          # (longest reduction up to, class suffix, rtol factor)
    (256, "r256", 8),
    (1024, "r1k", 10),
    (4096, "r4k", 12),
    (16384, "r16k", 16),
    (262144, "r256k", 24),
)
ATOL = 1e-5
MIN_CLAIM_MARGIN = 1.5
# The statistical judge (docs/CONTRACTS.md, "Statistical judge"): per slice, the engine's
# relative RMS and max |error| within k x the io-precision reference's, plus
# STATISTICAL_FLOOR_ULPS ulps of the io dtype (relative to the slice's scale: one ulp, a
# kernel whose last fp32 bits differ from the reference's may round an element of the
# slice's largest magnitude one step the other way, where the reference's own error is zero:
# a key only one query attends with P = 1, seen on the Triton interpreter). In bf16 and fp16 the rounding of the output to the io dtype
# dominates both errors, and correct kernels (flash, efficient, cuDNN, triton, the math
# backward) stay within 3x the reference's (docs/PERFORMANCE.md, "Statistical margins"), so
# k = 4. In fp32 the accumulation order dominates, which differs from kernel to kernel
# (up to 5.5x seen), so k = 16: still a thousandth of a TF32 product's or a 0.05 % scale
# error's ratio.
STATISTICAL_K = {"bf16": 4.0, "fp16": 4.0, "fp32": 16.0}
STATISTICAL_FLOOR_ULPS = 1.0
# fp32 io: the scores s = scale * Q K^T are formed in fp32 like the inputs, and exp(s - LSE)
# turns their absolute rounding into a relative error of P, dS and every gradient. |s| and
# |LSE| each reach about 128 under shifted-logits (harness/distributions.py, SHIFTED_LOGIT
# 110, plus log S_kv), each rounded to fp32 (u * 128), so an fp32 class adds
# u * SCORE_MAGNITUDE (both roundings) to u * factor. Under bf16 / fp16 io the same term
# (2^-24 * 256, scores in fp32) is below a thousandth of u * factor: left out.
SCORE_MAGNITUDE = 256
SCORE_ROUNDED_IN_IO = ("fp32",)


def _rtol(dt: str, factor: int) -> float:
    return UNIT_ROUNDOFF[dt] * (factor + (SCORE_MAGNITUDE if dt in SCORE_ROUNDED_IN_IO else 0))


def _score_words(dt: str) -> str:
    """The derivation's words for the score term of a dtype whose scores round in io."""
    if dt not in SCORE_ROUNDED_IN_IO:
        return ""
    return (f" plus {SCORE_MAGNITUDE} x the unit roundoff for the scores: formed in {dt} like the "
            f"inputs, |s| and |LSE| each reach about 128 under shifted logits, and exp(s - LSE) turns "
            f"their rounding into a relative error of P, dS and every gradient")


def _tolerance_class(dt: str, low: int, limit: int, suffix: str, factor: int) -> Tolerance:
    """One class, with the words the tolerance TOML shows a reviewer."""
    factors = ", ".join(f"{f} up to {n}" for n, _s, f in REDUCTION_BUCKETS)
    return Tolerance(
        _rtol(dt, factor), ATOL, name=f"{dt}-{suffix}", dtype=dt, max_reduction=limit,
        k=STATISTICAL_K[dt], floor=STATISTICAL_FLOOR_ULPS * 2 * UNIT_ROUNDOFF[dt],
        covers=f"{dt} io graphs whose longest reduction (longest_reduction: the most terms summed into "
               f"one gradient element, over keys, a GQA group's query rows, head dims, the batches and "
               f"heads a dBias sums, a head's query rows for dSinks) is {low} to {limit} terms",
        derivation=f"rtol = unit roundoff of {dt} (2^{math.log2(UNIT_ROUNDOFF[dt]):.0f}) x {factor}, the "
                   f"factor of this reduction bucket (factors grow with the longest reduction: {factors} "
                   f"terms){_score_words(dt)}; atol = {ATOL:g} bounds the elements whose magnitude is zero (rows with no "
                   f"kept key); k = {STATISTICAL_K[dt]:g} x the io-precision reference's error (the plan's "
                   f"STATISTICAL_K: the output's rounding to {dt} dominates an honest error in bf16 and fp16, the "
                   f"accumulation order in fp32); floor = {STATISTICAL_FLOOR_ULPS:g} ulp of {dt} "
                   f"(2^{math.log2(2 * UNIT_ROUNDOFF[dt]):.0f}), relative to the slice's scale")


TOLERANCE_CLASSES = {
    f"{dt}-{suffix}": _tolerance_class(dt, low + 1, limit, suffix, factor)
    for dt in UNIT_ROUNDOFF
    for (low, _s, _f), (limit, suffix, factor) in zip(((0, "", 0),) + REDUCTION_BUCKETS, REDUCTION_BUCKETS)
}


def tolerance_class_for(graph) -> str:
    if graph.dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"no tolerance class for dtype {graph.dtype!r}")
    return class_for(graph, TOLERANCE_CLASSES)    # the rule the bundle loader applies again


PADDED = Space(
    PADDED_STORAGE, axes=AXES, rules=RULES, value_suite_item=VALUE_SUITE_ITEM, pair_suites=PAIR_SUITES,
    catalog=CATALOG + GAP_CATALOG + MODIFIER_CATALOG + FP32_CATALOG + DROPOUT_CATALOG + ALIBI_SLOPES_CATALOG,
    sweeps=SWEEPS, regressions=REGRESSIONS + GAP_REGRESSIONS,
    probes=PROBES + PROBE_ARMS + MODIFIER_PROBES + DROPOUT_PROBES + ALIBI_SLOPES_PROBES,
)

PLAN = Plan(
    name=PLAN_NAME, padded=PADDED, heads={**HEADS, **RAGGED_ONLY_HEADS}, seqs=SEQS, head_dims=HEAD_DIMS,
    batches=BATCHES, layouts=LAYOUTS, stats_layouts=STATS_LAYOUTS, masks=MASKS, scales=SCALES,
    distributions=DISTRIBUTIONS, dtypes=IO_DTYPES, gated=GATED,
    levels=LEVELS, cost_model=COST_MODEL, cost_measured=COST_MEASURED,
    tolerance_classes=TOLERANCE_CLASSES, tolerance_rule=tolerance_class_for,
    min_claim_margin=MIN_CLAIM_MARGIN, cpu_case_limit_s=CPU_CASE_LIMIT_S, ragged=RAGGED,
    peers=PEERS,
    boundaries=BOUNDARIES,
    biases=BIASES, switches=SWITCHES, softcaps=SOFTCAPS, dropouts=DROPOUTS, dropout_masks=DROPOUT_MASKS,
    alibi_slopes=ALIBI_SLOPES, dropout_forms=DROPOUT_FORMS, risks=RISKS, focus=FOCUS,
    port_forms_left_out=PORT_FORMS_LEFT_OUT, distinct_layouts_by="pr",
)
