"""The figures README and ADOPTING quote from the evidence (the H200 runs the claims cite)
are the evidence's: counted here from the results files, never written down in this test.
The harness speed figure's case count is the one docs/PERFORMANCE.md records for it."""
from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

from bundlegen.harness import verdicts as V

REPO = Path(__file__).resolve().parents[1]
EVIDENCE = REPO / "evidence" / "h200"


def _flowing(path: Path) -> str:
    return " ".join(path.read_text(encoding="utf-8").split())


def _counts(engine: str) -> dict[str, int]:
    """What every run of `engine` in the evidence says (the runs must agree)."""
    seen = []
    for path in sorted(EVIDENCE.glob(f"{engine}-full-*.results.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
        by = Counter((r["purpose"], r["verdict"]) for r in records)
        seen.append({"cases": len(records),
                     "pass": by[("claim", V.PASS)] + by[("regression", V.PASS)],
                     "declined": sum(n for (purpose, v), n in by.items() if v == V.DECLINED and purpose != "probe"),
                     "rejected": by[("probe", V.REJECTED)], "contained": by[("probe", V.CONTAINED)],
                     "failing": sum(n for (_p, v), n in by.items() if V.is_failing(v))})
    assert len(seen) >= 2 and all(s == seen[0] for s in seen), (engine, seen)
    return seen[0]


def test_the_readme_results_paragraph_is_the_evidences():
    text = _flowing(REPO / "README.md")
    said = re.search(r"Of the (\d+) cases of each run, the Triton engine passes (\d+) claim and regression cases "
                     r"and declines (\d+), torch-math passes (\d+) and declines (\d+); both reject the (\d+) probes, "
                     r"contain the (\d+) device probes with bad ragged offsets, and fail none", text)
    assert said, "README's results paragraph has moved: keep it checked here"
    triton, math = _counts("triton"), _counts("torch-math")
    cases, t_pass, t_declined, m_pass, m_declined, rejected, contained = map(int, said.groups())
    assert cases == triton["cases"] == math["cases"]
    assert (t_pass, t_declined) == (triton["pass"], triton["declined"])
    assert (m_pass, m_declined) == (math["pass"], math["declined"])
    assert rejected == triton["rejected"] == math["rejected"]
    assert contained == triton["contained"] == math["contained"]
    assert triton["failing"] == math["failing"] == 0


def test_every_count_of_all_four_levels_is_the_evidences_or_the_measurements():
    """A case count README or ADOPTING gives for all four levels is the evidence's, or, for
    the harness timing, the count docs/PERFORMANCE.md records with that measurement."""
    evidence = _counts("triton")["cases"]
    measured = re.search(r"All four levels \((\d+) cases: ", _flowing(REPO / "docs" / "PERFORMANCE.md"))
    assert measured
    for name in ("README.md", "docs/ADOPTING.md"):
        text = _flowing(REPO / name)
        for count in re.findall(r"(\d+) cases in the plan measured there", text):
            assert int(count) == int(measured.group(1)), (name, count)
        for count in re.findall(r"all four levels \((\d+) cases\)", text, re.I):
            assert int(count) == evidence, (name, count)
        for count in re.findall(r"Of the (\d+) cases", text):
            assert int(count) == evidence, (name, count)
