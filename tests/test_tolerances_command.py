"""`bundlegen tolerances`: the generated block of [[tolerance_overrides]] rows in an engine
TOML resolves every case to the numbers the harness uses; the lines outside the markers stay
byte-identical; a second run changes nothing; --check exits 1 on drift, 2 on bad input."""
from __future__ import annotations

import json
import shutil
import tomllib

import pytest

from bundlegen.cli import main
from bundlegen.graph import canonical_json
from bundlegen.harness.bundles import load_level
from bundlegen.harness.config import EngineConfig, load_engine_config
from bundlegen.manifest import manifest_name
from bundlegen.tolerance_block import BEGIN, END
from bundlegen.tolerances import text_digest, tolerances_name
from bundlegen.workspace import builtin_bundle_root

PLAN = "sdpa_bwd"

#: an engine TOML a kernel project keeps by hand: comments, a hand override row and a skip
SAMPLE = """# Engine TOML of a kernel project (its harness is not Python).
[meta]
name = "torch-math"   # trailing comment, kept

# a hand row, for one regression: written after the generated rows, so it wins
[[tolerance_overrides]]
filters = { item = "REG-HV-LT-HK" }
rtol = 0.5
atol = 1e-3

[[test_skips]]
reason = "a hand skip, kept as written"
filters = { id = "000000000000" }
"""

STALE_BLOCK = f"""{BEGIN}
# whatever an older run wrote
[[tolerance_overrides]]
filters = {{ plan = "{PLAN}", tolerance_class = "bf16-r256", dtype = "bf16" }}
rtol = 9.0
atol = 9.0
{END}
"""


@pytest.fixture(autouse=True)
def workspace(tmp_path, monkeypatch):
    """Every test runs in a workspace of its own (the writer writes only inside one); its
    bundle root is absent, so the built-in bundles are read."""
    (tmp_path / "bundlegen.toml").write_text('bundles = "ws-bundles"\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(*argv: str) -> int:
    return main(["tolerances", *argv])


def _engine_toml(tmp_path, text: str, newline: str = "\n"):
    path = tmp_path / "engine.toml"
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write(text.replace("\n", newline))
    return path


def _outside(text: str) -> tuple[str, str]:
    """The bytes before the BEGIN line and from the END line's line ending on."""
    begin, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:begin], text[end:]


def test_the_block_resolves_every_case_to_the_harness_numbers(tmp_path):
    path = _engine_toml(tmp_path, '[meta]\nname = "torch-math"\n')
    assert _run("--engine-toml", str(path)) == 0
    loaded = load_level(builtin_bundle_root(), "full")
    assert len(loaded.cases) > 3000 and not loaded.errors
    harness = EngineConfig(manifest=loaded.manifest)             # no rows: the class's numbers
    with_block = load_engine_config(tmp_path, loaded.manifest)   # the harness reading the block
    rows = tomllib.loads(path.read_text(encoding="utf-8"))["tolerance_overrides"]
    assert [r["filters"]["tolerance_class"] for r in rows] == list(loaded.manifest.tolerance_classes)
    for case in loaded.cases:
        want = harness.tolerance_for(case)
        got = with_block.tolerance_for(case)
        assert (got.rtol, got.atol) == (want.rtol, want.atol), case.id
        assert "tolerance_overrides" in got.source
        # a harness that is not Python: plain equality of each filter with the case's record
        fields = {"plan": PLAN, "tolerance_class": case.tolerance_class, "dtype": case.graph.dtype}
        matched = [r for r in rows if all(fields.get(k) == v for k, v in r["filters"].items())]
        assert len(matched) == 1, case.id
        assert (matched[0]["rtol"], matched[0]["atol"]) == (want.rtol, want.atol), case.id


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_lines_outside_the_markers_stay_byte_identical(tmp_path, newline):
    head, tail = SAMPLE.split("[[test_skips]]")
    original = (head + STALE_BLOCK + "\n[[test_skips]]" + tail).replace("\n", newline)
    path = _engine_toml(tmp_path, original, newline="\n")
    assert _run("--engine-toml", str(path), "--engine", "torch-math") == 0
    written = path.read_bytes().decode("utf-8")
    assert _outside(written) == _outside(original)
    classes = load_level(builtin_bundle_root(), "quick").manifest.tolerance_classes
    # one row per class of the plan in the block, and the hand row outside it
    assert "rtol = 9.0" not in written
    assert written.count("[[tolerance_overrides]]") == len(classes) + 1
    if newline == "\r\n":       # the block takes the file's line endings
        assert written.count("\r\n") == written.count("\n")
    else:
        assert "\r" not in written


def test_without_markers_the_block_goes_before_the_hand_rows_and_adds_only_itself(tmp_path, capsys):
    path = _engine_toml(tmp_path, SAMPLE)
    assert _run("--engine-toml", str(path)) == 0
    written = path.read_text(encoding="utf-8")
    block = written[written.index(BEGIN): written.index(END) + len(END)]
    assert written.replace(block + "\n\n", "", 1) == SAMPLE
    assert written.index(END) < written.index('filters = { item = "REG-HV-LT-HK" }')
    assert written.index(END) < written.index("# a hand row")   # the hand row keeps its comment
    # the hand row still wins for its cases: it is the last match
    loaded = load_level(builtin_bundle_root(), "quick")
    config = load_engine_config(tmp_path, loaded.manifest)
    hand = next(c for c in loaded.cases if "REG-HV-LT-HK" in c.items)
    assert config.tolerance_for(hand).rtol == 0.5


def test_a_second_run_changes_nothing(tmp_path, capsys):
    path = _engine_toml(tmp_path, SAMPLE)
    assert _run("--engine-toml", str(path)) == 0
    first = path.read_bytes()
    capsys.readouterr()
    assert _run("--engine-toml", str(path)) == 0
    assert path.read_bytes() == first
    assert "already in sync" in capsys.readouterr().out
    assert _run("--engine-toml", str(path), "--check") == 0


def _other_bundles(tmp_path, rtol_from: str, rtol_to: str):
    """A bundle root whose tolerance TOML changes one rtol, its manifest recording the digest."""
    root = tmp_path / "bundles"
    root.mkdir()
    toml = (builtin_bundle_root() / tolerances_name(PLAN)).read_text(encoding="utf-8")
    at = toml.index(f"\n{rtol_from}\n") + 1
    toml = toml[:at] + rtol_to + toml[at + len(rtol_from):]
    (root / tolerances_name(PLAN)).write_text(toml, encoding="utf-8")
    raw = json.loads((builtin_bundle_root() / manifest_name(PLAN)).read_text(encoding="utf-8"))
    raw["tolerances"]["digest"] = text_digest(toml)
    (root / manifest_name(PLAN)).write_text(canonical_json(raw), encoding="utf-8")
    return root


def test_check_exits_1_on_drift_and_writes_nothing(tmp_path, capsys):
    path = _engine_toml(tmp_path, SAMPLE)
    assert _run("--engine-toml", str(path), "--check") == 1          # no block yet
    assert path.read_text(encoding="utf-8") == SAMPLE
    assert _run("--engine-toml", str(path)) == 0
    synced = path.read_text(encoding="utf-8")
    edited = synced.replace("rtol = 0.03125", "rtol = 0.04", 1)      # a hand edit inside the block
    path.write_text(edited, encoding="utf-8")
    assert _run("--engine-toml", str(path), "--check") == 1
    assert path.read_text(encoding="utf-8") == edited
    assert "missing or differs" in capsys.readouterr().err
    path.write_text(synced, encoding="utf-8")
    other = _other_bundles(tmp_path, "rtol = 0.03125", "rtol = 0.035")   # the plan's numbers moved
    assert _run("--engine-toml", str(path), "--check") == 0
    assert _run("--engine-toml", str(path), "--check", "--bundles", str(other)) == 1
    assert _run("--engine-toml", str(path), "--bundles", str(other)) == 0
    assert "rtol = 0.035\n" in path.read_text(encoding="utf-8")
    assert _outside(path.read_text(encoding="utf-8")) == _outside(synced)


@pytest.mark.parametrize("setup, argv, message", [
    (None, ["--engine-toml", "{dir}/absent.toml"], "cannot read"),
    ("[meta\nname = 1\n", ["--engine-toml", "{path}"], "not valid TOML"),
    (SAMPLE, ["--engine-toml", "{path}", "--engine", "no-such-engine"], "unknown engine 'no-such-engine'"),
    (SAMPLE, ["--engine", "No_Such"], "engine name 'No_Such'"),
    (SAMPLE, ["--engine-toml", "{path}", "--engine", "triton"], "[meta] name is 'torch-math', not engine 'triton'"),
    (SAMPLE, [], "give --engine-toml PATH or --engine NAME"),
    (SAMPLE + BEGIN + "\n" + BEGIN + "\n" + END + "\n", ["--engine-toml", "{path}"], "expected one"),
    (SAMPLE + END + "\n" + BEGIN + "\n", ["--engine-toml", "{path}"], "expected one"),
    ('[meta]\nname = "torch-math"\n' + STALE_BLOCK + 'loose = "a plain key after END joins the last row"\n',
     ["--engine-toml", "{path}"], "does not read back as its own rows"),
    (SAMPLE, ["--engine-toml", "{path}", "--bundles", "{dir}/nowhere"], "not a generated bundle root"),
    # what `bundlegen run` refuses, tolerances refuses too (harness.config reads the same keys)
    (SAMPLE + "\n[extra]\nx = 1\n", ["--engine-toml", "{path}"], "extra: unknown key"),
    ('[meta]\nname = "torch-math"\nowner = "me"\n', ["--engine-toml", "{path}"], "meta.owner: unknown key"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, setup, argv, message):
    path = tmp_path / "engine.toml"
    if setup is not None:
        path.write_text(setup, encoding="utf-8")
    before = path.read_bytes() if setup is not None else None
    argv = [a.format(dir=tmp_path, path=path) for a in argv]
    assert _run(*argv) == 2
    assert _run(*argv, "--check") == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("error: ")
    if before is not None:
        assert path.read_bytes() == before


def test_what_tolerances_writes_the_run_reads(tmp_path):
    """The file the command writes loads in the harness (an unknown table is refused by both)."""
    from bundlegen.harness.config import EngineConfigError, load_engine_config

    path = _engine_toml(tmp_path, SAMPLE)
    assert _run("--engine-toml", str(path)) == 0
    assert len(load_engine_config(tmp_path).overrides) > 0
    path.write_text(path.read_text(encoding="utf-8") + "\n[extra]\nx = 1\n", encoding="utf-8")
    with pytest.raises(EngineConfigError, match="extra: unknown key"):
        load_engine_config(tmp_path)
    assert _run("--engine-toml", str(path)) == 2


def test_the_engine_name_alone_finds_its_engine_toml(tmp_path, capsys):
    """--engine without --engine-toml checks that engine's own engine.toml (the built-in one
    here, which carries no generated block: --check says so and changes nothing)."""
    builtin = builtin_bundle_root().parent / "engines" / "torch_math" / "engine.toml"
    before = builtin.read_bytes()
    assert _run("--engine", "torch-math", "--check") == 1
    assert builtin.read_bytes() == before and "engine.toml" in capsys.readouterr().err
    copy = tmp_path / "engine.toml"
    shutil.copy(builtin, copy)
    assert _run("--engine-toml", str(copy), "--engine", "torch-math") == 0


# ----------------------------------------------------------------------------- writer safety
@pytest.fixture
def alarm():
    """A hang (a FIFO opened for reading) fails the test instead of the suite."""
    import signal

    def _hung(signum, frame):
        raise TimeoutError("the writer hung")
    old = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _one_error(capsys, *words):
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, err
    return err


def test_a_fifo_target_is_refused_without_hanging(tmp_path, capsys, alarm):
    import os
    fifo = tmp_path / "engine.toml"
    os.mkfifo(fifo)
    assert _run("--engine-toml", str(fifo)) == 2
    _one_error(capsys, "a FIFO")
    assert _run("--engine-toml", str(fifo), "--check") == 2
    _one_error(capsys, "a FIFO")


def test_a_read_only_target_is_one_line_and_left_as_it_was(tmp_path, capsys):
    import os
    path = _engine_toml(tmp_path, SAMPLE)
    os.chmod(path, 0o444)
    if os.access(path, os.W_OK):
        pytest.skip("running as a user who writes read-only files (root)")
    assert _run("--engine-toml", str(path)) == 2
    _one_error(capsys, "read-only", str(path))
    assert path.read_text(encoding="utf-8") == SAMPLE


def test_a_symlink_out_of_the_workspace_is_refused(tmp_path, capsys):
    outside = tmp_path.parent / f"{tmp_path.name}-outside.toml"
    outside.write_text(SAMPLE, encoding="utf-8")
    try:
        link = tmp_path / "engine.toml"
        link.symlink_to(outside)
        assert _run("--engine-toml", str(link)) == 2
        _one_error(capsys, "outside", "symlink")
        assert outside.read_text(encoding="utf-8") == SAMPLE
    finally:
        outside.unlink()


def test_outside_a_workspace_nothing_is_written(tmp_path, tmp_path_factory, capsys, monkeypatch):
    """--check reads only; writing needs a workspace, and the engine TOML inside it
    (`--engine NAME` from an empty folder would otherwise rewrite the installed package's)."""
    monkeypatch.chdir(tmp_path_factory.mktemp("empty"))
    builtin = builtin_bundle_root().parent / "engines" / "torch_math" / "engine.toml"
    before = builtin.read_bytes()
    assert _run("--engine", "torch-math") == 2
    _one_error(capsys, "is not inside one")
    assert builtin.read_bytes() == before
    assert _run("--engine", "torch-math", "--check") == 1
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)            # a workspace, but the file lies outside it
    assert _run("--engine", "torch-math") == 2
    _one_error(capsys, "refusing to write outside")
    assert builtin.read_bytes() == before


def test_the_write_replaces_the_file_atomically(tmp_path, capsys):
    """A temporary file renamed over the old one: a second link to the old file keeps the old
    text (an in-place write would change both), and no temporary file is left."""
    import os
    path = _engine_toml(tmp_path, SAMPLE)
    os.link(path, tmp_path / "old-link.toml")
    assert _run("--engine-toml", str(path)) == 0
    assert (tmp_path / "old-link.toml").read_text(encoding="utf-8") == SAMPLE
    assert BEGIN in path.read_text(encoding="utf-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundlegen.toml", "engine.toml", "old-link.toml"]


@pytest.mark.parametrize("near", [BEGIN + " ", "  " + BEGIN, END + "\t", "  " + END,
                                  BEGIN.replace("BEGIN", "Begin")])
def test_a_near_miss_marker_is_an_error_naming_its_line(tmp_path, capsys, near):
    text = SAMPLE + "\n" + STALE_BLOCK
    lines = text.split("\n")
    marker = BEGIN if BEGIN.casefold() in near.casefold() else END
    number = lines.index(marker) + 1
    lines[number - 1] = near
    path = _engine_toml(tmp_path, "\n".join(lines))
    before = path.read_bytes()
    assert _run("--engine-toml", str(path)) == 2
    _one_error(capsys, f"line {number}:", "not exactly the marker")
    assert path.read_bytes() == before
