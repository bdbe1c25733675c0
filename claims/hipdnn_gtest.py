"""A hipDNN lane's results back (`bundlegen harvest --from-gtest RESULTS.xml`): the GTest
junit of `hipdnn_integration_tests` run on the exported bundles, each test's full name mapped
back to our case id through the export the current bundles give, turned into a results file
and run.json of our own form, which `bundlegen harvest` then reads like any run (same claim
rule, same evidence: the converted file is cited by sha256, and its run.json names the junit
by path and sha256).

A test's outcome: a `<failure>` is `fail:numeric` (a probe's: `rejection-accepted`), a
`<skipped>` whose message starts `[arch ` is a `[[test_skips]]` row (`skipped`), any other
skip the engine declining (`declined`, the message its reason), otherwise `pass` (a probe's:
`rejected`). hipDNN's junit records no margin; a test that records one as the property
`bundlegen.margin` (RecordProperty) has it, one without is never claimed (harvest's margin
rule). A run started with `--gtest_shuffle` (the junit's `random_seed`) records its order as
the junit lists its tests; otherwise it ran in registration order."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from bundlegen.graph import canonical_json
from bundlegen.results_file import RESULTS_NAME, RUN_NAME
from bundlegen.claims import hipdnn_format as fmt
from bundlegen.claims.hipdnn_export import Export, ExportError
from bundlegen.claims.harvest import sha256_of
from bundlegen.claims.provenance import workspace_digest
from bundlegen.harness.verdicts import DECLINED, FAIL_NUMERIC, PASS, REJECTED, REJECTION_ACCEPTED, SKIPPED

MARGIN_PROPERTY = "bundlegen.margin"
SKIP_ROW_PREFIX = "[arch "
CONVERTED_SUFFIX = ".bundlegen"
#: a converted run's selection: the cases the export holds, never the left-out ones
SELECTION = "hipdnn-export"
#: what a junit <testcase> says (not verdicts: _record turns them into ours)
GTEST_OK, GTEST_FAILURE, GTEST_SKIP = "ok", "failure", "skip"
#: the junit element (and `result` value) of a skipped test
JUNIT_SKIPPED = "skipped"


@dataclass(frozen=True)
class GTestResult:
    name: str                  # full GTest name, suite.test
    outcome: str               # GTEST_OK, GTEST_FAILURE or GTEST_SKIP
    message: str
    margin: float | None


def read_junit(path: Path) -> tuple[list[GTestResult], bool]:
    """Every <testcase> of a GTest junit, in document order, and whether the run was shuffled."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise ExportError(f"{path}: not a readable junit XML: {exc}") from None
    shuffled = root.get("random_seed") not in (None, "", "0")
    return [_result(tc) for tc in root.iter("testcase")], shuffled


def _result(tc: ET.Element) -> GTestResult:
    suite, test = tc.get("classname", ""), tc.get("name", "")
    failure, skipped = tc.find("failure"), tc.find(JUNIT_SKIPPED)
    margin = next((p.get("value") for p in tc.iter("property") if p.get("name") == MARGIN_PROPERTY), None)
    if failure is not None:
        outcome, message = GTEST_FAILURE, failure.get("message") or (failure.text or "")
    elif skipped is not None or tc.get("result") == JUNIT_SKIPPED:
        outcome, message = GTEST_SKIP, (skipped.get("message") if skipped is not None else "") or ""
    else:
        outcome, message = GTEST_OK, ""
    try:
        value = float(margin) if margin is not None else None
    except ValueError:
        value = None
    return GTestResult(name=f"{suite}.{test}", outcome=outcome, message=" ".join(message.split()), margin=value)


def ours(name: str) -> bool:
    """Whether a full GTest name lies in one of the export's sweeps."""
    suite = name.split(".", 1)[0]
    return f"_{fmt.OP_FOLDER}_Bundlegen_" in suite and suite.split("_", 1)[0] in fmt.TIERS.values()


def records(results: list[GTestResult], export: Export, engine: str, arch: str, path: Path) -> list[dict]:
    """Our result records of the junit's tests of the export; ExportError naming the first
    test of an exported sweep the export does not hold, or when it holds none of them."""
    by_name = {e.placement.gtest_name: e for e in export.exported}
    mine = [r for r in results if ours(r.name)]
    unknown = [r.name for r in mine if r.name not in by_name]
    if unknown:
        raise ExportError(f"{path}: test {unknown[0]} is no case of the current export "
                          f"({len(unknown)} unknown; exported from other bundles?)")
    if not mine:
        raise ExportError(f"{path}: names none of the exported cases ({len(results)} tests)")
    store = fmt.store_engine(engine)
    return [_record(r, by_name[r.name].case, store, arch) for r in mine]


def _record(r: GTestResult, case, store: str, arch: str) -> dict:
    probe = case.expected_rejection is not None
    if r.outcome == GTEST_OK:
        verdict, reason, detail = (REJECTED if probe else PASS), None, ""
    elif r.outcome == GTEST_FAILURE:
        verdict, reason, detail = (REJECTION_ACCEPTED if probe else FAIL_NUMERIC), None, r.message
    elif r.message.startswith(SKIP_ROW_PREFIX):
        verdict, reason, detail = SKIPPED, None, r.message.split("]", 1)[-1].strip()
    else:
        verdict, reason, detail = DECLINED, r.message or DECLINED, ""
    out = {"case_id": case.id, "engine": store, "arch": arch, "verdict": verdict, "purpose": case.purpose,
           "level": case.level, "detail": detail}
    if reason is not None:
        out["reason"] = reason
    if r.margin is not None and verdict == PASS:
        out["margin"] = r.margin
    return out


def run_json(junit: Path, recs: list[dict], export: Export, shuffled: bool, bundle_root: Path,
             plan: str | None) -> dict:
    """The converted run's run.json: the highest level it holds, complete when it holds
    every exported case up to that level, over the declared selection of the cases hipDNN
    can express (what `matrix --check` takes as covering the level), the bundles' digest it
    was mapped against."""
    levels = list(export.per_level)
    level = max((r["level"] for r in recs), key=levels.index)
    wanted = {e.case.id for e in export.exported if levels.index(e.case.level) <= levels.index(level)}
    run = {"level": level, "complete": wanted <= {r["case_id"] for r in recs}, "selection": SELECTION,
           "cases": len(recs), "bundles_digest": workspace_digest(bundle_root, level, plan),
           "source": {"junit": junit.name, "sha256": sha256_of(junit)}}
    if shuffled:
        run["order"] = [r["case_id"] for r in recs]
    return run


def converted_files(recs: list[dict], run: Mapping) -> dict[str, str]:
    """results.jsonl and run.json of the converted run."""
    return {RESULTS_NAME: "".join(json.dumps(r, sort_keys=True) + "\n" for r in recs),
            RUN_NAME: canonical_json(dict(run))}


def converted_dir(junit: Path) -> Path:
    return junit.with_name(junit.name.removesuffix(".xml") + CONVERTED_SUFFIX)


def convert_junits(junits: list[Path], engine: str, arch: str, bundle_root: Path, plan: str | None) -> list[Path]:
    """Each junit converted into `<junit stem>.bundlegen/` (results.jsonl, run.json) beside
    it; every junit is read and mapped before anything is written."""
    from bundlegen.claims.hipdnn_export import build_export, load_cases
    from bundlegen.claims.hipdnn_quarantine import write_text_whole

    if not arch or any(c.isspace() for c in arch):
        raise ExportError(f"--arch {arch!r}: give the device's base arch token (gfx942)")
    cases, plan_name, levels = load_cases(bundle_root, None, plan)
    export = build_export(cases, plan_name, levels, "-")
    planned = []
    for junit in map(Path, junits):
        results, shuffled = read_junit(junit)
        recs = records(results, export, engine, arch, junit)
        planned.append((converted_dir(junit), converted_files(recs, run_json(junit, recs, export, shuffled,
                                                                                bundle_root, plan))))
    for folder, files in planned:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            write_text_whole(folder / name, text)
    return [folder for folder, _ in planned]
