"""The design lives inside the repository: every "DESIGN section N" citation in a tracked
file (and every "docs/DESIGN.md section N") names a `## N.` heading of docs/DESIGN.md, a
citation's topic in parentheses is found in that section, and every path a tracked file
gives to a design or notes file (`<folder>/DESIGN.md`, `notes/<name>.md`, `shared/notes`)
names a file the repository holds. (A pointer to the shared folder beside the checkout is
tests/test_checked_in_tree.py's to find: it scans for every pointer beside the repository.)"""
from __future__ import annotations

import functools
import re
from pathlib import Path

from tests.test_checked_in_tree import tracked_text_files

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "DESIGN.md"
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

#: "DESIGN section 5", "DESIGN.md section 11", "docs/DESIGN.md, section 2"; a topic in
#: parentheses may follow: "docs/DESIGN.md section 11 (tails)"
CITATION = re.compile(r"\bDESIGN(?:\.md)?,? sections? (\d+)(?: \(([^()\n]+)\))?")
#: "DESIGN" used as a pointer without a section number ("see DESIGN", "DESIGN: ...")
UNNUMBERED = re.compile(r"\bDESIGN\b(?!\.md)(?!,? sections? \d)")
HEADING = re.compile(r"^## (\d+)\. ", re.M)
#: a folder of notes or seeds kept beside a checkout, never in it
OUTSIDE = re.compile(r"\bshared/(?:notes|seeds)\b")
#: a path to a design or notes file: it must name a file of the repository
DOC_PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)+DESIGN\.md|(?:[\w.-]+/)*notes/[\w.-]+\.md)\b")
#: files whose text holds such pointers on purpose, and why
SPARED = {"tests/test_checked_in_tree.py": "its scan's own test lines"}
#: the tracked texts, read once for both scans
tracked_texts = functools.cache(tracked_text_files)


def design_sections(text: str) -> dict[int, str]:
    """N -> the text of section `## N. ...` up to the next `## ` heading."""
    starts = [(int(m.group(1)), m.start()) for m in HEADING.finditer(text)]
    ends = [s for _, s in starts[1:]] + [len(text)]
    return {n: text[s:e] for (n, s), e in zip(starts, ends)}


def citation_problems(texts: dict[str, str], sections: dict[int, str]) -> list[str]:
    bad = []
    for rel, text in texts.items():
        if rel == THIS:     # its own lines are the scanners' test examples, bad ones on purpose
            continue
        for m in CITATION.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            n, topic = int(m.group(1)), m.group(2)
            if n not in sections:
                bad.append(f"{rel}:{line}: {m.group(0)!r}: docs/DESIGN.md has no section {n}")
            elif topic and "DESIGN.md" in m.group(0) and topic.lower() not in sections[n].lower():
                bad.append(f"{rel}:{line}: {m.group(0)!r}: section {n} does not mention {topic!r}")
        if rel == "docs/DESIGN.md":
            continue
        for m in UNNUMBERED.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            bad.append(f"{rel}:{line}: cites DESIGN without a section number")
    return bad


def _in_repository(path: Path) -> bool:
    """A file of the checkout (a path that climbs out of it names one a user lacks)."""
    path = path.resolve()
    return path.is_relative_to(ROOT) and path.is_file()


def outside_pointers(texts: dict[str, str]) -> list[str]:
    bad = []
    for rel, text in texts.items():
        if rel == THIS or rel in SPARED:
            continue
        for m in OUTSIDE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            bad.append(f"{rel}:{line}: points outside the repository: {m.group(0)!r}")
        for m in DOC_PATH.finditer(text):
            cited = m.group(1)
            if not any(_in_repository(base / cited) for base in (ROOT, (ROOT / rel).parent)):
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{rel}:{line}: cites {cited!r}, which the repository does not hold")
    return bad


def test_design_has_the_cited_numbering():
    """Sections 1-10 keep the numbers the code has always cited them by, in order."""
    numbers = [int(n) for n in HEADING.findall(DESIGN.read_text(encoding="utf-8"))]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 10, numbers


def test_every_design_citation_resolves():
    # this file's own lines are the scanners' test data, bad citations on purpose
    texts = {rel: text for rel, text in tracked_texts().items() if rel != THIS}
    sections = design_sections(DESIGN.read_text(encoding="utf-8"))
    cited = [m for t in texts.values() for m in CITATION.finditer(t)]
    assert cited, "no DESIGN citation found: the scan is not looking where the code is"
    problems = citation_problems(texts, sections)
    assert not problems, "\n".join(problems)


def test_no_pointer_outside_the_repository():
    problems = outside_pointers(tracked_texts())
    assert not problems, "\n".join(problems)


def test_the_checks_see_what_they_look_for():
    """The scanners themselves: a bad number, a missing topic, a bare DESIGN and outside
    pointers are each reported; good citations are not."""
    sections = design_sections("## 1. One\nalpha\n## 2. Two\nbeta (tails)\n")
    texts = {"a.py": "DESIGN section 2; docs/DESIGN.md section 2 (tails); DESIGN section 1",
             "b.py": "DESIGN section 3", "c.py": "docs/DESIGN.md section 1 (tails)",
             "d.py": "see DESIGN: here"}
    assert [p.split(":")[0] for p in citation_problems(texts, sections)] == ["b.py", "c.py", "d.py"]
    texts = {"e.md": "read `" + "../" + "shared/DESIGN.md`", "f.py": "# shared/notes: a figure",
             "g.py": '"notes/triton-backward.md (tails)"', "h.py": "docs/DESIGN.md section 1",
             "docs/i.md": "see DESIGN.md and [the design](DESIGN.md)",
             "tests/test_checked_in_tree.py": '"shared/DESIGN.md"'}
    assert sorted({p.split(":")[0] for p in outside_pointers(texts)}) == ["e.md", "f.py", "g.py"]
