"""Every kernel variant the launcher can choose, compiled for every target arch without a GPU,
with its resources (registers / VGPRs, spills, shared memory / LDS, occupancy, code size)
checked against each arch's limits. The report is engines/triton/resources.json, written by

    python bench/triton_resources.py [--arch ARCH ...]      # the whole sweep (minutes)

and tests/test_triton_resources.py compiles a few variants per arch in CI and compares them
with it (so a config that spills fails CI), and checks the report covers every variant.

Variants are not listed by hand. `launcher_choices` runs launch.py's own `prepare` and
`run_*` over a grid of probe graphs (every mask, alignment, ragged or not, MHA / GQA /
H_k != H_v, every head-dim tile, aligned or not, 64-bit tile offsets or not, without and with
every score modifier or ALiBi slopes, ragged ones with used lengths or not, atomic dQ or
not where the arch runs it) and the graphs of the checked-in bundles, on meta tensors, with
a recorder in place of the kernels: what it records is exactly what a launch would compile
(each kernel's constexprs, the arguments passed as None, which Triton makes constexprs, and
the compile options). `variant_of` then maps each choice to the variant the sweep compiles
for it: a constexpr is either SWEPT (kept as chosen) or REPRESENTED by a value with at
least its code (the band with both sides for every mask kind, the tier's widest head-dim
tile); a constexpr in neither raises, so a new one cannot be forgotten.

Each variant is compiled and measured alone (resource_measure.measure_alone) and checked
against its arch's limits (resource_limits.check); this module enumerates the variants and
reads and writes the report.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from bundlegen.engines.triton import aot, configs
from bundlegen.engines.triton.aot import FUSED_DBIAS_ARGS
# the report's limits, checks and measurements, importable from here (bench, tests)
from bundlegen.engines.triton.resource_limits import (KNOWN_SPILLS, LIMITS, AmdLimits,  # noqa: F401
                                                      NvidiaLimits, amd_occupancy, check,
                                                      known_spill, nvidia_occupancy)
from bundlegen.engines.triton.resource_measure import (code_bytes, compile_variant,  # noqa: F401
                                                       measure, measure_alone)

REPORT = Path(__file__).with_name("resources.json")
ARCHS = ("sm90", "sm120", "gfx942")
IO = "bf16"   # fp16 compiles the same code with the other 16-bit MMA type (see REPRESENTED)


# ----------------------------------------------------------------------------- variants

#: constexprs compiled as the launcher chooses them (every value it can choose is swept)
SWEPT = frozenset({"COMPUTE_DK", "COMPUTE_DV", "UPCAST", "WIDE", "VEC", "ATOMIC_DQ",
                   "HAS_DROPOUT", "DRAWN_DROPOUT",   # the dropout_mask port, or a drawn mask
                   "RAGGED_DB", "RAGGED_DS",         # the dBias and dSinks kernels on a ragged batch
                   "BLOCK_M", "BLOCK_N", "RAGGED", "KV_SHARED", "BLOCK", "TMA", "DP_FIRST",
                   "SCORE_VEC",   # the bias / dropout-mask tiles read in vectors (launch.score_vec)
                   "FUSED_DBIAS",   # dBias stored by the dK pass (launch.fuses_dbias)
                   # None in a dense launch (Triton makes them constexprs), runtime in a ragged one
                   "CU_Q", "CU_KV", "T_q", "T_kv",
                   # None without TMA, runtime (tensor descriptors) with it
                   *(a for args in aot.DESCRIPTOR_ARGS.values() for a in args)})
#: a REPRESENTED value meaning "not a constexpr": the stand-in takes the argument at run time
RUNTIME = "<runtime>"
MODIFIER_ARGS = ("BIAS", "bias_off", "sbias_b", "sbias_h", "sbias_i", "sbias_j", "softcap")
#: the dropout arguments of a launch with the dropout_mask port (run time there), of one
#: whose kernels draw the mask (DRAWN_DROPOUT), and of both (the scale 1 / (1 - p)); None
#: (constexprs) in a launch without dropout, and the other form's in a launch with it
PORT_ARGS = ("DROP", "drop_off", "sdrop_b", "sdrop_h", "sdrop_i", "sdrop_j")
DRAW_ARGS = ("drop_seed", "drop_offset", "drop_p")
DROPOUT_ARGS = PORT_ARGS + ("drop_scale",) + DRAW_ARGS
#: the ALiBi slopes' arguments: None (constexprs) without them, run time with them (HAS_ALIBI)
ALIBI_ARGS = ("ALIBI", "alibi_off", "salibi_b", "salibi_h")
#: constexprs added to the kernels after the first variants were measured, at their off
#: value (a static branch the compiler drops, so an earlier variant's code is what it was
#: without them): left out of a variant's key when off, put back when the variant is
#: compiled (added_off), so the earlier variants' keys and entries stand
ADDED_OFF = {"HAS_DROPOUT": False, "DRAWN_DROPOUT": False, **{a: None for a in DROPOUT_ARGS},
             "HAS_ALIBI": False, **{a: None for a in ALIBI_ARGS}, "RAGGED_DB": False,
             "RAGGED_DS": False, **aot.NO_USED, "SCORE_VEC": 1,
             "FUSED_DBIAS": False, **{a: None for a in FUSED_DBIAS_ARGS}}


def added_off(cons: Mapping[str, Any]) -> dict:
    """The ADDED_OFF constexprs a variant's key leaves out, as its launch passes them: each
    one at its off value, except the arguments the variant's flags make run-time values (the
    dropout form's, the slopes', the used lengths')."""
    return {k: off for k, off in ADDED_OFF.items()
            if k not in cons and not (k in REPRESENTED and REPRESENTED[k][0](cons) == RUNTIME)}


def _dropout_arg(arg: str):
    """REPRESENTED rule of a dropout argument: RUNTIME where the launch's form passes it."""
    def rule(c):
        on = c.get("HAS_DROPOUT") and (arg == "drop_scale"
                                       or (arg in DRAW_ARGS) == bool(c.get("DRAWN_DROPOUT")))
        return RUNTIME if on else None
    return rule


def _dbias_chunk() -> int:
    from bundlegen.engines.triton.launch import DBIAS_CHUNK
    return DBIAS_CHUNK


def _modified(c) -> bool:
    """A launch with some score modifier (the dBias kernel always has the bias), ALiBi slopes
    or dropout: its variants are compiled with every modifier too (launch.modified gives them
    the modifiers' compile options)."""
    return bool(c.get("HAS_BIAS", True) or c.get("SOFTCAP") or c.get("HAS_ALIBI") or c.get("HAS_DROPOUT"))


def _ragged(c) -> bool:
    return bool(c.get("RAGGED") or c.get("RAGGED_DB") or c.get("RAGGED_DS"))


def _alibi(c) -> bool:
    """HAS_ALIBI as compiled: as chosen on a padded launch; on with every modifier of a ragged
    one (the ragged modifier variants are new: one stand-in serves them all)."""
    return bool(c.get("HAS_ALIBI") or (_ragged(c) and _modified(c)))


def _used(c) -> bool:
    """HAS_USED_Q and HAS_USED_KV as compiled: both on where the launch reads either side's
    used lengths (the code of each side's bound), and in every ragged launch with dropout
    (one stand-in for those, with or without used lengths)."""
    return bool(c.get("HAS_USED_Q") or c.get("HAS_USED_KV") or (_ragged(c) and c.get("HAS_DROPOUT")))

#: constexprs (and the io dtype) a variant with at least their code stands for: name ->
#: (value compiled, given the choice's constexprs; why it has at least the chosen one's code)
REPRESENTED: dict[str, tuple[Any, str]] = {
    "HAS_LEFT": (lambda c: True, "a band with both sides compiles every mask branch the "
                                 "one-sided and unbounded kernels have, and their loop bounds"),
    "HAS_RIGHT": (lambda c: True, "as HAS_LEFT"),
    "EVEN": (lambda c: False, "the masked loads and stores: the whole-tile variant is the same "
                              "code without the masks"),
    "BLOCK_DQK": (lambda c: configs.CHUNK if c.get("BLOCK_DQK2") else configs.block_d(c["_tier"]),
                  "the tier's config with its widest head-dim tile: narrower tiles are the "
                  "same code on smaller tensors (two chunks: the first, always CHUNK wide)"),
    "BLOCK_DV": (lambda c: configs.CHUNK if c.get("BLOCK_DV2") else configs.block_d(c["_tier"]),
                 "as BLOCK_DQK (a padded launch in the two-chunk tier: the padded tile)"),
    "BLOCK_DQK2": (lambda c: c["_tier"] - configs.CHUNK if c["BLOCK_DQK2"] else 0,
                   "two chunks: the tier's widest second chunk; else 0 (no chunk code)"),
    "BLOCK_DV2": (lambda c: c["_tier"] - configs.CHUNK if c["BLOCK_DV2"] else 0, "as BLOCK_DQK2"),
    # the dBias kernel's head-dim chunks (launch.DBIAS_CHUNK, at most the tile): the tier's
    "CHUNK_QK": (lambda c: min(_dbias_chunk(), c["_tier"]), "as BLOCK_DQK"),
    "CHUNK_V": (lambda c: min(_dbias_chunk(), c["_tier"]), "as BLOCK_DQK"),
    "_io": (lambda c: IO, "fp16 is the same code with the fp16 MMA in place of the bf16 one"),
    # score modifiers: off, or all of them (the bias with the softcap has the code of each)
    "HAS_BIAS": (_modified, "bias and softcap together compile every modifier branch that "
                            "either alone has"),
    "SOFTCAP": (_modified, "as HAS_BIAS"),
    **{a: (lambda c: RUNTIME if _modified(c) else None,
           "None (a constexpr) without modifiers; the modified stand-in takes it at run time")
       for a in MODIFIER_ARGS},
    # dropout: as chosen (HAS_DROPOUT, DRAWN_DROPOUT are SWEPT), with every modifier on
    **{a: (_dropout_arg(a), "None (a constexpr) without dropout and in the other form's "
                            "launch; run time in its own") for a in DROPOUT_ARGS},
    "HAS_ALIBI": (_alibi, "the slopes' term is one more addend of the modified scores: a ragged "
                          "launch with any modifier compiles with it"),
    **{a: (lambda c: RUNTIME if _alibi(c) else None,
           "None (a constexpr) without ALiBi slopes; run time with them") for a in ALIBI_ARGS},
    **{a: (lambda c: RUNTIME if c.get("FUSED_DBIAS") else None,
           "None (a constexpr) unless the dK pass stores dBias; run time where it does")
       for a in FUSED_DBIAS_ARGS},
    "HAS_USED_Q": (_used, "both sides' used-length bounds have the code of either one's"),
    "HAS_USED_KV": (_used, "as HAS_USED_Q"),
    **{a: (lambda c: RUNTIME if _used(c) else None,
           "None (a constexpr) without used lengths; run time with them") for a in ("USED_Q", "USED_KV")},
    **{a: (lambda c: RUNTIME if c["ATOMIC_DQ"] else None,
           "None (a constexpr) without atomic dQ; the atomic variant takes it at run time")
       for a in aot.ATOMIC_DQ_ARGS},
}
OPTIONS = frozenset({"num_warps", "num_stages", "waves_per_eu", "matrix_instr_nonkdim"})


@dataclass(frozen=True)
class Choice:
    """One kernel launch as the launcher makes it: what Triton compiles it from."""
    kernel: str                               # bwd_preprocess | bwd_dkdv | bwd_dq
    constexprs: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...]
    io: str
    tier: int                                 # the config tier (largest BLOCK_D it serves)
    banded: bool = False                      # made with the tier's `banded` config
    atomic_config: bool = False               # made with the tier's `atomic_dq` config


class _Site:
    def __init__(self, recorder, fn):
        self.recorder, self.fn = recorder, fn

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.recorder.record(self.fn, args, kwargs)
        return call


class _Recorder:
    """Stands in for the kernels module: records each launch instead of running it."""
    def __init__(self, kernels):
        self.kernels, self.choices, self.tier, self.banded = kernels, set(), None, False
        self.atomic_config, self.signatures = False, {}

    def __getattr__(self, name):
        return _Site(self, getattr(self.kernels, name))

    def _signature(self, fn) -> tuple[list, frozenset, frozenset]:
        """A kernel's parameter names, as a list and a set, and its constexprs (read once per
        kernel: tens of thousands of launches are recorded)."""
        if fn not in self.signatures:
            self.signatures[fn] = (fn.arg_names, frozenset(fn.arg_names),
                                   frozenset(p.name for p in fn.params if p.is_constexpr))
        return self.signatures[fn]

    def record(self, fn, args, kwargs):
        names, params, declared = self._signature(fn)
        unknown = set(kwargs) - params - OPTIONS
        if unknown:
            raise ValueError(f"{fn.__name__}: launch passes {sorted(unknown)}, neither a "
                             f"parameter nor a known compile option")
        cons = {n: a for n, a in zip(names, args) if a is None}
        # keyword arguments: constexprs, or None (a constexpr to Triton); a run-time value
        # passed by keyword (runtime_ints.CHOICE_INTS) is no part of the variant
        cons.update({k: v for k, v in kwargs.items() if k in declared or (k in params and v is None)})
        missing = declared - set(cons)
        if missing:
            raise ValueError(f"{fn.__name__}: constexprs {sorted(missing)} not passed")
        # the io dtype (the dSinks kernel has none: its stand-in compiles with IO anyway)
        io = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}.get(str(args[0].dtype), "fp32")
        opts = {k: v for k, v in kwargs.items() if k in OPTIONS}
        self.choices.add(Choice(fn.__name__, tuple(sorted(cons.items())),
                                tuple(sorted(opts.items())), io, self.tier, self.banded,
                                self.atomic_config))


def probe_graphs(arch: str) -> list:
    """Graphs spanning every input launch.py decides on: ragged (with used lengths or not) or
    not, diagonal alignment, each mask kind, MHA / GQA / H_k != H_v, score modifiers, ALiBi
    slopes or neither, or dropout (the mask port's or drawn), every head-dim
    tile of the arch's tiers (and D_qk != D_v; 192 for the two-chunk kernels), both io dtypes,
    aligned or not (q's offset 1) or aligned with K broadcast (zero strides: no TMA
    descriptors), and 64-bit tile offsets or not (wide: q's row stride made 2^31 by
    _widened). Returns (graph, wide) pairs."""
    from bundlegen.graph import dense_graph, ragged_graph, with_modifiers
    dims = [(d, d) for d in (8, 16, 32, 64, 128, 192, 256)] + [(64, 128), (256, 32)]
    every = dict(bias="full", dbias=True, sinks=True, dsinks=True, softcap=5.0)
    out = []
    for ragged in (False, True):
        for alignment in ("TOP_LEFT", "BOTTOM_RIGHT"):
            for left, right in ((None, None), (None, 0), (8, None), (8, 3)):
                for heads in ((2, 2, 2), (4, 2, 2), (4, 2, 1)):
                    for d_qk, d_v in dims:
                        for dtype in ("bf16", "fp16"):
                            for layout in ("aligned", "unaligned", "broadcast-k"):
                                for wide in (False, True):
                                    sizes = dict(H_q=heads[0], H_k=heads[1], H_v=heads[2],
                                                 D_qk=d_qk, D_v=d_v, dtype=dtype,
                                                 alignment=alignment, left=left, right=right,
                                                 offsets={"q": 1} if layout == "unaligned" else {})
                                    if ragged:
                                        if layout != "broadcast-k":
                                            for used in ({}, {"seqused_q": (7, 6), "seqused_kv": (10, 8)}):
                                                g = ragged_graph((0, 9, 16), (0, 12, 20), **sizes, **used)
                                                out += [(g, wide), (with_modifiers(g, **every), wide),
                                                        (with_modifiers(g, alibi_slopes="batch"), wide)]
                                                out += [(with_modifiers(g, dropout=0.5, dropout_mask=m), wide)
                                                        for m in ("full", None)]
                                        continue
                                    if layout == "broadcast-k":   # aligned, no descriptors
                                        sizes["strides"] = {"k": (0, 0, d_qk, 1)}
                                    g = dense_graph(B=2, S_q=16, S_kv=20, **sizes)
                                    out += [(g, wide), (with_modifiers(g, **every), wide),
                                            (with_modifiers(g, alibi_slopes="head"), wide)]
                                    # dropout, through the mask port and drawn by the kernels
                                    out += [(with_modifiers(g, dropout=0.5, dropout_mask=m), wide)
                                            for m in ("full", None)]
    return out


def _widened(graph):
    """`graph` with q's row stride 2^31: one tile's rows span 2^31 elements or more (the
    capabilities rows see it, as the launcher does)."""
    q = graph.tensors["q"]
    strides = list(q.strides)
    strides[-2 if graph.ragged is None else 0] = 2 ** 31
    return dataclasses.replace(graph, tensors=dict(graph.tensors, q=dataclasses.replace(q, strides=tuple(strides))))


def launcher_choices(arch: str, graphs: Iterable | None = None) -> set[Choice]:
    """Every launch launch.py makes for the probe graphs (and `graphs`, wide=False) with the
    arch's table configs, recorded on meta tensors. Needs a process without TRITON_INTERPRET
    (the kernels as compiled for a GPU)."""
    from bundlegen.engines.triton import launch
    from bundlegen.engines.triton.capabilities import ROWS
    from bundlegen.engines.triton.engine import atomic_dq_serves, banded
    pairs = probe_graphs(arch) + [(g, False) for g in (graphs or ())]
    recorder = None
    for graph, wide in pairs:
        graph = _widened(graph) if wide else graph
        if ROWS[arch].mismatch(graph) is not None:
            continue
        # what the launches of both dQ forms share (prepare only reads the tensors)
        launched, tensors = graph.as_launched(), launch.meta_tensors(graph)
        plain = configs.config_for(arch, graph.D_qk, graph.D_v, banded(graph))
        tier = configs.ARCHS[arch].tier_of(configs.tier_key(graph.D_qk, graph.D_v))   # L.cfg's
        tier_cfg = configs.ARCHS[arch].for_block_d(tier)
        assert plain in (tier_cfg, tier_cfg.banded)
        for atomic in (False, True):   # atomic dQ or not
            if atomic and not atomic_dq_serves(graph, arch):
                continue
            cfg = configs.config_for(arch, graph.D_qk, graph.D_v, banded(graph), atomic)
            L = launch.prepare(launched, tensors, cfg, atomic_dq=atomic)
            if recorder is None:
                recorder = _Recorder(L.kernels)
            recorder.tier, recorder.banded, recorder.atomic_config = tier, plain != tier_cfg, cfg != plain
            launch.run(dataclasses.replace(L, kernels=recorder))
    return recorder.choices if recorder else set()


def bundle_graphs(root: str | Path | None = None) -> list:
    """The executed graphs of every level's checked-in bundles."""
    from bundlegen.engines.triton import warm
    root = Path(root or Path(__file__).resolve().parents[2] / "bundles")
    return warm.level_graphs(["quick", "pr", "nightly", "full"], str(root))


def label(kernel: str, cons: Mapping[str, Any], tier: int | None = None,
          banded: bool = False, atomic_config: bool = False) -> str:
    """The report's name of a variant:
    kernel/d<tier>[/banded][/atomic-config]/vec<n>/<offsets>/<dense|ragged>[/used][/mods]
    [/alibi][/drop|/drawn][/rows][/atomic-dq][/tma] (banded, atomic-config: from the tier's
    config for graphs with a band, for atomic-dQ launches, configs.config_for; used: reading the
    sequences' used lengths; mods: with the score modifiers (and so every dropout variant);
    alibi: and ALiBi slopes; drop, drawn: with dropout through the mask port, or drawn by the
    kernels; rows: the bias and dropout-mask tiles read in vectors (SCORE_VEC); atomic-dq:
    the dK pass adds dQ with atomics; tma: streamed tiles through tensor descriptors); the dSinks kernel, the same at every tier, dsinks/d<tier>[/ragged][/used]."""
    if kernel == "bwd_dsinks":
        return "/".join([f"dsinks/d{tier}"] + (["ragged"] if cons.get("RAGGED_DS") else [])
                        + (["used"] if cons.get("HAS_USED_Q") else []))
    name = {"bwd_preprocess": "preprocess", "bwd_dq": "dq", "bwd_dbias": "dbias"}.get(kernel)
    if name is None:
        name = {(True, True): "dkdv", (True, False): "dk", (False, True): "dv"}[
            (cons["COMPUTE_DK"], cons["COMPUTE_DV"])]
        if name != "dkdv" and cons["KV_SHARED"]:   # split passes over H_k == H_v
            name += "-shared-kv"
    if cons.get("BLOCK_DQK2"):                       # two chunks: d<first + second>
        name += "-2c"
    width = cons["BLOCK_DV"] + cons.get("BLOCK_DV2", 0) if "BLOCK_DV" in cons else tier
    parts = [name, f"d{width}"] + (["banded"] if banded else []) + (
        ["atomic-config"] if atomic_config else [])
    parts += [f"vec{cons['VEC']}", "wide" if cons["WIDE"] else "narrow",
              "ragged" if cons.get("RAGGED") or cons.get("RAGGED_DB") else "dense"]
    if cons.get("HAS_USED_Q") or cons.get("HAS_USED_KV"):
        parts.append("used")
    if cons.get("HAS_BIAS"):
        parts.append("mods")
    if cons.get("HAS_ALIBI"):
        parts.append("alibi")
    if cons.get("HAS_DROPOUT"):
        parts.append("drawn" if cons.get("DRAWN_DROPOUT") else "drop")
    if cons.get("SCORE_VEC", 1) > 1:
        parts.append("rows")
    if cons.get("ATOMIC_DQ"):
        parts.append("atomic-dq")
    if cons.get("FUSED_DBIAS"):
        parts.append("fused-dbias")
    if cons.get("TMA"):
        parts.append("tma")
    return "/".join(parts)


def variant_of(arch: str, choice: Choice) -> tuple[str, dict]:
    """(label, {"kernel", "constexprs", "options", "io"}) of the variant the sweep compiles for
    a launcher choice: SWEPT constexprs as chosen, REPRESENTED ones by their stand-in."""
    cons = dict(choice.constexprs)
    unknown = set(cons) - SWEPT - set(REPRESENTED)
    if unknown:
        raise ValueError(f"{choice.kernel}: constexpr(s) {sorted(unknown)} are neither SWEPT nor "
                         f"REPRESENTED in engines/triton/resources.py: the sweep would miss them")
    ctx = dict(cons, _tier=choice.tier)
    out = {k: (REPRESENTED[k][0](ctx) if k in REPRESENTED else v) for k, v in cons.items()}
    out = {k: v for k, v in out.items() if v != RUNTIME and not (k in ADDED_OFF and v == ADDED_OFF[k])}
    name = label(choice.kernel, out, choice.tier, choice.banded, choice.atomic_config)
    return name, {"kernel": choice.kernel, "constexprs": out, "options": dict(choice.options),
                  "io": REPRESENTED["_io"][0](ctx)}


def sweep_variants(arch: str, choices: Iterable[Choice]) -> dict[str, dict]:
    """label -> variant, for every variant the choices map to (a label with two different
    variants raises: the label would hide one)."""
    out: dict[str, dict] = {}
    for choice in choices:
        name, var = variant_of(arch, choice)
        if out.setdefault(name, var) != var:
            raise ValueError(f"{arch} {name}: two variants {out[name]} and {var}")
    return dict(sorted(out.items()))


def uncovered(variants: Mapping[str, Mapping], reported: Mapping[str, Mapping]) -> list[str]:
    """Labels of `variants` (from sweep_variants) the report has no entry for, or an entry
    compiled from other constexprs, options, kernel or io dtype."""
    keys = ("kernel", "constexprs", "options", "io")
    return sorted(n for n, v in variants.items()
                  if n not in reported or any(reported[n].get(k) != v[k] for k in keys))


# ----------------------------------------------------------------------------- the report

def arch_header(arch: str) -> dict:
    return {"limits": dataclasses.asdict(LIMITS[arch]),
            "configs": {str(limit): dataclasses.asdict(cfg)
                        for limit, cfg in configs.ARCHS[arch].tiers},
            "known_spills": {n: {"most_bytes": b, "reason": r}
                             for (a, n), (b, r) in sorted(KNOWN_SPILLS.items()) if a == arch}}


def json_form(obj: Any) -> Any:
    """obj as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(obj))


def report_text(report: Mapping) -> str:
    return json.dumps(report, sort_keys=True, indent=1) + "\n"


def load_report(path: Path = REPORT) -> dict:
    return json.loads(Path(path).read_text())


def triton_version() -> str:
    import triton
    return triton.__version__
