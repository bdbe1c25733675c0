"""The record types a test plan is declared with. Declarations only: no I/O, no logic
beyond building records. The generator (generator/) interprets them."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping

from bundlegen.cost import CostCoefficients, Measured
from bundlegen.tolerance import Tolerance

LEVEL_NAMES = ("quick", "pr", "nightly", "full")


# ----------------------------------------------------------------------------- axes
@dataclass(frozen=True)
class Axis:
    """A named test dimension. `core` axes get pair coverage by pr, all axes by nightly.
    An `extension` axis was added after the pair suites' rows were fixed: the suites first
    propose their rows with it at its default (the rows, and the cases' ids, they gave
    before), then add rows for the pairs it takes part in. Later passes work the same way:
    `joined` is the pass an axis joined (None: 1 for an extension axis, else 0) and
    `values_joined` the pass of each value added to an axis after its rows were fixed
    (absent: the axis's pass); each pass is told every earlier pass's rows are tested, so
    the earlier rows and ids stay. A value that joins later comes after the earlier ones."""
    name: str
    title: str
    values: tuple[str, ...]
    default: str
    core: bool = False
    extension: bool = False
    joined: int | None = None
    values_joined: Mapping[str, int] = field(default_factory=dict)

    @property
    def pass_joined(self) -> int:
        return (1 if self.extension else 0) if self.joined is None else self.joined

    def value_pass(self, value: str) -> int:
        return max(self.pass_joined, self.values_joined.get(value, 0))


@dataclass(frozen=True)
class Rule:
    """A legality rule: a combination whose values match every `when` entry must also match
    every `require` entry (axis -> allowed values), else it is excluded for `reason`."""
    name: str
    reason: str
    when: Mapping[str, tuple[str, ...]]
    require: Mapping[str, tuple[str, ...]]

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.when) | set(self.require)))


# ----------------------------------------------------------------------------- tables
@dataclass(frozen=True)
class HeadConfig:
    H_q: int
    H_k: int
    H_v: int


@dataclass(frozen=True)
class SeqPair:
    S_q: int
    S_kv: int


@dataclass(frozen=True)
class HeadDims:
    D_qk: int
    D_v: int


@dataclass(frozen=True)
class MaskSpec:
    left_bound: int | None
    right_bound: int | None
    alignment: str = "TOP_LEFT"


@dataclass(frozen=True)
class Layout:
    """Storage kind per port (the 8 tensors other than stats; kinds are implemented in
    generator/layouts.py). `stats_batch_broadcast` gives stats a zero batch stride, which
    is only consistent when Q, K, V and dO are broadcast over the batch too."""
    ports: Mapping[str, str]
    stats_batch_broadcast: bool = False


@dataclass(frozen=True)
class BiasKind:
    """An additive bias (docs/CONTRACTS.md, "Score modifiers"): which axes it broadcasts
    over (bundlegen.graph.BIAS_BROADCASTS: full | batch | head | both) and what it holds
    (bundlegen.graph.BIAS_VALUES: randn | alibi)."""
    broadcast: str
    values: str = "randn"


# ----------------------------------------------------------------------------- concrete cases
@dataclass(frozen=True)
class Shape:
    B: int
    H_q: int
    H_k: int
    H_v: int
    S_q: int
    S_kv: int
    D_qk: int
    D_v: int


@dataclass(frozen=True)
class Mutation:
    """A deliberate change to a built graph: `dims`/`stride` of one port's axis, a port's
    `dtype`, or an attribute (`attr`, with `target` the attribute name)."""
    kind: str            # dims | stride | dtype | attr | reshape
    target: str          # port, or attribute name for kind == attr
    axis: int | None
    value: Any


def dims(port: str, axis: int, value: int) -> Mutation:
    return Mutation("dims", port, axis, value)


def stride(port: str, axis: int, value: int) -> Mutation:
    return Mutation("stride", port, axis, value)


def dtype(port: str, value: str) -> Mutation:
    return Mutation("dtype", port, None, value)


def attr(name: str, value: Any) -> Mutation:
    return Mutation("attr", name, None, value)


def drop(port: str) -> Mutation:
    """Remove a port (a modifier output without its input: a frontend probe)."""
    return Mutation("drop", port, None, None)


def reshape(port: str, dims: tuple[int, ...], strides: tuple[int, ...]) -> Mutation:
    """A port's whole dims and strides, after its storage kind placed it (its rank may change)."""
    return Mutation("reshape", port, None, (tuple(dims), tuple(strides)))


@dataclass(frozen=True)
class Lengths:
    """Per-sequence lengths of a ragged batch (DESIGN section 10): q side, kv side (None:
    the q lengths). The sequences are packed one after the other."""
    q: tuple[int, ...]
    kv: tuple[int, ...] | None = None

    @property
    def kv_lengths(self) -> tuple[int, ...]:
        return self.q if self.kv is None else self.kv


@dataclass(frozen=True)
class Offsets:
    """Explicit cu_seqlens (probes and regressions that place sequences by hand), with the
    token rows of storage and the max_seqlen bounds (None: the last offset, the longest length)."""
    cu_q: tuple[int, ...]
    cu_kv: tuple[int, ...] | None = None     # None: cu_q
    T_q: int | None = None
    T_kv: int | None = None
    max_q: int | None = None
    max_kv: int | None = None
    used_q: tuple[int, ...] | None = None    # seqused_q (a padded varlen batch); None: none
    used_kv: tuple[int, ...] | None = None   # seqused_kv


PADDED, RAGGED = "padded", "ragged"      # a graph's storage: padded [B, H, S, D] or ragged tokens


@dataclass(frozen=True)
class RaggedShape:
    """A ragged graph's sizes: heads, head dims and the sequences (lengths packed from the
    token storage's lead rows on, or explicit offsets)."""
    heads: HeadConfig
    head_dims: HeadDims
    lengths: Lengths | Offsets


@dataclass(frozen=True)
class ModifierSet:
    """A value of the ragged space's modifiers axis: the score modifiers a ragged graph gets,
    by names from the plan's tables (Spec's fields of the same names)."""
    bias: str = "none"
    dbias: str = "off"
    sinks: str = "off"
    softcap: str = "off"
    alibi_slopes: str = "off"

    def fields(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Spec:
    """One concrete graph, by names from the plan's tables (layout, stats layout, mask,
    scale, distribution) plus per-port storage-kind overrides and mutations.

    `storage` follows from `shape`: a Shape is a padded graph, whose `layout` names one of
    Plan.layouts; a RaggedShape a ragged one, whose `layout` names one of the ragged space's
    token storages (its other padded-only fields stay at their defaults)."""
    shape: Shape | RaggedShape
    dtype: str = "bf16"
    layout: str = "bhsd"
    stats_layout: str = "packed"
    mask: str = "none"
    scale: str = "default"
    distribution: str = "randn"
    port_kinds: Mapping[str, str] = field(default_factory=dict)
    mutations: tuple[Mutation, ...] = ()
    # score modifiers, by names from the plan's tables (Plan.biases, .switches, .softcaps)
    bias: str = "none"
    dbias: str = "off"
    sinks: str = "off"       # "on": the sinks input and its dsinks output
    softcap: str = "off"
    # dropout, by names from Plan.dropouts (p; None: off) and Plan.dropout_masks (the mask
    # port's broadcast kind; None: no mask port, the engine draws its own)
    dropout: str = "off"
    dropout_mask: str = "full"
    deterministic: str = "off"   # "on": the graph asks for the engine's deterministic backward
    #: ALiBi slopes, by name from Plan.alibi_slopes (the port's form; None: no slopes)
    alibi_slopes: str = "off"
    seqused: str = "off"         # ragged only: a name from Space.seqused (per-sequence used lengths)
    storage: str = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "storage", RAGGED if isinstance(self.shape, RaggedShape) else PADDED)


def one_storage(specs: tuple[Spec, ...], owner: str) -> str:
    """The storage every spec of an entry shares; ValueError when they mix or there are none."""
    found = {s.storage for s in specs}
    if len(found) != 1:
        raise ValueError(f"{owner}: its specs must all be padded or all ragged, got {sorted(found) or 'none'}")
    return found.pop()


@dataclass(frozen=True)
class _StoredEntry:
    """What a declared entry (catalog entry, regression, probe) has besides its own fields:
    the lowest level it may go to (the cost model may raise it), its group, and its storage,
    padded or ragged as its specs are. An empty `group` is filled from `GROUPS[storage]`."""
    GROUPS: ClassVar[Mapping[str, str]] = {}
    level: str = field(default="quick", kw_only=True)
    group: str = field(default="", kw_only=True)
    storage: str = field(init=False)

    def __post_init__(self):
        specs = self.specs if hasattr(self, "specs") else (self.spec,)
        object.__setattr__(self, "storage", one_storage(specs, f"{type(self).__name__} {self.item}"))
        if not self.group:
            object.__setattr__(self, "group", self.GROUPS[self.storage])


# ----------------------------------------------------------------------------- plan entries
@dataclass(frozen=True)
class PairSuite:
    """allpairspy over the `scope` axes ('core' or 'all'); axes outside the scope stay at
    their defaults. Every legal pair in scope must be covered by `level`."""
    item: str
    title: str
    group: str
    scope: str
    level: str


@dataclass(frozen=True)
class CatalogEntry(_StoredEntry):
    """A named shape (or a few) with the reason it is in the plan."""
    GROUPS: ClassVar[Mapping[str, str]] = {PADDED: "shapes", RAGGED: "ragged-shapes"}
    item: str
    purpose: str
    specs: tuple[Spec, ...]


@dataclass(frozen=True)
class Sweep:
    """An exhaustive product: `base` with every combination of `vary` (Spec field -> values)."""
    item: str
    purpose: str
    base: Spec
    vary: tuple[tuple[str, tuple[Any, ...]], ...]
    level: str
    group: str = "sweeps"


@dataclass(frozen=True)
class Regression(_StoredEntry):
    """A defect class seen in the reference documents, pinned as valid graphs."""
    GROUPS: ClassVar[Mapping[str, str]] = {PADDED: "regressions", RAGGED: "ragged-regressions"}
    item: str
    defect: str
    source: str
    specs: tuple[Spec, ...]


@dataclass(frozen=True)
class Probe(_StoredEntry):
    """A graph that must be rejected: by the frontend validator or by every engine (padded),
    or, ragged, by the frontend (offsets it can see) or by the engine's device code
    (`by` = "device": valid but for its offset values, which break `reason`; judged by what
    the engine touches)."""
    GROUPS: ClassVar[Mapping[str, str]] = {PADDED: "probes", RAGGED: "ragged-probes"}
    item: str
    title: str
    by: str          # frontend | engine (padded) | device (ragged)
    reason: str      # a code from bundlegen.reasons
    spec: Spec


@dataclass(frozen=True)
class Gated:
    """Declared, not written: waits on `gate`."""
    item: str
    title: str
    gate: str
    planned_cases: int = 1


# ----------------------------------------------------------------------------- ragged (THD) graphs
@dataclass(frozen=True)
class TokenStorage:
    """How a ragged graph's token-major ports are stored (generator/layouts.py places them):
    `kind` names the [T, H, D] storage kind of the eight data ports, `stats` the kind of
    stats [T_q, H_q, 1]; `offset` elements precede every port's view; `lead` and `tail` token
    rows before cu_seqlens[0] and after cu_seqlens[B] belong to no sequence. `packed`
    (layouts.PACKED_SLOTS: "qkv" or "kv", "" none) puts Q, K, V (or K, V) and their
    gradients in the slots of one [T, n, H, D] buffer each, FlashAttention's varlen
    qkvpacked / kvpacked: token stride n*H*D, slot s at element offset s*H*D."""
    kind: str = "thd"
    stats: str = "stats-ht"
    offset: int = 0
    lead: int = 0
    tail: int = 0
    packed: str = ""


@dataclass(frozen=True)
class SeqUsed:
    """Per-sequence used lengths of a padded varlen batch (Ragged.seqused_*): on each side
    whose pad is not None, sequence b uses max(0, length_b - pad) rows and the rest of its
    range is padding; None: that side has no used lengths."""
    q_pad: int | None = None
    kv_pad: int | None = None


@dataclass(frozen=True)
class Space:
    """One axis space of a plan, pair-proved on its own, with the entries declared in it:
    the padded graphs' or the ragged (THD / varlen) graphs' (`storage`). A ragged and a padded
    graph share no storage kind, sequence pair or batch, so one space with a batch-kind axis
    would pair values that never meet. Every entry's specs have the space's storage.

    Padded axis names: generator/expand.py; items AX-<AXIS>-<VALUE>. Ragged axis names:
    dtype, heads, head_dims, mask, scale, distribution (values: keys of the plan's tables),
    lengths and storage (keys of `lengths` and `storages`); items AX-RAGGED-<AXIS>-<VALUE>."""
    storage: str                           # padded | ragged
    axes: tuple[Axis, ...]
    rules: tuple[Rule, ...]
    value_suite_item: str                  # the quick one-value-at-a-time suite
    pair_suites: tuple[PairSuite, ...]
    catalog: tuple[CatalogEntry, ...] = ()
    sweeps: tuple[Sweep, ...] = ()         # padded only
    regressions: tuple[Regression, ...] = ()
    probes: tuple[Probe, ...] = ()
    lengths: Mapping[str, Lengths] = field(default_factory=dict)          # ragged only
    storages: Mapping[str, TokenStorage] = field(default_factory=dict)    # ragged only
    modifiers: Mapping[str, ModifierSet] = field(default_factory=dict)    # ragged only
    seqused: Mapping[str, SeqUsed | None] = field(default_factory=dict)   # ragged only (None: off)


# ----------------------------------------------------------------------------- boundary values
SIDES = ("below", "at", "above")      # T - 1, T, T + 1 for a tile T


@dataclass(frozen=True)
class BoundarySet:
    """Graphs of one boundary class: `base` with the class's quantity set to each of
    `values` (None: every value the class declares), from `level` on."""
    base: Spec
    values: tuple[int, ...] | None = None
    level: str = "pr"


@dataclass(frozen=True)
class BoundaryClass:
    """Values just below, at and just above each tile of one quantity (generator/boundaries.py
    names the quantities: how a value is set on a base spec and read back from a graph).
    `extras`: values beyond the tiles; `cap`: the largest value declared (an engine's limit).
    A unit of the proof is (tile, side) or ("extra", value)."""
    item: str
    title: str
    quantity: str
    tiles: tuple[int, ...]
    sets: tuple[BoundarySet, ...]
    extras: tuple[int, ...] = ()
    cap: int | None = None
    group: str = "boundaries"


@dataclass(frozen=True)
class BoundaryPlan:
    """The tile sizes that matter (named sets, for where each number comes from) and the
    boundary classes. Every class has a value by `each_class_by`; every unit of every class
    by `every_value_by`. `grid_rows`: query rows per program in the grid quantity."""
    tiles: Mapping[str, tuple[int, ...]]
    classes: tuple[BoundaryClass, ...]
    each_class_by: str = "quick"
    every_value_by: str = "pr"
    grid_rows: int = 64


# ----------------------------------------------------------------------------- risk interactions
@dataclass(frozen=True)
class RiskPlan:
    """Risky values of some axes (axis -> value -> rank, 1 the riskiest) and the 3-way
    combinations of them the plan must hold: every legal triple of risky values of three
    different axes by `every_by`; every triple whose values are all of rank <= `top_rank`
    by `top_by`; and at `sample_at` a first sample of those: the `sample` cheapest rows (on
    the cpu class) of the top suite. `ranking` says how the ranks were given."""
    item: str
    title: str
    values: Mapping[str, Mapping[str, int]]
    ranking: str
    top_rank: int = 1
    every_by: str = "nightly"
    top_by: str = "pr"
    sample_at: str = "quick"
    sample: int = 4
    group: str = "risks"


# ----------------------------------------------------------------------------- levels, cost, tolerance
@dataclass(frozen=True)
class Level:
    """Per-case ceilings (h200 prediction) and the cumulative budget of this level and every
    lower one, of which `reserve` is kept free. `per_case_cpu_seconds` and
    `cpu_budget_seconds` (quick only) keep the level runnable by CI on a CPU: each case, and
    the whole `bundlegen run` of the level (its cases spread over `cpu_workers` workers, and
    the run's start), on the cpu class."""
    name: str
    per_case_seconds: float
    per_case_bytes: int
    budget_seconds: float
    reserve: float = 0.05
    per_case_cpu_seconds: float | None = None
    cpu_budget_seconds: float | None = None
    cpu_workers: int = 1          # the workers a CPU run of the level spreads its cases over
    pair_scope: str = "all"       # values | core | all: the coverage this level must prove


# ----------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Plan:
    name: str
    padded: Space                          # the padded graphs' axis space and entries
    heads: Mapping[str, HeadConfig]
    seqs: Mapping[str, SeqPair]
    head_dims: Mapping[str, HeadDims]
    batches: Mapping[str, int]
    layouts: Mapping[str, Layout]
    stats_layouts: Mapping[str, str]       # name -> stats storage kind
    masks: Mapping[str, MaskSpec]
    scales: Mapping[str, float | None]     # None: 1/sqrt(D_qk)
    distributions: tuple[str, ...]
    dtypes: tuple[str, ...]
    gated: tuple[Gated, ...]
    levels: tuple[Level, ...]
    cost_model: Mapping[str, CostCoefficients]
    tolerance_classes: Mapping[str, Tolerance]   # class name -> its bound (name, dtype set)
    tolerance_rule: Callable[[Any], str]   # graph -> tolerance class name
    min_claim_margin: float                # harvest claims a case only at this margin or more
    cpu_case_limit_s: float                # the harness skips a case predicted slower on CPU
    ragged: Space | None = None            # ragged (THD / varlen) graphs: their own axis space
    peers: "PeerPlan | None" = None        # peer suites' grids: reference data for the peer coverage
    boundaries: BoundaryPlan | None = None # values around the tile sizes, proved per level
    risks: RiskPlan | None = None          # risky values whose 3-way combinations are proved per level
    #: by this level every layout value has a case that is no other layout's memory with
    #: B, H and S >= 2, and head-dim tails at every gradient port (generator/layout_distinct.py)
    distinct_layouts_by: str | None = None
    #: score modifiers: bias kinds (None: no bias), on/off switches (dbias, sinks) and
    #: softcap values (None: off)
    biases: Mapping[str, BiasKind | None] = field(default_factory=lambda: {"none": None})
    switches: Mapping[str, bool] = field(default_factory=lambda: {"off": False, "on": True})
    softcaps: Mapping[str, float | None] = field(default_factory=lambda: {"off": None})
    #: dropout probabilities (None: off) and dropout-mask broadcast kinds (None: no mask port)
    dropouts: Mapping[str, float | None] = field(default_factory=lambda: {"off": None})
    dropout_masks: Mapping[str, str | None] = field(default_factory=lambda: {"full": "full"})
    #: ALiBi slopes port forms (bundlegen.graph.ALIBI_SLOPES_DIMS; None: no slopes)
    alibi_slopes: Mapping[str, str | None] = field(default_factory=lambda: {"off": None})
    #: cost class -> what its last calibration measured per level (the dry-run report's
    #: "last measured" column; written by `bundlegen calibrate --write`)
    cost_measured: Mapping[str, Measured] = field(default_factory=dict)

    def space(self, storage: str) -> Space:
        """The axis space of `storage` (padded | ragged); KeyError when the plan has none."""
        found = {PADDED: self.padded, RAGGED: self.ragged}.get(storage)
        if found is None:
            raise KeyError(f"plan {self.name!r} has no {storage} space")
        return found


# ----------------------------------------------------------------------------- peer grids (reference data)
@dataclass(frozen=True)
class PeerTest:
    """One published test function's backward grid, as its parametrize values on the axes
    we share (dtype, head_dims, seq, group, mask, layout). Values are the peer's facts
    ((D_qk, D_v), (S_q, S_kv), (H_q, H_k) tuples, or names of declared ranges); the plan's
    mapping rules turn them into value classes. An axis the test does not vary has one value;
    an axis it has no say on (or we could not find) is absent."""
    name: str
    axes: Mapping[str, tuple[Any, ...]]


@dataclass(frozen=True)
class PeerGrid:
    """A peer suite's backward tests: `source` cites the file (repository, path, commit);
    `missing` says what could not be found and is therefore not declared."""
    name: str
    source: str
    tests: tuple[PeerTest, ...]
    missing: tuple[str, ...] = ()
    cases: int | None = None     # the peer's own backward case count, when known


@dataclass(frozen=True)
class PeerPlan:
    """The peer grids with the rules that map their values onto ours (plans/peers.py):
    `peer_classes` maps a peer's value on an axis to value classes, `case_classes` a case's
    own facts (a mapping of plain numbers and names; generator/peer_coverage.py lists them)."""
    grids: tuple[PeerGrid, ...]
    axes: tuple[str, ...]
    peer_classes: Callable[[str, Any], frozenset]        # (axis, peer value) -> classes
    case_classes: Callable[[str, Mapping[str, Any]], frozenset]   # (axis, case facts) -> classes
    targets: Mapping[str, float]                         # level -> least share of each peer's pairs
