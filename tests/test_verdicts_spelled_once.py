"""A verdict is spelled in harness/verdicts.py only: the parts that read results (claims,
mutants, the generator's shrink) and the rest of the product import its names, so a
renamed verdict cannot leave a reader comparing against the old string."""
import ast
from pathlib import Path

from bundlegen.harness import verdicts as V

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("bundlegen", "plans", "generator", "claims", "mutants", "engines")
#: the same word as a verdict, for another thing: (file, the name it is bound to) -> what
#: the name is
OTHER_MEANINGS = {
    ("claims/matrix.py", "DECLINED"): "a support-matrix cell status",
    ("claims/harvest.py", "WHY_SKIPPED"): "a kind of reason a case is not claimed",
    ("claims/hipdnn_gtest.py", "JUNIT_SKIPPED"): "the junit element of a skipped GTest test",
}


def verdict_literals(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, word, the name it is assigned to or None) of every verdict spelled in a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            pairs = (zip(target.elts, value.elts) if isinstance(target, ast.Tuple)
                     and isinstance(value, ast.Tuple) else [(target, value)])
            bound.update({id(v): t.id for t, v in pairs if isinstance(t, ast.Name)})
    return [(node.lineno, node.value, bound.get(id(node))) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in V.ALL]


def test_no_verdict_is_spelled_outside_verdicts_py():
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            found += [f"{rel}:{line}: {word!r}" for line, word, name in verdict_literals(path)
                      if (rel, name) not in OTHER_MEANINGS]
    assert not found, "import these from bundlegen.harness.verdicts:\n" + "\n".join(found)


def test_the_scan_sees_a_spelled_verdict(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('if record["verdict"] == "fail:numeric":\n    pass\nPASS, WHY = "pass", "why"\n')
    assert verdict_literals(probe) == [(1, V.FAIL_NUMERIC, None), (3, V.PASS, "PASS")]
