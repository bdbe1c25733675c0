"""The catalog of engine mutants: one place, one frozen record each.

Each mutant is one real defect class, put into a correct engine by a plain wrapper of it
(`mutant.wrap(engine)`, which is `Wrapper(engine, *args)`):
- `wrapper` mutants (mutants/wrappers.py) alter what the engine is handed or accepts, or
  what it leaves in memory; they work for any engine that reads the ports they alter;
- `source-patch` mutants are the Triton engine launching an edited copy of its launcher or
  its kernels (mutants/triton_source.py): the defect is in that engine's own code.

`prefer` lists item globs whose cases the kill runner tries first. It only orders the
cases (so the cheap, likely killers run early); a mutant is killed by whatever case in the
level first fails it, and survives only when none does.

The harness (and its worker processes) builds an engine from a name and a device, so every
(engine, mutant) pair also has a name, `bundlegen.mutants.catalog:<engine>@<mutant>`, that
`bundlegen.engines.registry.engine_class` resolves through this module's `__getattr__` to
a subclass of the mutant's wrapper whose constructor takes the device: it builds the real
engine and wraps it, and carries the real engine's name (its engine.toml, tolerances and
claims apply).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from bundlegen import reasons as R
from bundlegen.engines.base import Engine
from bundlegen.graph import Graph
from bundlegen.mutants import conditional as C
from bundlegen.mutants import port_forms as PF
from bundlegen.mutants import slopes_sinks as M
from bundlegen.mutants import ragged_layouts as RL
from bundlegen.mutants import scale_defects as S
from bundlegen.mutants import triton_source as T
from bundlegen.mutants import wrappers as W

WRAPPER = "wrapper"
SOURCE_PATCH = "source-patch"
KINDS = (WRAPPER, SOURCE_PATCH)

#: Engines that recompute O and LSE from Q, K, V and never read the stats or O ports: a
#: mutant that only misreads those ports computes nothing different there.
RECOMPUTES_FORWARD = frozenset({"torch-math"})
FORWARD_PORTS = frozenset({"stats", "o"})


@dataclass(frozen=True)
class Wrap:
    """How a mutant is put into a correct engine: `wrapper(engine, *args)`."""
    wrapper: type[W.EngineWrapper]
    args: tuple = ()

    def __call__(self, engine: Engine) -> W.EngineWrapper:
        return self.wrapper(engine, *self.args)


def wrap(wrapper: type[W.EngineWrapper], *args) -> Wrap:
    return Wrap(wrapper, args)


@dataclass(frozen=True)
class Mutant:
    name: str
    defect_class: str
    description: str
    kind: str                      # wrapper | source-patch
    wrap: Wrap                     # a correct engine -> the mutant engine wrapping it
    prefer: tuple[str, ...] = ()   # item globs tried first (ordering only)
    reads: tuple[str, ...] = ()    # input ports whose reading the defect corrupts
    #: the lowest level that must kill it (the CPU gate runs the quick ones)
    killed_by: str = "quick"
    #: only a case too large for the CPU can kill it (e.g. a span past 2^31 elements)
    needs_gpu: bool = False
    #: the graphs whose outputs the defect changes (None: every graph the engine serves);
    #: the kill fraction counts only the cases whose graph meets it
    condition: Callable[[Graph], bool] | None = None

    @property
    def boundary_class(self) -> str:
        """The plan's boundary class (BND-<CLASS>) this mutant is conditional on, from its
        first BND- `prefer` glob; "" for an unconditional mutant."""
        return next((p.rstrip("*") for p in self.prefer if p.startswith("BND-")), "")

    @property
    def patch(self) -> T.Patch | None:
        """The source patch a source-patch mutant launches, else None."""
        return self.wrap.args[0] if self.kind == SOURCE_PATCH else None

    def not_applicable(self, engine_cls: type[Engine], device: str | None = None) -> str | None:
        """Why this mutant cannot be put into `engine_cls` (on `device`), or None."""
        if self.needs_gpu and device is not None and not str(device).startswith("cuda"):
            return f"needs a GPU: the cases that can kill it are too large for {device}"
        if self.kind == SOURCE_PATCH:
            from bundlegen.engines.triton.engine import TritonEngine
            if not issubclass(engine_cls, TritonEngine):
                return (f"a source patch of the triton engine ({engine_cls.name} has no triton "
                        "source to patch)")
        if self.reads and set(self.reads) <= FORWARD_PORTS and engine_cls.name in RECOMPUTES_FORWARD:
            return f"{engine_cls.name} recomputes the forward and never reads {', '.join(self.reads)}"
        return None


# ----------------------------------------------------------------------------- the catalog
CATALOG: tuple[Mutant, ...] = (
    # --- addressing of the inputs
    Mutant("stats-read-packed", "stats strides ignored",
           "the launcher passes stats strides derived from Q's dims ([B, H_q, S_q] packed), "
           "whatever stats' own strides (ALMIOPEN-3037)",
           SOURCE_PATCH, wrap(T.Patched, T.STATS_PACKED), ("REG-STATS-*",), ("stats",)),
    Mutant("stats-batch-head-swapped", "stats strides swapped",
           "stats read with its batch and head strides exchanged (packed stats hide it only "
           "when H_q = 1)",
           WRAPPER, wrap(W.StatsRestrided, "swap-batch-head"),
           ("REG-B2-H2-DERIVED-STRIDES", "REG-STATS-*"), ("stats",)),
    Mutant("v-indexed-with-k-heads", "H_v ignored",
           "V and dV indexed with K's head count: dV of H_k heads written, past dV's end "
           "when H_k > H_v (ALMIOPEN-3039)",
           WRAPPER, wrap(W.VHeadsAsKHeads), ("REG-HV-LT-HK", "AX-HEADS-HK*")),
    Mutant("do-strides-as-o", "dO strides assumed",
           "dO read through O's strides (correct only when both share a layout)",
           WRAPPER, wrap(W.DoStridesAsO), ("REG-DO-STRIDES-DIFFER", "AX-LAYOUT-DO-STRIDES-DIFFER")),
    Mutant("odd-pitch-read-early", "stride parity misread",
           "an input row at an odd index with an odd row pitch is read from one element "
           "early (a load rounded down to an even address; ALMIOPEN-3038)",
           SOURCE_PATCH, wrap(T.Patched, T.ROW_PITCH_EARLY),
           ("REG-ODD-ROW-PITCH", "AX-LAYOUT-PAD1", "AX-LAYOUT-ODD-PITCH")),
    Mutant("delta-o-wrong-dtype", "wrong dtype",
           "Delta = sum(O * dO) computed from O read as fp16 whatever the io dtype (a "
           "hard-coded fp16 type: a bf16 O's bits taken for fp16)",
           SOURCE_PATCH, wrap(T.Patched, T.DELTA_WRONG_DTYPE), ("AX-DTYPE-BF16",), ("o",)),
    # --- addressing of the outputs
    Mutant("dv-extra-row", "write past the end",
           "dV written with one extra row past the end of every (batch, head) slice",
           WRAPPER, wrap(W.DvExtraRow), ("REG-HV-LT-HK",)),
    # --- masks and loops
    Mutant("top-left-for-bottom-right", "wrong diagonal alignment",
           "the diagonal aligned top-left when bottom-right was asked (visible when S_q != S_kv)",
           SOURCE_PATCH, wrap(T.Patched, T.TOP_LEFT), ("REG-BR-SQ-GT-SKV", "REG-TAIL-S-MOD-128-64")),
    Mutant("left-bound-off-by-one", "off-by-one window bound",
           "a key kept when i - j' <= left_bound instead of < left_bound (one key too many)",
           SOURCE_PATCH, wrap(T.Patched, T.LEFT_OFF_BY_ONE), ("AX-MASK-WINDOW-*", "AX-MASK-BAND-*")),
    Mutant("drop-tail-block", "dropped tail block",
           "the last partial block of each sequence loop is skipped (S mod BLOCK != 0)",
           SOURCE_PATCH, wrap(T.Patched, T.DROP_TAIL), ("REG-TAIL-S-MOD-128-64", "AX-SEQ-EQ-17")),
    Mutant("masked-rows-nan", "fully masked rows",
           "P formed with the LSE as given: a row with no kept key gives -inf - (-inf) = NaN, "
           "or inf x 0 where the mask multiplies P",
           SOURCE_PATCH, wrap(T.Patched, T.MASKED_ROWS_NAN), ("REG-BR-SQ-GT-SKV", "AX-MASK-STRICT-*")),
    # --- ragged batches (offsets only the device sees)
    Mutant("ragged-token-base-unbounded", "unbounded THD token base",
           "a sequence's first token taken from cu_seqlens as it is: a start before the "
           "storage or an end past it is read and written there (seed 001, AICK-3016)",
           SOURCE_PATCH, wrap(T.Patched, T.RAGGED_UNBOUNDED), ("PRB-RAGGED-*", "*RAGGED*OFFSET*")),
    Mutant("offsets-32-bit", "32-bit offset arithmetic",
           "the element offset of a tile's first element formed in 32 bits: it wraps past "
           "2^31 elements (a large batch or head stride, a long packed batch)",
           SOURCE_PATCH, wrap(T.Patched, T.OFFSETS_32), ("SHP-INT64-OFFSETS",), killed_by="full",
           needs_gpu=True),
    # --- arithmetic
    Mutant("scale-ignored-in-dk", "ignored scale",
           "dK not multiplied by attn_scale",
           SOURCE_PATCH, wrap(T.Patched, T.NO_SCALE_DK)),
    Mutant("dq-accumulated-fp16", "accumulation precision",
           "the dQ accumulator rounded to fp16 after every key block (range and precision "
           "of fp16 instead of fp32)",
           SOURCE_PATCH, wrap(T.Patched, T.DQ_FP16), ("REG-BF16-BEYOND-FP16-RANGE",)),
    Mutant("gqa-dkdv-not-reduced", "GQA reduction missing",
           "dK and dV take only the first query head of their group instead of the sum "
           "over the group",
           SOURCE_PATCH, wrap(T.Patched, T.NO_GROUP_REDUCE), ("AX-HEADS-GQA*", "AX-HEADS-MQA")),
    # --- conditional on one boundary class each (issue 17): correct off the class; the
    # plan's BND-* values must reach them (pr at the latest)
    Mutant("sq-tail-stored-as-full", "Q tail one row short taken as full",
           "BND-SQ-TAIL: the dQ store's full-block test off by one (start_m + BLOCK_M - 1 <= "
           "S_q): when S_q mod BLOCK_M2 == BLOCK_M2 - 1 the tail block is stored whole, one "
           "row past the sequence's end (the next head's first row, or past the tensor; an "
           "EVEN_M fast path off by one, cf. pytorch#153799)",
           SOURCE_PATCH, wrap(T.Patched, T.SQ_TAIL_AS_FULL), ("BND-SQ-TAIL*",), killed_by="pr"),
    Mutant("skv-one-key-tail-skipped", "one-key tail block skipped",
           "BND-SKV-TAIL: the dQ kernel's key-block count rounded up with BLOCK_N - 2 "
           "(ceil-div off by one): a last key block holding a single key, S_kv mod BLOCK_N2 "
           "== 1 (or a band whose last kept key starts a block), never reaches dQ",
           SOURCE_PATCH, wrap(T.Patched, T.SKV_ONE_KEY_TAIL), ("BND-SKV-TAIL*",), killed_by="pr"),
    Mutant("br-shift-in-whole-blocks", "bottom-right offset rounded to blocks",
           "BND-BR-OFFSET: the bottom-right shift S_kv - S_q rounded down to a multiple of "
           "BLOCK_N2 (a causal offset kept in whole blocks, cf. flash-attention#1778, #436): "
           "wrong only when the shift is not a block multiple (negative ones included)",
           SOURCE_PATCH, wrap(T.Patched, T.BR_SHIFT_BLOCKS), ("BND-BR-OFFSET*",), killed_by="pr"),
    Mutant("window-left-edge-inclusive", "window edge block taken as whole",
           "BND-WINDOW-LEFT: the whole-block tests use an inclusive left bound (i - j + shift "
           "<= left, FlashAttention's window_size convention; cf. transformers#39408) beside "
           "the exclusive mask: when left - shift == -1 mod the block (BLOCK_N2 for dQ, "
           "BLOCK_M1 for dK/dV) an edge block missing one corner key runs unmasked",
           SOURCE_PATCH, wrap(T.Patched, T.WINDOW_LEFT_INCLUSIVE), ("BND-WINDOW-LEFT*",), killed_by="pr"),
    Mutant("window-right-edge-exclusive", "right band edge off by one in the loop bounds",
           "BND-WINDOW-RIGHT: the dK/dV kernel's first query row computed for an exclusive "
           "right bound (j - i - shift < right): when right + shift == 1 mod BLOCK_M1 the "
           "query block of the row whose band ends on a key block's first key is skipped",
           SOURCE_PATCH, wrap(T.Patched, T.WINDOW_RIGHT_EXCLUSIVE), ("BND-WINDOW-RIGHT*",), killed_by="pr"),
    Mutant("head-dim-cut-to-16", "head-dim tail dropped",
           "BND-HEAD-DIM: D_qk cut to a multiple of 16 (the MMA granule) in every kernel: "
           "when D_qk mod 16 != 0 the tail columns of Q and K are never read and those of "
           "dQ and dK never written (cf. tiny-flash-attention#12, FasterTransformer#89)",
           SOURCE_PATCH, wrap(T.Patched, T.HEAD_DIM_16), ("BND-HEAD-DIM*",), killed_by="pr"),
    Mutant("group-as-power-of-two", "GQA group assumed a power of two",
           "BND-GROUP: the dK/dV kernel's group size taken as the largest power of two in "
           "H_q / H_grp (a kernel written for power-of-two ratios, cf. sglang#36296, "
           "flash-linear-attention#1029): ratios 3, 5, 6, 7 sum the wrong query heads",
           SOURCE_PATCH, wrap(T.Patched, T.GROUP_POW2), ("BND-GROUP*",), killed_by="pr"),
    Mutant("dq-grid-capped-1024", "grid capped",
           "BND-GRID: the dQ launch capped at 1024 programs: with more (ceil(S_q / BLOCK_M2) "
           "* B * H_q > 1024) the last programs never run and their dQ rows are never "
           "written (a grid limit silently skipping work, cf. pytorch#142228, "
           "flashinfer#3125, MagiAttention#40)",
           SOURCE_PATCH, wrap(T.Patched, T.GRID_CAP_1024), ("BND-GRID*",), killed_by="pr"),
    # --- score modifiers (issue 19): the kernels' softcap, dBias and dSinks
    Mutant("softcap-grad-dropped", "softcap gradient missing",
           "the softcap's factor (1 - tanh^2) left out of dS in both kernels: dQ and dK as if "
           "the cap were the identity on the backward (a forward-only softcap)",
           SOURCE_PATCH, wrap(T.Patched, T.SOFTCAP_GRAD_DROPPED), ("AX-SOFTCAP-CAP5", "AX-SOFTCAP-*")),
    Mutant("dbias-masked-tiles-unwritten", "output left unwritten",
           "dBias written only by the tiles the mask's band reaches: tiles it drops whole "
           "(skipped by the loops) keep what the output held instead of zeros",
           SOURCE_PATCH, wrap(T.Patched, T.DBIAS_SKIPPED_TILES_UNWRITTEN), ("AX-DBIAS-ON",)),
    Mutant("dsinks-sign-flipped", "wrong sign",
           "dSinks = +sum exp(sink - LSE) Delta (the sign of d LSE / d sink lost)",
           SOURCE_PATCH, wrap(T.Patched, T.DSINKS_SIGN), ("AX-SINKS-ON", "SHP-SINKS-*")),
    Mutant("bias-indexed-by-kv-head", "GQA head index confused",
           "the dK/dV kernel reads the bias of the K head of its group instead of each query "
           "head's: right for MHA or a head-broadcast bias, wrong under GQA / MQA",
           SOURCE_PATCH, wrap(T.Patched, T.BIAS_KV_HEAD), ("AX-BIAS-FULL", "AX-BIAS-BATCH", "AX-BIAS-ALIBI")),
    # --- precision
    Mutant("tf32-for-fp32", "TF32 used for an fp32 graph",
           "fp32 products taken in TF32 (10-bit mantissa inputs, as tensor cores do when "
           "allow_tf32 or tl.dot's default precision is left on): relative errors near 2^-11",
           WRAPPER, wrap(W.Tf32Products), ("SHP-FP32",)),
    # --- dropout (the dropout_mask port)
    Mutant("dropout-dv-unscaled", "dropout scale missing",
           "the 1 / (1 - p) scale of kept entries left out of the dV product only (dP keeps it)",
           WRAPPER, wrap(W.DropoutDvUnscaled), ("SHP-DROPOUT",), condition=W.has_dropout_mask),
    Mutant("dropout-dv-mask-missing", "dropout mask missing",
           "the dropout mask applied to dP but not to P in the dV product (dV = (P / (1 - p))^T dO)",
           WRAPPER, wrap(W.DropoutDvMaskMissing), ("SHP-DROPOUT",)),
    Mutant("dropout-drawn-dq-offset-shifted", "dropout mask differs between passes",
           "a mask the kernels draw themselves: the dQ kernel draws it one Philox offset on from "
           "the dK/dV kernel (and from the mask the engine tells), so dQ is computed with other "
           "kept entries than dK and dV",
           SOURCE_PATCH, wrap(T.Patched, T.DROPOUT_DQ_OFFSET_SHIFTED), ("SHP-DROPOUT-DRAWN*",)),
    # --- conditional on one gap class of the plan each (mutants/conditional.py): correct
    # off their condition
    Mutant("interleaved-dq-batch-offset-lost", "degenerate layouts",
           "dQ in a heads-interleaved layout stored without its batch offset (B >= 2, H >= 2)",
           WRAPPER, wrap(C.InterleavedBatchOffsetLost), ("AX-LAYOUT-BSHD", "AX-LAYOUT-SBHD"), killed_by="pr"),
    Mutant("interleaved-dk-head-dim-tail-dropped", "degenerate layouts",
           "dK in a heads-interleaved layout loses its head-dim tail when D_qk % 32 != 0",
           WRAPPER, wrap(C.InterleavedHeadDimTailDropped), ("AX-LAYOUT-*",), killed_by="pr"),
    Mutant("delta-kept-in-fp8", "gradients range/correlation",
           "Delta = rowsum(dO * O) kept in fp8 (e5m2): seen in dSinks only where dO is correlated with O",
           WRAPPER, wrap(C.DeltaKeptInFp8), ("SHP-GRAD-RANGE-LONG", "SHP-GRAD-RANGE"),
           killed_by="pr"),
    Mutant("dp-saturates-fp16", "gradients range/correlation",
           "dP held in fp16 in an fp16 graph: inf (then NaN in dQ, dK) where |dP| > 65504",
           WRAPPER, wrap(C.DpSaturatesFp16), ("SHP-GRAD-RANGE",), killed_by="pr"),
    Mutant("dsinks-last-batch-lost", "tolerance cannot see a lost contribution",
           "dSinks misses the last batch's contribution (B >= 2)",
           WRAPPER, wrap(C.DsinksLastBatchLost), ("AX-SINKS-ON", "SHP-SINKS-*"), killed_by="pr"),
    Mutant("nondeterministic-without-gqa", "determinism",
           "the deterministic backward differs run to run (dK's last bit) when H_q == H_k",
           WRAPPER, wrap(C.NondeterministicWithoutGqa), ("SHP-DETERMINISTIC-*",), killed_by="pr"),
    Mutant("fp16-dq-tail-row-lost", "fp16",
           "an fp16 graph with S_q % 16 != 0 never stores dQ's last row",
           WRAPPER, wrap(C.Fp16QueryTailStale), ("AX-DTYPE-FP16",), killed_by="pr"),
    Mutant("extreme-lse-window-half-tile", "risky values meeting late",
           "extreme LSE under a window with S_kv off the 64 tile: the last key block's dK, dV zero",
           WRAPPER, wrap(C.ExtremeLseWindowHalfTile), ("REG-EXTREME-LSE",), killed_by="pr"),
    Mutant("sinks-decode-batch-lse-mixed", "risky values meeting late",
           "sinks with B >= 2 at S_q <= 16: dSinks reads batch 0's LSE for every batch",
           WRAPPER, wrap(C.SinksDecodeBatchMixed), ("AX-SINKS-ON",), killed_by="pr"),
    Mutant("rectangle-128-dq-last-row-lost", "risky values meeting late",
           "S_q != S_kv, both multiples of 128: dQ's last row lost",
           WRAPPER, wrap(C.TiledRectangleLastRowLost), ("SHP-*",), killed_by="pr"),
    # --- ALiBi slopes and modifiers on ragged graphs (mutants/slopes_sinks.py)
    Mutant("alibi-slope-of-kv-head", "GQA head index confused",
           "ALiBi slopes indexed by the K/V head under GQA / MQA (slope[h // (H_q / H_k)])",
           WRAPPER, wrap(M.AlibiSlopeOfKvHead), ("SHP-ALIBI-SLOPES*", "AX-RAGGED-MODIFIERS-ALIBI-*")),
    Mutant("alibi-shift-not-per-sequence", "wrong diagonal alignment",
           "ragged bottom-right ALiBi shifted by max_seqlen_kv - max_seqlen_q, not each sequence's own",
           WRAPPER, wrap(M.AlibiShiftNotPerSequence), ("SHP-RAGGED-MODIFIERS-*", "RAGGED-PAIR-CORE"),
           killed_by="pr"),
    Mutant("dsinks-over-padding-rows", "rows outside the sequences read",
           "ragged dSinks sums each sequence's rows up to max_seqlen_q (the next sequences' rows again)",
           WRAPPER, wrap(M.DsinksOverPaddingRows), ("AX-RAGGED-MODIFIERS-SINKS", "SHP-RAGGED-MODIFIERS-*")),
    # --- ragged layouts (mutants/ragged_layouts.py): packed token buffers
    Mutant("packed-dk-in-v-slot", "packed varlen slots confused",
           "dK of a packed dKV / dQKV buffer written one slot on, into dV's slot (a slot "
           "offset taken from the wrong port), its own slot left unwritten",
           WRAPPER, wrap(RL.PackedDkInVSlot), ("AX-RAGGED-STORAGE-KV-PACKED", "AX-RAGGED-STORAGE-QKV-PACKED")),
    Mutant("seqused-ignored", "padded varlen used lengths ignored",
           "seqused_q / seqused_kv ignored: each sequence attended over its whole cu_seqlens "
           "range, so its padding rows (NaN canaries) are read and their output rows written",
           WRAPPER, wrap(RL.SequsedIgnored), ("AX-RAGGED-SEQUSED-KV", "AX-RAGGED-SEQUSED-BOTH")),
    # --- port forms and the newest features met together (mutants/port_forms.py, issue 58)
    Mutant("dropout-batch-only-read-as-both", "port form: dropout mask broadcast over the batch only",
           "a dropout mask with batch stride 0 (head stride kept) read as broadcast over the heads too",
           WRAPPER, wrap(PF.DropoutBatchOnlyReadAsBoth), ("AX-DROPOUT-FORM-P0-5-BATCH", "FOCUS-*")),
    Mutant("dropout-mask-head-of-kv-head", "port form: dropout mask x GQA",
           "a per-head dropout mask indexed by the K/V head under GQA / MQA",
           WRAPPER, wrap(PF.DropoutMaskHeadOfKvHead), ("FOCUS-NEWEST-QUICK", "AX-DROPOUT-FORM-*")),
    Mutant("dropout-scale-bf16-in-fp32", "new-feature pair: dropout x fp32",
           "fp32 io with dropout p 0.1: the keep scale 1 / (1 - p) formed in bf16 (dV off by 0.16 %)",
           WRAPPER, wrap(PF.DropoutScaleRoundedInFp32), ("FOCUS-NEWEST-QUICK", "SHP-DROPOUT*")),
    Mutant("alibi-batch-slopes-first-row", "port form: [B, H_q] ALiBi slopes",
           "[B, H_q] ALiBi slopes read as [H_q]: every batch gets batch 0's slopes",
           WRAPPER, wrap(PF.AlibiBatchSlopesFirstRow), ("AX-ALIBI-SLOPES-BATCH", "FOCUS-*")),
    Mutant("softcap-dropped-with-alibi", "new-feature pair: ALiBi slopes x softcap",
           "with ALiBi slopes the softcap is not applied (a kernel variant without the branch)",
           WRAPPER, wrap(PF.SoftcapDroppedWithAlibi), ("FOCUS-NEWEST-QUICK", "SHP-ALIBI-SLOPES*")),
    Mutant("alibi-slopes-wrap-past-power-of-two", "new-feature pair: ALiBi slopes x heads not a power of two",
           "query heads past the largest power of two read the slopes from the start again",
           WRAPPER, wrap(PF.AlibiSlopesWrapPastPowerOfTwo), ("FOCUS-NEWEST-QUICK", "FOCUS-PORT-FORMS")),
    Mutant("ragged-fp32-last-sequence-dk-stale", "new-feature pair: ragged x fp32",
           "a ragged graph in fp32 never stores the last sequence's dK rows",
           WRAPPER, wrap(PF.RaggedFp32LastSequenceDkStale), ("AX-RAGGED-DTYPE-FP32", "FOCUS-RAGGED-*")),
    Mutant("ragged-qkv-packed-dq-last-head-lost", "port form: packed varlen QKV x heads other than 2",
           "Q, K, V in one packed varlen buffer with H != 2: dQ's last head never stored",
           WRAPPER, wrap(PF.RaggedQkvPackedDqLastHeadLost),
           ("FOCUS-RAGGED-*", "AX-RAGGED-STORAGE-QKV-PACKED", "SHP-RAGGED-QKV-PACKED-HEADS")),
    Mutant("seqused-q-alone-ignored", "port form: seqused_q without seqused_kv",
           "seqused_q ignored unless seqused_kv is given too",
           WRAPPER, wrap(PF.SequsedQAloneIgnored), ("AX-RAGGED-SEQUSED-Q", "FOCUS-RAGGED-*")),
    Mutant("dsinks-over-used-padding", "new-feature pair: dSinks x used lengths",
           "ragged dSinks with seqused_q sums the padding rows past each used length too",
           WRAPPER, wrap(PF.DsinksOverUsedPadding), ("FOCUS-RAGGED-*", "AX-RAGGED-SEQUSED-*")),
    Mutant("ragged-bias-head-broadcast-as-batch", "port form: ragged bias broadcast over the heads",
           "a ragged head-broadcast bias read as broadcast over the sequences too (sequence 0's bias)",
           WRAPPER, wrap(PF.RaggedBiasHeadBroadcastAsBatch), ("AX-RAGGED-MODIFIERS-BIAS-HEAD", "FOCUS-RAGGED-*")),
    # --- defects of a few per cent (mutants/scale_defects.py): the statistical judge's
    *(Mutant(f"{port}-scaled", "output a few per cent off",
             f"{port} written x (1 + e): e 2 % in bf16, 0.5 % in fp16, 0.05 % in fp32",
             WRAPPER, wrap(S.OutputScaled, port)) for port in ("dq", "dk", "dv")),
    Mutant("dk-one-head-scaled", "one head a few per cent off",
           "dK's middle head written x (1 + e) (a per-head constant indexed wrongly)",
           WRAPPER, wrap(S.OutputScaled, "dk", "head")),
    Mutant("dq-one-sequence-scaled", "one sequence a few per cent off",
           "dQ of the middle batch (a ragged graph's middle sequence) written x (1 + e)",
           WRAPPER, wrap(S.OutputScaled, "dq", "sequence"), condition=S.has_several_sequences),
    Mutant("softmax-scale-off", "softmax scale a few per cent off",
           "the backward's attn_scale 2 % too large (a scale folded with a wrong constant)",
           WRAPPER, wrap(S.SoftmaxScaleOff)),
    # --- decline arms removed
    Mutant("accepts-zero-stride-outputs", "decline arm removed",
           "zero-stride outputs (a broadcast written to) accepted and run (ALMIOPEN-3040)",
           WRAPPER, wrap(W.WithoutDeclineArm, R.ZERO_STRIDE_OUTPUT), ("PRB-ZERO-STRIDE-*",)),
    Mutant("accepts-overlapping-outputs", "decline arm removed",
           "outputs whose strides overlap accepted and run",
           WRAPPER, wrap(W.WithoutDeclineArm, R.OVERLAPPING_OUTPUT), ("PRB-OVERLAP-*",)),
    Mutant("accepts-non-packed-stats", "decline arm removed",
           "an engine that addresses stats as packed, its non-packed-stats decline arm "
           "removed: non-packed stats accepted and read as packed",
           WRAPPER, wrap(W.StatsRestrided, "packed"), ("REG-STATS-*",), ("stats",)),
)

NAMES = tuple(m.name for m in CATALOG)
assert len(set(NAMES)) == len(NAMES), "mutant names must be unique"
#: the mutants the quick level must kill on the CPU (the CPU mutation gate)
QUICK_CPU_NAMES = tuple(m.name for m in CATALOG if m.killed_by == "quick" and not m.needs_gpu)


def by_name(name: str) -> Mutant:
    for m in CATALOG:
        if m.name == name:
            return m
    raise KeyError(f"unknown mutant {name!r} (known: {', '.join(NAMES)})")


def select(names=None) -> tuple[Mutant, ...]:
    """The named mutants in catalog order, or the whole catalog."""
    if not names:
        return CATALOG
    wanted = {by_name(n).name for n in names}
    return tuple(m for m in CATALOG if m.name in wanted)


# ----------------------------------------------------------------------------- engine names
TARGET_SEP = "@"


def engine_target(engine: str, mutant: str) -> str:
    """The name `bundlegen.engines.registry.engine_class` resolves to the mutant of `engine`."""
    return f"{__name__}:{engine}{TARGET_SEP}{mutant}"


def mutant_engine_class(engine: str, mutant: Mutant) -> type[W.EngineWrapper]:
    """The mutant's wrapper class, built from a device as the harness builds engines: it
    wraps a new `engine` on that device."""
    from bundlegen.engines.registry import engine_class

    base = engine_class(engine)
    wrapper, args = mutant.wrap.wrapper, mutant.wrap.args

    class MutantEngine(wrapper):
        __doc__ = f"{mutant.name}: {mutant.description}"
        name, deterministic = base.name, base.deterministic

        def __init__(self, device="cpu"):
            super().__init__(base(device), *args)

    MutantEngine.__name__ = MutantEngine.__qualname__ = f"{base.__name__}Mutant[{mutant.name}]"
    return MutantEngine


def __getattr__(attr: str):
    """`<engine>@<mutant>`: the class engine_class resolves an engine_target name to."""
    if TARGET_SEP not in attr:
        raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
    engine, _, name = attr.rpartition(TARGET_SEP)
    try:
        mutant = by_name(name)
    except KeyError as exc:
        raise AttributeError(str(exc)) from None
    return mutant_engine_class(engine, mutant)
