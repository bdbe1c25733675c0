"""The CPU mutation gate (mutants/ci_gate.py): every mutant of the catalog dies on the quick
level, run on the Triton engine in the Triton interpreter; and the gate goes red when the
one plan item that kills a mutant is taken out of the plan."""
import dataclasses

import pytest

from bundlegen.generator.generate import build, build_default
from bundlegen.mutants import catalog, ci_gate
from bundlegen.mutants.kill import KILLED, SURVIVED, load_cases
from bundlegen.plans.sdpa_bwd import PLAN

#: a mutant's NaN and overflow are expected; numpy warns of them inside the interpreter
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

#: a mutant that exactly one plan item kills at quick, and that item: the mutant changes only
#: ragged graphs with Q, K and V packed and other than two heads, and at quick only
#: SHP-RAGGED-QKV-PACKED-HEADS builds such a graph the Triton engine runs (the others draw
#: dropout, which it declines on a ragged batch)
SOLE_KILLER = ("ragged-qkv-packed-dq-last-head-lost", "SHP-RAGGED-QKV-PACKED-HEADS")


def _without(space, item: str):
    return dataclasses.replace(space, catalog=tuple(e for e in space.catalog if e.item != item),
                               regressions=tuple(r for r in space.regressions if r.item != item))


@pytest.fixture(scope="module")
def quick_cases():
    return load_cases(ci_gate.GATE.level)


@pytest.mark.parametrize("name", catalog.QUICK_CPU_NAMES)
def test_the_quick_level_kills(name, quick_cases):
    (result,) = ci_gate.run_gate([name], quick_cases).results
    assert result.status == KILLED, (
        f"mutant {name} ({result.status}{': ' + result.note if result.note else ''}) survived "
        f"the quick level after {result.cases_run} cases: the plan has a hole (add the case "
        f"that kills it; never loosen the mutant)")


def test_the_gate_fails_without_the_item_that_kills_a_mutant():
    mutant, item = SOLE_KILLER
    with_item = build_default().at_level("quick")   # build(PLAN), made once per process
    (killed,) = ci_gate.run_gate([mutant], with_item).results
    assert killed.status == KILLED and item in killed.kill.items

    without = dataclasses.replace(PLAN, padded=_without(PLAN.padded, item), ragged=_without(PLAN.ragged, item))
    cases = build(without).at_level("quick")
    assert cases and not any(item in c.items for c in cases)
    matrix = ci_gate.run_gate([mutant], cases)
    (survived,) = matrix.results
    assert survived.status == SURVIVED and survived.cases_run == len(cases)
    assert matrix.exit_code == 1
