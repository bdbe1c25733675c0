"""Workspace plans that extend the built-in plan (bundlegen.plans.extension): the whole loop
of an adopter through the real CLI in a fresh workspace (a failure in CI -> repro -> shrink
--into -> generate -> the case in the next run -> harvest and matrix), the bundles holding
only what the workspace adds, the built-in bundles' digest recorded and checked, and plan
declarations that are defined but not taken refused."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bundlegen.generator import extend
from bundlegen.generator.command import plan_module
from bundlegen.generator.errors import PlanError
from bundlegen.generator.plan_edit import EditError, inserted
from bundlegen.generator.write import bundle_texts, digest
from bundlegen.harness.bundles import load_level
from bundlegen.manifest import load_manifest
from bundlegen.plans.extension import Budget, Extension
from bundlegen.plans.records import CatalogEntry, Gated, Regression, Shape, Spec
from bundlegen.workspace import builtin_bundle_root

BASE = "sdpa_bwd"
FAILING_CASES = 3     # the cheapest built-in quick cases the planted bug fails
REMOVED_ITEM = "SHP-DROPOUT"

PLAN_MODULE = '''\
"""Our plan: the built-in one, with what our kernel needs besides."""
from bundlegen.plans.extension import Extension
from bundlegen.plans.records import CatalogEntry, Regression, Shape, Spec

REGRESSIONS = (
)

PLAN = Extension(
    name="my_attention",
    regressions=REGRESSIONS,
    catalog=(CatalogEntry("SHP-MY-DECODE", "our decode shape: one query, 16 keys",
                          (Spec(Shape(B=1, H_q=2, H_k=2, H_v=2, S_q=1, S_kv=16, D_qk=32, D_v=32)),)),),
    removed=("{removed}",),
)
'''

ENGINE_MODULE = '''\
"""torch-math with a planted bug: dK is half again too large once there are more than 16 keys."""
from bundlegen.engines.torch_math.engine import TorchMathEngine


class BuggyMath(TorchMathEngine):
    name = "buggy-math"

    def run(self, graph, tensors):
        super().run(graph, tensors)
        if graph.S_kv > 16:
            tensors["dk"].mul_(1.5)
'''
ENGINE = "buggy_engine:BuggyMath"


def _workspace(root: Path) -> Path:
    (root / "my_plans").mkdir()
    (root / "my_plans" / "__init__.py").write_text("")
    (root / "my_plans" / "attention.py").write_text(PLAN_MODULE.format(removed=REMOVED_ITEM))
    (root / "buggy_engine.py").write_text(ENGINE_MODULE)
    (root / "bundlegen.toml").write_text('plans = ["my_plans.attention"]\nengines = ["bundlegen-engines"]\n')
    return root


def _cli(ws: Path, *args: str, want: int | None = 0) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "bundlegen", *args], cwd=ws, capture_output=True,
                          text=True, timeout=300)
    if want is not None:
        assert done.returncode == want, f"bundlegen {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _results(out: Path) -> dict[str, dict]:
    return {r["case_id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}


def _failing_selection() -> str:
    """-k for the cheapest built-in quick claims with more than 16 keys (each fails the
    planted bug) and nothing a plain torch-math wrapper would treat apart: padded, no score
    modifier, no dropout, not deterministic."""
    cases = [c for c in load_level(builtin_bundle_root(), "quick", BASE).cases
             if c.purpose == "claim" and c.graph.ragged is None and c.graph.S_kv > 16 and not c.graph.modifiers
             and not c.graph.attributes.dropout_probability and not c.graph.attributes.deterministic_algorithm]
    cheapest = sorted(cases, key=lambda c: (c.cost.predicted_s, c.id))[:FAILING_CASES]
    assert len(cheapest) == FAILING_CASES
    return " or ".join(c.id for c in cheapest)


def _builtin_ids() -> set[str]:
    return {c.id for c in load_level(builtin_bundle_root(), "full", BASE).cases}


def test_an_adopter_workspace_goes_through_the_whole_loop(tmp_path):
    ws = _workspace(tmp_path)

    # 1. CI runs quick (a subset here) on the built-in bundles: the planted bug fails cases
    ci = _cli(ws, "run", "--level", "quick", "--engine", ENGINE, "--device", "cpu",
              "-k", _failing_selection(), "--out", "out/ci", want=1)
    failed = sorted(i for i, r in _results(ws / "out" / "ci").items() if r["verdict"] == "fail:numeric")
    assert failed, ci.stdout
    case = failed[0]
    assert f"quick/{BASE}/" in _results(ws / "out" / "ci")[case]["file"]

    # 2. repro explains the failure: dK, the port the bug touches
    repro = _cli(ws, "repro", case, "--engine", ENGINE, want=None)
    assert "fail:numeric" in repro.stdout and "dk[" in repro.stdout, repro.stdout

    # 3. shrink writes the minimal regression into the workspace's plan module
    plan_file = ws / "my_plans" / "attention.py"
    shrink = _cli(ws, "shrink", case, "--engine", ENGINE, "--into", "my_plans.attention", "--max-runs", "40")
    new_id = shrink.stdout.split("case id: ")[1].split()[0]
    item = f"REG-SHRUNK-{case.upper()}"
    text = plan_file.read_text()
    assert f'Regression("{item}"' in text and "S_kv=17" in text, text
    assert new_id not in _builtin_ids()

    # 4. generate writes only the cases the workspace adds; the manifest records both digests
    _cli(ws, "generate")
    bundles = ws / "bundles"
    own = sorted(p for p in bundles.rglob("*.json") if not p.name.endswith(".manifest.json"))
    ids = [c["id"] for p in own for c in json.loads(p.read_text())["cases"]]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 2, ids        # the regression and SHP-MY-DECODE
    assert new_id in ids and not set(ids) & _builtin_ids()                 # no built-in case is copied
    assert all(p.parent.name == "my_attention" for p in own)
    manifest = json.loads((bundles / "my_attention.manifest.json").read_text())
    assert manifest["extends"]["digest"] == load_manifest(builtin_bundle_root(), BASE).digest
    assert manifest["extends"]["removed"] == [REMOVED_ITEM]
    assert manifest["digest"] == digest({p.relative_to(bundles).as_posix(): p.read_text() for p in own})
    assert manifest["digest"] != manifest["extends"]["digest"]
    _cli(ws, "generate", "--check")

    # one level of both layers: the built-in cases (less the removed item's) and the added ones
    loaded = load_level(bundles, "quick")
    builtin_quick = load_level(builtin_bundle_root(), "quick", BASE).cases
    kept = [c for c in builtin_quick if REMOVED_ITEM not in c.items]
    assert len(kept) < len(builtin_quick)
    assert {c.id for c in loaded.cases} == {c.id for c in kept} | set(ids)
    from bundlegen.harness.repro import find_case
    assert find_case(new_id, bundles).id == new_id and find_case(case, bundles).id == case   # repro finds both

    # 5. the next run holds the new case, which fails as the original did, beside the built-in ones
    _cli(ws, "run", "--level", "quick", "--engine", ENGINE, "--device", "cpu",
         "-k", f"{item} or SHP-MY-DECODE or {case}", "--out", "out/next", want=1)
    nxt = _results(ws / "out" / "next")
    assert nxt[new_id]["verdict"] == "fail:numeric" and nxt[new_id]["file"].startswith("quick/my_attention/")
    assert nxt[case]["verdict"] == "fail:numeric" and nxt[case]["file"].startswith(f"built-in/quick/{BASE}/")
    assert {r["verdict"] for i, r in nxt.items() if i not in (new_id, case)} == {"pass"} and len(nxt) == 3
    # the pytest plugin collects both layers too
    collected = subprocess.run([sys.executable, "-m", "pytest", "--bundlegen-level", "quick", "--bundlegen-engine",
                                "torch-math", "--co", "-q", "-p", "no:xdist", "-p", "no:cacheprovider"],
                               cwd=ws, capture_output=True, text=True, timeout=300).stdout.splitlines()
    assert f"quick/my_attention/regressions.json::{new_id}" in collected, collected[-5:]
    assert any(line.startswith(f"built-in/quick/{BASE}/") and line.endswith(f"::{case}") for line in collected)

    # 6. harvest and matrix of the workspace read both layers
    _cli(ws, "run", "--level", "quick", "--engine", "torch-math", "--device", "cpu",
         "-k", f"{item} or SHP-MY-DECODE or {case}", "--out", "evidence/tm")
    _cli(ws, "harvest", "evidence/tm/results.jsonl", "--min-runs", "1")
    claims = (ws / "bundlegen-engines" / "torch_math" / "claims.json").read_text()
    assert new_id in claims and case in claims
    _cli(ws, "matrix")
    matrix = (ws / "SUPPORT_MATRIX.md").read_text()
    assert f"`{item}`" in matrix and "`SHP-MY-DECODE`" in matrix
    _cli(ws, "matrix", "--check")

    # 7. built-in bundles that changed since the workspace generated: a clear error everywhere
    path = bundles / "my_attention.manifest.json"
    stale = json.loads(path.read_text())
    stale["extends"]["digest"] = "sha256:" + "0" * 64
    path.write_text(json.dumps(stale))
    for args in (("run", "--level", "quick", "--engine", "torch-math", "--device", "cpu", "-k", "SHP-MY"),
                 ("harvest", "evidence/tm/results.jsonl", "--min-runs", "1"), ("matrix",)):
        done = _cli(ws, *args, want=2)
        err = (done.stdout + done.stderr).strip().splitlines()
        assert len(err) == 1 and "changed since this workspace generated" in err[0], (args, err)
        assert "sha256:" + "0" * 64 in err[0] and manifest["extends"]["digest"] in err[0]
    assert "differs in extends" in _cli(ws, "generate", "--check", want=1).stderr
    _cli(ws, "generate")
    _cli(ws, "generate", "--check")


def test_the_plan_adopting_shows_builds(tmp_path, monkeypatch):
    import re
    text = (Path(__file__).resolve().parents[1] / "docs" / "ADOPTING.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if b.startswith('"""my_plans/attention.py')]
    (tmp_path / "adopting_plan.py").write_text(block)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = plan_module("adopting_plan", None)
    generated = extend.build_extension(module.PLAN)
    assert [c.items for c in generated.cases if "SHP-MY-DECODE" in c.items]
    assert set(generated.extends.removed) == {"SHP-DROPOUT", "SHP-FP32"}


# ----------------------------------------------------------------------------- building an extension
def _ext(**fields) -> Extension:
    return Extension(name="my_attention", **fields)


_SMALL = Spec(Shape(B=1, H_q=1, H_k=1, H_v=1, S_q=5, S_kv=23, D_qk=16, D_v=16))


def test_an_extension_generates_only_its_additions():
    generated = extend.build_extension(_ext(regressions=(Regression("REG-OURS", "ours", "here", (_SMALL,)),)))
    (case,) = generated.cases
    assert case.purpose == "regression" and "REG-OURS" in case.items and case.level == "quick"
    assert case.id not in _builtin_ids()
    assert list(bundle_texts(generated)) == ["quick/my_attention/regressions.json"]


def test_ragged_entries_and_probes_go_where_their_specs_say():
    from bundlegen import reasons
    from bundlegen.plans.records import HeadConfig, HeadDims, Lengths, Probe, RaggedShape, attr
    ragged = Regression("REG-OURS-RAGGED", "ours", "here",
                        (Spec(RaggedShape(HeadConfig(2, 2, 2), HeadDims(16, 16), Lengths((5, 23))), layout="thd"),))
    probe = Probe("PRB-OURS-SCALE", "a negative scale", "frontend", reasons.SCALE_NONPOSITIVE,
                  Spec(Shape(1, 1, 1, 1, 8, 8, 16, 16), mutations=(attr("attn_scale", -1.0),)))
    generated = extend.build_extension(_ext(regressions=(ragged,), probes=(probe,)))
    by_group = {c.group: c for c in generated.cases}
    assert set(by_group) == {"ragged-regressions", "probes"}
    assert by_group["ragged-regressions"].graph.ragged is not None
    assert by_group["probes"].expected_rejection.reason == reasons.SCALE_NONPOSITIVE
    wrong = Probe("PRB-OURS-WRONG", "says the wrong code", "frontend", reasons.SCALE_NONFINITE, probe.spec)
    with pytest.raises(PlanError, match="the frontend gives 'scale-nonpositive'"):
        extend.build_extension(_ext(probes=(wrong,)))


def test_a_budget_is_taken():
    """A quick budget the built-in cases already fill leaves no room: the added case goes up."""
    reg = (Regression("REG-OURS", "ours", "here", (_SMALL,)),)
    cut = extend.build_extension(_ext(regressions=reg, budgets=(Budget("quick", seconds=1e-3),)))
    assert [c.level for c in cut.cases] == ["pr"]
    assert load_manifest(builtin_bundle_root(), BASE).levels[0].budget_seconds != 1e-3
    with pytest.raises(PlanError, match="cpu budget"):
        extend.build_extension(_ext(regressions=reg, budgets=(Budget("quick", cpu_seconds=1.0),)))


@pytest.mark.parametrize("ext, message", [
    (_ext(removed=("SHP-NO-SUCH",)), "removed: 'SHP-NO-SUCH' is not an item"),
    (_ext(regressions=(Regression("SHP-DROPOUT", "x", "y", (_SMALL,)),)), "already a built-in item"),
    (_ext(masks={"none": None}), "masks: 'none' is already a built-in name"),
    (_ext(budgets=(Budget("fast"),)), "budgets: 'fast' is not a level"),
    (Extension(name="sdpa_bwd"), "a name of its own"),
])
def test_an_extension_that_cannot_be_is_a_plan_error(ext, message):
    with pytest.raises(PlanError, match=message):
        extend.build_extension(ext)


def test_a_case_the_built_in_plan_already_has_is_refused():
    builtin = next(c for c in load_level(builtin_bundle_root(), "quick", BASE).cases if c.purpose == "claim"
                   and c.group == "shapes")
    from bundlegen.generator.spec_recover import spec_of_graph
    from bundlegen.plans.sdpa_bwd import PLAN
    spec = spec_of_graph(PLAN, builtin.graph, builtin.data.distribution, builtin.id,
                         bias_values=builtin.data.bias_values)
    with pytest.raises(PlanError, match=f"the same case as built-in case {builtin.id}"):
        extend.build_extension(_ext(catalog=(CatalogEntry("SHP-AGAIN", "again", (spec,)),)))


def test_gating_a_built_in_item_leaves_its_cases_out_and_shows_the_gate():
    generated = extend.build_extension(_ext(gated=(Gated(REMOVED_ITEM, "dropout", "waits on our RNG"),)))
    assert generated.extends.removed == (REMOVED_ITEM,)
    assert generated.cases == ()
    from bundlegen.generator.write import build_manifest
    assert REMOVED_ITEM in {g.item for g in build_manifest(generated).gates}


# ----------------------------------------------------------------------------- defined but not taken
def _module(tmp_path, monkeypatch, name: str, body: str):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_regressions_the_extension_does_not_take_are_an_error(tmp_path, monkeypatch):
    name = _module(tmp_path, monkeypatch, "ext_untaken", """
        from bundlegen.plans.extension import Extension
        from bundlegen.plans.records import Regression, Shape, Spec
        REGRESSIONS = (Regression("REG-OURS", "ours", "here", (Spec(Shape(1, 1, 1, 1, 5, 23, 16, 16)),)),)
        PLAN = Extension(name="mine")
    """)
    with pytest.raises(PlanError, match=r"REGRESSIONS is defined but PLAN does not take it \(pass it as "
                                        r"Extension\(regressions=REGRESSIONS\)\)"):
        plan_module(name, None)


def test_a_plan_module_that_re_exports_the_built_in_plan_cannot_add_to_it(tmp_path, monkeypatch):
    name = _module(tmp_path, monkeypatch, "reexport_untaken", """
        from bundlegen.plans.sdpa_bwd import *
        from bundlegen.plans.sdpa_bwd import PLAN
        REGRESSIONS = REGRESSIONS + (Regression("REG-OURS", "ours", "here", (Spec(Shape(1, 1, 1, 1, 5, 23, 16, 16)),)),)
    """)
    with pytest.raises(PlanError, match="REGRESSIONS is defined but PLAN does not take it.*Extension"):
        plan_module(name, None)


def test_a_declaration_an_extension_has_no_field_for_is_an_error(tmp_path, monkeypatch):
    name = _module(tmp_path, monkeypatch, "ext_levels", """
        from bundlegen.plans.extension import Extension
        from bundlegen.plans.sdpa_bwd import LEVELS
        LEVELS = LEVELS[:2]
        PLAN = Extension(name="mine")
    """)
    with pytest.raises(PlanError, match="LEVELS is defined but PLAN does not take it .an Extension takes only"):
        plan_module(name, None)


def test_a_misspelt_field_is_one_line(tmp_path, monkeypatch, capsys):
    _module(tmp_path, monkeypatch, "ext_misspelt", """
        from bundlegen.plans.extension import Extension
        PLAN = Extension(name="mine", regresions=())
    """)
    (tmp_path / "bundlegen.toml").write_text('plans = ["ext_misspelt"]\n')
    monkeypatch.chdir(tmp_path)
    from bundlegen.cli import main
    assert main(["generate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unexpected keyword argument 'regresions'" in err, err
    assert "(did you mean 'regressions'?)" in err


def test_a_misspelt_declaration_name_is_an_error_with_a_guess(tmp_path, monkeypatch):
    name = _module(tmp_path, monkeypatch, "ext_regresions", """
        from bundlegen.plans.extension import Extension
        from bundlegen.plans.records import Regression, Shape, Spec
        REGRESIONS = (Regression("REG-OURS", "ours", "here", (Spec(Shape(1, 1, 1, 1, 5, 23, 16, 16)),)),)
        MY_NOTES = "a constant of its own, spelling no declaration"
        PLAN = Extension(name="mine")
    """)
    with pytest.raises(PlanError, match=r"REGRESIONS is not a plan declaration \(did you mean 'REGRESSIONS'\?\)"):
        plan_module(name, None)


@pytest.mark.parametrize("body, cause", [
    ("import sys\nsys.exit(3)\n", "exits at import (SystemExit(3))"),
    ("raise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here"),
])
def test_a_module_that_exits_or_raises_at_import_is_one_line(tmp_path, monkeypatch, capsys, body, cause):
    name = _module(tmp_path, monkeypatch, f"ext_dies_{len(body)}", body)
    (tmp_path / "bundlegen.toml").write_text(f'plans = ["{name}"]\n')
    monkeypatch.chdir(tmp_path)
    from bundlegen.cli import main
    assert main(["generate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and name in err and cause in err, err


def test_the_built_in_plan_takes_every_declaration_it_defines():
    module = plan_module("bundlegen.plans.sdpa_bwd", None)
    assert extend.untaken(module, module.PLAN) == []


# ----------------------------------------------------------------------------- shrink --into's edit
DECLARATION = 'Regression("REG-X", "d", "s",\n           (Spec(Shape(1, 1, 1, 1, 5, 5, 16, 16)),)),'


@pytest.mark.parametrize("before", ["REGRESSIONS = (\n)\n", "REGRESSIONS = ()\n",
                                    "REGRESSIONS: tuple = (\n    OLD,\n)\n", "REGRESSIONS = (OLD,)\n",
                                    "REGRESSIONS = (\n    OLD,  # first\n)  # ours\nX = 1\n"])
def test_the_declaration_lands_at_the_end_of_regressions(before):
    after = inserted(before, DECLARATION, Path("m.py"))
    namespace = {"Regression": lambda *a: a[0], "Spec": lambda *a: a, "Shape": lambda *a: a, "OLD": "REG-OLD"}
    exec(after, namespace)
    items = list(namespace["REGRESSIONS"])
    assert items[-1] == "REG-X" and items[:-1] == (["REG-OLD"] if "OLD" in before else [])


@pytest.mark.parametrize("source, message", [("PLAN = 1\n", "has no module-level REGRESSIONS"),
                                             ("REGRESSIONS = A + B\n", "not a tuple literal")])
def test_no_place_for_the_declaration_is_one_line(source, message):
    with pytest.raises(EditError, match=message):
        inserted(source, DECLARATION, Path("m.py"))


def test_a_module_file_that_is_a_fifo_is_one_line_not_a_hang(tmp_path):
    """shrink --into reads and writes the plan module through the safe reader and writer."""
    import os
    import signal
    from bundlegen.generator.plan_edit import write_regression
    fifo = tmp_path / "mod.py"
    os.mkfifo(fifo)
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("shrink --into hung")))
    signal.alarm(20)
    try:
        with pytest.raises(EditError, match="a FIFO"):
            write_regression("mod", fifo, DECLARATION, "REG-X", lambda m: None)
    finally:
        signal.alarm(0)


def test_a_module_that_cannot_be_replaced_is_one_line(tmp_path, monkeypatch):
    """A write refused (read-only, or a folder the user may not write) is an EditError, and
    the file keeps its text."""
    from bundlegen import safe_write
    from bundlegen.generator import plan_edit
    module = tmp_path / "mod.py"
    module.write_text("REGRESSIONS = ()\n", encoding="utf-8")

    def refuse(path, text, **kw):
        raise safe_write.UnsafeWrite(f"{path}: permission denied: the file is read-only")
    monkeypatch.setattr(plan_edit.safe_write, "write_text", refuse)
    with pytest.raises(EditError, match="read-only"):
        plan_edit.write_regression("mod", module, DECLARATION, "REG-X", lambda m: None)
    assert module.read_text(encoding="utf-8") == "REGRESSIONS = ()\n"
