"""`bundlegen generate --dry-run` prints a short summary (counts per level, budgets, whether
every proof holds), `--report` the whole report; a dry run says what *would* be written; every
line fits 120 columns; an extension's report covers its whole plan (the built-in cases its
runs keep and its own), not only what it adds. Expected numbers come from the built-in
bundles' manifest and cases, never written down here."""
from __future__ import annotations

import argparse
from collections import Counter

import pytest

from bundlegen.generator import command, extend
from bundlegen.generator.generate import build_default
from bundlegen.generator.report_layout import WIDTH
from bundlegen.harness.bundles import load_level
from bundlegen.manifest import load_manifest
from bundlegen.plans.extension import Extension
from bundlegen.plans.records import Regression, Shape, Spec
from bundlegen.workspace import builtin_bundle_root

REMOVED = "SHP-DROPOUT"


def _args(**kw):
    return argparse.Namespace(**{"dry_run": False, "report": False, "check": False, "peer_gaps": False, **kw})


def _printed(capsys, plans, **kw) -> str:
    assert command.run(_args(**kw), plans, None) == 0
    return capsys.readouterr().out


@pytest.fixture(scope="module")
def builtin():
    return build_default()


@pytest.fixture(scope="module")
def bundled():
    """The built-in bundles' levels and cases (its highest level holds the lower ones),
    read once for the tests that count them."""
    root = builtin_bundle_root()
    levels = load_manifest(root).level_names
    return levels, load_level(root, levels[-1]).cases


def _level_counts(bundled) -> dict[str, int]:
    levels, cases = bundled
    counts = Counter(c.level for c in cases)
    return {lv: counts[lv] for lv in levels}


def test_a_dry_run_alone_prints_the_short_summary(builtin, bundled, capsys):
    out = _printed(capsys, [builtin], dry_run=True)
    lines = out.splitlines()
    counts = _level_counts(bundled)
    total = sum(counts.values())
    assert lines[0].startswith(f"plan sdpa_bwd: {total} cases would be written over")
    running = 0
    for level, count in counts.items():
        running += count
        row = next(line.split() for line in lines if line.split()[:1] == [level])
        assert row[1:3] == [str(count), str(running)] and row[-1] == "ok", row
    assert "proofs: all " in out and " hold" in out
    assert "quick on the cpu class: a run predicted at" in out
    assert len(lines) < 20 and max(map(len, lines)) <= WIDTH


def test_the_report_says_would_be_written_in_a_dry_run_and_fits_120_columns(builtin, capsys):
    dry = _printed(capsys, [builtin], dry_run=True, report=True)
    assert "would be written" in dry.splitlines()[0] and " cases written" not in dry
    assert "Coverage proof" in dry and "Legality:" in dry
    too_long = [line for line in dry.splitlines() if len(line) > WIDTH]
    assert not too_long, too_long[:3]


def test_an_extensions_report_covers_the_whole_plan(builtin, bundled, capsys):
    small = Spec(Shape(B=1, H_q=1, H_k=1, H_v=1, S_q=5, S_kv=23, D_qk=16, D_v=16))
    ext = extend.build_extension(Extension(name="my_attention", removed=(REMOVED,),
                                           regressions=(Regression("REG-OURS", "ours", "here", (small,)),)))
    out = _printed(capsys, [ext], dry_run=True, report=True)
    levels, cases = bundled
    kept = [c for c in cases if REMOVED not in c.items]
    assert out.splitlines()[0].startswith(f"plan my_attention: {len(kept) + 1} cases over {len(levels)} levels: "
                                          f"{len(kept)} built-in")
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split()[:1] and line.split()[0] in levels and line.split()[1].isdigit()}
    want = Counter(c.level for c in kept) + Counter({"quick": 1})
    running = 0
    for level in levels:
        running += want[level]
        assert rows[level][1:3] == [str(want[level]), str(running)], rows[level]
    # the CPU prediction counts the built-in quick cases too: within a second of the built-in plan's own
    summary = _printed(capsys, [ext], dry_run=True)
    cpu = float(summary.split("a run predicted at ")[1].split(" s")[0])
    base = float(_printed(capsys, [builtin], dry_run=True).split("a run predicted at ")[1].split(" s")[0])
    assert abs(cpu - base) < base * 0.5 and cpu > 10 * ext.cpu_seconds[ext.cases[0].id]
    assert max(map(len, (out + summary).splitlines())) <= WIDTH
