"""The checked-in tree: its generated files agree with their sources (CI fails on drift), and
no tracked file names a path of one machine or a file outside the repository."""
import argparse
import re
import subprocess
from pathlib import Path

import pytest

from bundlegen.claims import matrix_command

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_support_matrix_is_current(capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    args = argparse.Namespace(check=True, bundles=None, plan=None, claims_root=None)
    rc = matrix_command.main(args)
    assert rc == 0, capsys.readouterr().out


# --- No tracked file names a place on one machine or outside the repository ---------------
# A path that exists only on the machine that wrote it (a home folder, a scratch or temp
# folder, a container's work tree) tells a reader of the repository nothing and leaks where
# it was made; a pointer at a folder beside the repository names a file its users lack.

#: an absolute path under a folder that is one machine's own: it starts the path (not a
#: segment of a URL or a relative path) and names something below the folder
MACHINE_PATH = re.compile(
    r"(?<![\w.~/-])(?:/(?:root|home|Users|work|workspace|scratch|mnt|tmp|private/var|var/folders)"
    r"/[\w.$~-]|[A-Za-z]:\\\\?(?:Users|Documents and Settings)\\)")
#: a pointer at files beside the repository rather than in it
OUTSIDE_POINTER = re.compile(r"(?<![\w.])\.\./+shared\b")
#: the machine-independent absolute paths a tracked file may name, each with why
ALLOWED_PATHS = {
    # CUDA's documented default pipe folder of the MPS control daemon (the same on every
    # machine): harness's MPS support names it to tell the system daemon's folder from its own
    "/tmp/nvidia-mps": "CUDA MPS default pipe directory",
}
#: files that may name the outside pointer (not a machine path), each with why
ALLOWED_POINTER_FILES = {
    # the design-citation scanner's own test: its data and docstring spell the pointer to
    # show that scanner leaves it to this one
    "tests/test_design_citations.py": "test data of the design-citation scanner",
}


def tracked_text_files() -> dict[str, str]:
    """path -> text of every tracked file present in the working tree that decodes as UTF-8
    (compressed results and other binaries are skipped: gzip stores no path but a name)."""
    try:
        listing = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True,
                                 check=True).stdout.decode("utf-8")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no tracked files to scan")
    texts = {}
    for rel in filter(None, listing.split("\0")):
        path = REPO_ROOT / rel
        if not path.is_file():
            continue
        try:
            texts[rel] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return texts


def placement_problems(texts: dict[str, str]) -> list[str]:
    """`path:line: what` for each machine path or outside pointer in `texts`."""
    found = []
    for rel, text in texts.items():
        for number, line in enumerate(text.splitlines(), 1):
            spared = line
            for allowed in ALLOWED_PATHS:
                spared = spared.replace(allowed, "")
            checks = [(MACHINE_PATH, "a machine's absolute path")]
            if rel not in ALLOWED_POINTER_FILES:
                checks.append((OUTSIDE_POINTER, "a pointer outside the repository"))
            for pattern, what in checks:
                for m in pattern.finditer(spared):
                    found.append(f"{rel}:{number}: {what}: {spared[m.start():m.start() + 40]!r}")
    return found


def _at(path: str) -> str:
    """An absolute path built at run time, so that this file holds none itself."""
    return "/" + path


@pytest.mark.parametrize("line", [
    "see " + _at("root/bundlegen/out"), "cd " + _at("home/alice/src"), _at("Users/bob/x"),
    _at("work/main/x.py"), "results " + _at("tmp/r21/committed-full/results.jsonl"),
    '"out": "' + _at("tmp/tmpab12/x.json") + '"', _at("private/var/folders/xy/T/x"),
    "C:" + "\\Users\\carol\\x", "`.." + _at("shared/DESIGN.md") + "`",
    _at("workspace/bundlegen"), _at("mnt/data/run.json")])
def test_the_scan_finds_machine_paths_and_outside_pointers(line):
    assert placement_problems({"f": line})


@pytest.mark.parametrize("line", [
    "https://example.org/ho" + "me/page",   # spelt in two so the tree's own grep stays clean
    "docs/work/x.md", "bundles/quick/sdpa_bwd/x.json",
    "DEFAULT_PIPE = Path(\"/tmp/nvidia-mps\")", "out/tmp/x", "a ratio 4/tmp", "../README.md",
    "python bench/engine_speed.py --out out/x.json"])
def test_the_scan_spares_relative_paths_urls_and_the_allowed(line):
    assert placement_problems({"f": line}) == []


def test_an_allowed_file_may_name_the_pointer_but_no_machine_path():
    allowed = next(iter(ALLOWED_POINTER_FILES))
    assert placement_problems({allowed: "`.." + _at("shared/DESIGN.md") + "`"}) == []
    assert placement_problems({allowed: "see " + _at("root/x")})


def test_no_tracked_file_holds_a_machine_path_or_points_outside_the_repository():
    texts = tracked_text_files()
    assert "README.md" in texts and len(texts) > 100
    problems = placement_problems(texts)
    assert not problems, "\n".join(problems[:40]) + (
        f"\n... and {len(problems) - 40} more" if len(problems) > 40 else "")
