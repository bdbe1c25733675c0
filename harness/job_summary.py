"""A junit file as Markdown for a CI job's summary page (GitHub's $GITHUB_STEP_SUMMARY):
the counts per suite, then the failures and errors, one table row each."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

#: failing test cases listed in the summary; the rest are counted
LIST_FAILING = 50


def junit_markdown(path: Path | str, title: str | None = None) -> str:
    """The summary of the junit file at `path`; a missing or unreadable file is said in one
    line (the run stopped before writing it), not an error: the step runs whatever the run did."""
    path = Path(path)
    heading = f"### {title or f'bundlegen: {path}'}\n\n"
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        return heading + f"No junit results at `{path}` ({exc.__class__.__name__}: the run wrote none).\n"
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    rows, failing = [], []
    for suite in suites:
        cases = suite.findall("testcase")
        counts = {kind: sum(1 for c in cases if c.find(kind) is not None) for kind in ("failure", "error", "skipped")}
        passed = len(cases) - sum(counts.values())
        rows.append(f"| {suite.get('name', '')} | {len(cases)} | {passed} | {counts['failure']} | "
                    f"{counts['error']} | {counts['skipped']} |")
        for case in cases:
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if bad is not None:
                message = " ".join((bad.get("message") or bad.tag).split()).replace("|", "\\|")
                failing.append(f"| `{case.get('name', '')}` | {case.get('classname', '')} | {message[:300]} |")
    lines = [heading.rstrip("\n"), "", "| suite | tests | passed | failed | errors | skipped |",
             "|---|---:|---:|---:|---:|---:|", *rows]
    if failing:
        lines += ["", f"**{len(failing)} failing**", "", "| case | where | verdict |", "|---|---|---|",
                  *failing[:LIST_FAILING]]
        if len(failing) > LIST_FAILING:
            lines.append(f"\n... and {len(failing) - LIST_FAILING} more in the junit file")
    return "\n".join(lines) + "\n"
