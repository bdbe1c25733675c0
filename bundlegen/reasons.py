"""Every rejection and decline reason code, in one place.

Frontend codes are returned by :func:`bundlegen.validate.frontend_reason` for graphs that
are not well formed; probes name them in ``expected_rejection``. Engine codes are what an
engine's ``is_applicable`` returns for a well-formed graph it cannot serve.
"""

# --- frontend: the graph itself is invalid -------------------------------------------
MISSING_TENSOR = "missing-tensor"
BAD_RANK = "bad-rank"
STRIDE_COUNT = "stride-count"
NONPOSITIVE_DIM = "nonpositive-dim"
NEGATIVE_STRIDE = "negative-stride"
NEGATIVE_OFFSET = "negative-offset"
UNKNOWN_DTYPE = "unknown-dtype"
DTYPE_MISMATCH = "dtype-mismatch"            # O/dO/K/V/dQ/dK/dV dtype != Q dtype
STATS_DTYPE = "stats-dtype"                  # stats must be fp32
BATCH_MISMATCH = "batch-mismatch"            # K/V batch != Q batch
O_DIMS_MISMATCH = "o-dims-mismatch"          # O, dO, dQ dims != Q's (D_v for O/dO)
KV_DIMS_MISMATCH = "kv-dims-mismatch"        # V, dK, dV dims != K's (D_v for V/dV)
STATS_DIMS_MISMATCH = "stats-dims-mismatch"  # stats dims != [B, H_q, S_q, 1]
GQA_NOT_DIVISIBLE = "gqa-not-divisible"      # H_k or H_v does not divide H_q
RIGHT_BOUND_BELOW_MINUS_ONE = "right-bound-below-minus-one"
LEFT_BOUND_NONPOSITIVE = "left-bound-nonpositive"
BAD_ALIGNMENT = "bad-alignment"
SCALE_NONPOSITIVE = "scale-nonpositive"
SCALE_NONFINITE = "scale-nonfinite"
SPAN_OVERFLOW = "span-overflow"                # a dim, stride, offset or addressed span past MAX_SPAN
# ragged graphs (DESIGN section 10)
RAGGED_OFFSETS_COUNT = "ragged-offsets-count"            # cu_seqlens not [B+1] for one B >= 1 on both sides
RAGGED_MAX_SEQLEN_NEGATIVE = "ragged-max-seqlen-negative"
RAGGED_NEGATIVE_OFFSET = "ragged-negative-offset"        # cu_seqlens[0] < 0
RAGGED_OFFSETS_DECREASE = "ragged-offsets-decrease"      # cu_seqlens[b+1] < cu_seqlens[b]
RAGGED_OFFSET_PAST_STORAGE = "ragged-offset-past-storage"  # cu_seqlens[B] > T
RAGGED_LENGTH_OVER_MAX = "ragged-length-over-max"        # a sequence longer than max_seqlen
# padded varlen: per-sequence used lengths (Ragged.seqused_q / seqused_kv)
RAGGED_SEQUSED_COUNT = "ragged-seqused-count"            # seqused not [B]
RAGGED_SEQUSED_NEGATIVE = "ragged-seqused-negative"      # a used length < 0
RAGGED_SEQUSED_PAST_RANGE = "ragged-seqused-past-range"  # a used length past its cu_seqlens range
# score modifiers (docs/CONTRACTS.md, "Score modifiers"); dtype rules reuse DTYPE_MISMATCH
# (bias, dbias: io dtype) and SINKS_DTYPE (sinks, dsinks: fp32)
BIAS_DIMS_MISMATCH = "bias-dims-mismatch"          # bias not [B, H_q, S_q, S_kv]
BIAS_BROADCAST_AXIS = "bias-broadcast-axis"        # bias stride 0 on a long S_q or S_kv axis
DBIAS_WITHOUT_BIAS = "dbias-without-bias"
DBIAS_DIMS_MISMATCH = "dbias-dims-mismatch"        # dbias dims != bias dims, 1 where it broadcasts
DBIAS_OVERLAP = "dbias-overlap"                    # a dbias whose layout cannot be written
SINKS_DIMS_MISMATCH = "sinks-dims-mismatch"        # sinks or dsinks not [H_q]
SINKS_DTYPE = "sinks-dtype"                        # sinks and dsinks must be fp32
DSINKS_WITHOUT_SINKS = "dsinks-without-sinks"
DSINKS_OVERLAP = "dsinks-overlap"                  # dsinks stride 0 with H_q > 1
SOFTCAP_NONPOSITIVE = "softcap-nonpositive"
SOFTCAP_NONFINITE = "softcap-nonfinite"
ALIBI_SLOPES_DIMS_MISMATCH = "alibi-slopes-dims-mismatch"  # alibi_slopes not [H_q] or [B, H_q]
ALIBI_SLOPES_DTYPE = "alibi-slopes-dtype"                  # alibi_slopes must be fp32
# dropout (docs/CONTRACTS.md, "Dropout"); the mask's dtype rule reuses DTYPE_MISMATCH
DROPOUT_PROBABILITY_RANGE = "dropout-probability-range"   # p < 0, p >= 1 or not finite
DROPOUT_MASK_DIMS_MISMATCH = "dropout-mask-dims-mismatch"  # mask not [B, H_q, S_q, S_kv]
DROPOUT_MASK_BROADCAST_AXIS = "dropout-mask-broadcast-axis"  # stride 0 on a long S_q or S_kv
DROPOUT_MASK_WITHOUT_PROBABILITY = "dropout-mask-without-probability"  # a mask, p absent or 0

FRONTEND = frozenset({
    MISSING_TENSOR, BAD_RANK, STRIDE_COUNT, NONPOSITIVE_DIM, NEGATIVE_STRIDE,
    NEGATIVE_OFFSET, UNKNOWN_DTYPE, DTYPE_MISMATCH, STATS_DTYPE, BATCH_MISMATCH,
    O_DIMS_MISMATCH, KV_DIMS_MISMATCH, STATS_DIMS_MISMATCH, GQA_NOT_DIVISIBLE,
    RIGHT_BOUND_BELOW_MINUS_ONE, LEFT_BOUND_NONPOSITIVE, BAD_ALIGNMENT,
    SCALE_NONPOSITIVE, SCALE_NONFINITE, SPAN_OVERFLOW, RAGGED_OFFSETS_COUNT,
    RAGGED_MAX_SEQLEN_NEGATIVE, RAGGED_NEGATIVE_OFFSET, RAGGED_OFFSETS_DECREASE,
    RAGGED_OFFSET_PAST_STORAGE, RAGGED_LENGTH_OVER_MAX,
    RAGGED_SEQUSED_COUNT, RAGGED_SEQUSED_NEGATIVE, RAGGED_SEQUSED_PAST_RANGE,
    BIAS_DIMS_MISMATCH, BIAS_BROADCAST_AXIS, DBIAS_WITHOUT_BIAS, DBIAS_DIMS_MISMATCH,
    DBIAS_OVERLAP, SINKS_DIMS_MISMATCH, SINKS_DTYPE, DSINKS_WITHOUT_SINKS, DSINKS_OVERLAP,
    SOFTCAP_NONPOSITIVE, SOFTCAP_NONFINITE,
    ALIBI_SLOPES_DIMS_MISMATCH, ALIBI_SLOPES_DTYPE,
    DROPOUT_PROBABILITY_RANGE, DROPOUT_MASK_DIMS_MISMATCH, DROPOUT_MASK_BROADCAST_AXIS,
    DROPOUT_MASK_WITHOUT_PROBABILITY,
})

# --- device: bad offset values only device code sees (the seed-001 class) -------------
# A device probe names which offset rule its values break; the engine may decline the
# graph or skip the bad sequences, and is judged by what it touches (DESIGN section 10).
DEVICE = frozenset({
    RAGGED_NEGATIVE_OFFSET, RAGGED_OFFSETS_DECREASE, RAGGED_OFFSET_PAST_STORAGE,
    RAGGED_LENGTH_OVER_MAX, RAGGED_SEQUSED_NEGATIVE, RAGGED_SEQUSED_PAST_RANGE,
})
#: frontend codes about a ragged graph's offsets or used lengths (their values or their
#: count): an engine is handed them only as device tensors, so these are never offered to
#: its checks
RAGGED_OFFSETS = DEVICE | {RAGGED_OFFSETS_COUNT, RAGGED_SEQUSED_COUNT}

# --- engine: a valid graph the engine cannot address ----------------------------------
ZERO_STRIDE_OUTPUT = "zero-stride-output"          # dQ/dK/dV stride 0 on an axis longer than 1
OVERLAPPING_OUTPUT = "overlapping-output"          # an output's strides overlap (footprint rule)
DTYPE_NOT_SERVED = "dtype-not-served"
HEAD_DIM_TOO_LARGE = "head-dim-too-large"
HEAD_DIM_NOT_SERVED = "head-dim-not-served"
HEAD_DIM_STRIDE_NOT_ONE = "head-dim-stride-not-one"
NON_PACKED_STATS = "non-packed-stats"
UNEQUAL_HEAD_DIMS = "unequal-head-dims"            # D_qk != D_v not served
HV_NOT_HK = "hv-not-hk"                            # H_k != H_v not served
GQA_NOT_SERVED = "gqa-not-served"
MASK_NOT_SERVED = "mask-not-served"
ALIGNMENT_NOT_SERVED = "alignment-not-served"
SCALE_NOT_SERVED = "scale-not-served"
SEQ_LEN_NOT_SERVED = "seq-len-not-served"
MISALIGNED_STRIDE = "misaligned-stride"
BROADCAST_INPUT_NOT_SERVED = "broadcast-input-not-served"
GATED_FEATURE = "gated-feature"                    # a feature the engine has not built
#: dropout the engine cannot take: a mask port it cannot read, or no mask port (the engine
#: would have to draw its own mask and report it) where it draws none
DROPOUT_NOT_SERVED = "dropout-not-served"
RAGGED_NOT_SERVED = "ragged-not-served"            # packed variable-length batches
SEQUSED_NOT_SERVED = "seqused-not-served"          # per-sequence used lengths (padded varlen)
DETERMINISM_NOT_SERVED = "determinism-not-served"  # no deterministic backward to ask for
ARCH_NOT_SERVED = "arch-not-served"
DEVICE_NOT_SERVED = "device-not-served"
TOO_LARGE = "too-large"
#: the graph uses a score modifier the engine does not list in Engine.score_modifiers
#: (the harness declines it for the engine, detail: which)
MODIFIER_NOT_SERVED = "modifier-not-served"
#: a listed modifier in a layout, alignment or combination the engine cannot serve
BIAS_LAYOUT_NOT_SERVED = "bias-layout-not-served"
MODIFIER_COMBINATION_NOT_SERVED = "modifier-combination-not-served"

ENGINE = frozenset({
    ZERO_STRIDE_OUTPUT, OVERLAPPING_OUTPUT, DTYPE_NOT_SERVED, HEAD_DIM_TOO_LARGE,
    HEAD_DIM_NOT_SERVED, HEAD_DIM_STRIDE_NOT_ONE, NON_PACKED_STATS, UNEQUAL_HEAD_DIMS,
    HV_NOT_HK, GQA_NOT_SERVED, MASK_NOT_SERVED, ALIGNMENT_NOT_SERVED, SCALE_NOT_SERVED,
    SEQ_LEN_NOT_SERVED, MISALIGNED_STRIDE, BROADCAST_INPUT_NOT_SERVED, GATED_FEATURE,
    ARCH_NOT_SERVED, DEVICE_NOT_SERVED, TOO_LARGE, RAGGED_NOT_SERVED, DETERMINISM_NOT_SERVED,
    MODIFIER_NOT_SERVED, BIAS_LAYOUT_NOT_SERVED, MODIFIER_COMBINATION_NOT_SERVED,
    DROPOUT_NOT_SERVED, SEQUSED_NOT_SERVED,
})

ALL = FRONTEND | ENGINE | DEVICE


def code_of(reason: str) -> str:
    """The code of a decline reason: engines may add detail after ': '."""
    return reason.split(":", 1)[0].strip()
