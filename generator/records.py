"""The generator's own records: drafts (a case before it has an id and a level) and the
generated plan that every output (bundles, TOML block, report, --check) is rendered from."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from bundlegen.graph import Case, Graph, Rejection
from bundlegen.manifest import Extends, Manifest
from bundlegen.plans.records import PADDED, Plan

Combo = tuple[str, ...]                       # one value per plan axis, in plan order
Pair = tuple[tuple[str, str], tuple[str, str]]   # ((axis, value), (axis, value)), axes in plan order


@dataclass(frozen=True)
class Draft:
    """What one plan entry produces for one graph."""
    entry: str                 # names the plan entry in errors and the report
    group: str
    purpose: str
    items: tuple[str, ...]
    graph: Graph
    distribution: str
    rejection: Rejection | None
    min_level: str
    combo: Combo | None = None
    space: str = PADDED        # the axis space `combo` belongs to: padded | ragged
    bias_values: str = "randn" # what a bias input holds (bundlegen.graph.BIAS_VALUES)


@dataclass(frozen=True)
class PairProof:
    level: str
    scope: str                 # values | core | all
    total: int
    covered: int
    missing: tuple[tuple, ...]
    space: str = PADDED        # padded | ragged

    @property
    def complete(self) -> bool:
        return self.covered == self.total


@dataclass(frozen=True)
class RiskProof:
    """The risky triples (plan.risks) the cases of one level and every lower one hold:
    `required` is what the level must hold (none, sample, top or every); `top` counts the
    triples of the riskiest values, `every` all of them."""
    level: str
    required: str
    top_total: int
    top_covered: int
    total: int
    covered: int
    missing: tuple[tuple, ...]      # of what the level requires

    @property
    def complete(self) -> bool:
        return not self.missing


@dataclass(frozen=True)
class BoundaryProof:
    """One boundary class at one level (cumulative): the units its cases realise.
    `required`: none, one (some unit of the class) or every (unit)."""
    level: str
    item: str
    required: str
    total: int
    covered: tuple[tuple, ...]
    missing: tuple[tuple, ...]

    @property
    def complete(self) -> bool:
        if self.required == "every":
            return not self.missing
        return bool(self.covered) or self.required == "none"


@dataclass(frozen=True)
class RuleExclusion:
    rule: str
    reason: str
    axes: tuple[str, ...]
    excluded: int              # value combinations over the rule's own axes it excludes
    combinations: int          # value combinations over the rule's own axes
    illegal_pairs: int         # value pairs that no legal combination contains because of it


@dataclass(frozen=True)
class GeneratedPlan:
    plan: Plan
    cases: tuple[Case, ...]                       # ordered by level, group, id
    combos: Mapping[str, tuple[Combo, ...]]       # case id -> the axis combinations it realises
    entries: Mapping[str, tuple[str, ...]]        # case id -> the plan entries that produced it
    cpu_seconds: Mapping[str, float]              # case id -> predicted seconds on the cpu class
    proofs: tuple[PairProof, ...]
    exclusions: tuple[RuleExclusion, ...]
    illegal_pairs: int
    repaired_pairs: tuple[Pair, ...]              # pairs allpairspy missed, added as repair cases
    legality_violations: tuple[str, ...]
    items: Mapping[str, str]                      # every non-gated item id -> title
    # the ragged space (plan.ragged): its combinations, proofs and rule exclusions
    ragged_combos: Mapping[str, tuple[Combo, ...]] = field(default_factory=dict)
    ragged_proofs: tuple[PairProof, ...] = ()
    ragged_exclusions: tuple[RuleExclusion, ...] = ()
    ragged_illegal_pairs: int = 0
    boundary_proofs: tuple[BoundaryProof, ...] = ()    # plan.boundaries: per level and class
    risk_proofs: tuple[RiskProof, ...] = ()            # plan.risks: per level
    layout_proof: "object | None" = None               # generator/layout_distinct.py: LayoutProof
    focus_proofs: tuple = ()                           # plan.focus: per entry and level (generator/focus.py)
    # a workspace plan that extends the built-in one (generator/extend.py): what its manifest
    # records of the built-in bundles, and their manifest (its axes, sections and gates)
    extends: Extends | None = None
    base_manifest: Manifest | None = None
    base_gates: tuple = ()          # plans.records.Gated entries of the extension that gate built-in items
    base_cases: tuple[Case, ...] = ()   # an extension's built-in cases that its runs keep (not written)

    def at_level(self, level: str) -> tuple[Case, ...]:
        """The cases a run of `level` executes: that level and every lower one."""
        names = [lv.name for lv in self.plan.levels]
        upto = set(names[: names.index(level) + 1])
        return tuple(c for c in self.cases if c.level in upto)

    def only_level(self, level: str) -> tuple[Case, ...]:
        return tuple(c for c in self.cases if c.level == level)

    @property
    def untraced_items(self) -> tuple[str, ...]:
        used = {i for c in self.cases for i in c.items}
        return tuple(sorted(i for i in self.items if i not in used))

    @property
    def cases_without_items(self) -> tuple[str, ...]:
        return tuple(sorted(c.id for c in self.cases if not c.items))

    @property
    def unknown_items(self) -> tuple[str, ...]:
        """Items cases trace to that the plan does not declare (or declares gated)."""
        return tuple(sorted({i for c in self.cases for i in c.items if i not in self.items}))
