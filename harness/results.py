"""What a run leaves behind (CONTRACTS "Results"): results.jsonl appended and flushed
per case (so a killed run keeps every finished case and `--resume` can skip them; fsynced
in the background at most once a second and at the end, for a host that goes down), a JUnit
XML file, and the per-level summary table."""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import shlex
import threading
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from bundlegen import safe_read
from bundlegen.harness import verdicts as V
if TYPE_CHECKING:
    from bundlegen.harness.config import EngineConfig
from bundlegen.results_file import RESULTS_NAME, RUN_NAME, RunTimes, read_results, read_run_times  # noqa: F401 (re-exported)

JUNIT_NAME = "junit.xml"


def repro_command(case_id: str, engine: str, device: str | None = None) -> str:
    """The command line that reproduces one case (for run summaries, JUnit and reports)."""
    words = ["bundlegen", "repro", case_id, "--engine", engine]
    if device and device != "cpu":
        words += ["--device", device]
    return " ".join(shlex.quote(w) for w in words)


@dataclass(frozen=True)
class CaseResult:
    run_id: str
    case_id: str
    level: str
    group: str
    purpose: str
    items: tuple[str, ...]
    engine: str
    arch: str
    device: str
    verdict: str
    detail: str = ""
    reason: str | None = None
    tolerance_class: str | None = None
    tolerance: Mapping[str, Any] | None = None
    outputs: Mapping[str, Any] = field(default_factory=dict)
    margin: float | None = None              # against the worst-case bound
    statistical_margin: float | None = None  # against the statistical judge
    predicted_s: float | None = None
    wall_s: float = 0.0            # the whole case, measured by the parent (worker round trip included)
    oracle_s: float | None = None  # both references: float64 oracle and io-precision (synchronised)
    materialize_s: float | None = None  # the rest of materialize: input fill, layout, copies
    engine_s: float | None = None  # the engine's first run
    check_s: float | None = None   # guards, inputs unmodified, tolerance, determinism re-run
    io_reference_s: float | None = None  # the part of oracle_s the io-precision reference took
    file: str = ""
    runs: int | None = None        # engine runs the case made (None: the engine never ran)
    predicted_phases: Mapping[str, float] | None = None   # PHASES -> the cost model's seconds

    def to_json(self) -> dict:
        record = asdict(self)
        record["items"] = list(self.items)
        return record

    @property
    def key(self) -> str:
        return result_key(self.to_json())


def result_key(record: Mapping[str, Any]) -> str:
    """What --resume skips by: the case id; a malformed file's errors by file and case."""
    if record.get("verdict") == V.ERROR_BUNDLE:
        return f"{record.get('file', '')}::{record.get('case_id', '')}"
    return str(record.get("case_id", ""))


def write_run_times(path: Path | str, times: RunTimes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(times.to_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------- jsonl
class ResultsWriter:
    """Appends one line per case, handed to the OS before the next case starts (a killed
    process loses none). A thread of its own fsyncs the file, at most once every
    SYNC_INTERVAL_S while lines come in and once after close, for a host that goes down: an
    fsync can take a large part of a second, and made in `write`, under the lock the workers
    record through, it would hold every worker up. close returns at once;
    wait_synced waits for the last fsync and closes the file, and so does the interpreter's
    exit (atexit) for a writer nobody waited for."""
    SYNC_INTERVAL_S = 1.0

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_partial_last_line(self.path)
        self._fh = open(self.path, "a", encoding="utf-8")
        self._written = threading.Event()
        self._closing = threading.Event()
        self._sync_error: OSError | None = None
        self._syncer = threading.Thread(target=self._sync_loop, name="bundlegen-results-sync",
                                        daemon=True)
        self._syncer.start()
        atexit.register(self.wait_synced)

    def write(self, result: CaseResult) -> None:
        if self._closing.is_set():
            raise ValueError(f"{self.path}: written after close")
        self._fh.write(json.dumps(result.to_json(), sort_keys=True, allow_nan=False) + "\n")
        self._fh.flush()
        self._written.set()

    def _sync_loop(self) -> None:
        closing = False
        while not closing:
            closing = self._closing.wait(self.SYNC_INTERVAL_S)
            if self._written.is_set() or closing:
                self._written.clear()
                try:
                    os.fsync(self._fh.fileno())
                except OSError as exc:
                    self._sync_error = exc
                    return

    def close(self) -> None:
        """Every line to the OS now; the last fsync follows in the background."""
        if not self._closing.is_set():
            self._fh.flush()
            self._closing.set()

    def wait_synced(self) -> None:
        """Close, and wait until the file is on disk; OSError when an fsync failed."""
        self.close()
        self._syncer.join()
        self._fh.close()
        atexit.unregister(self.wait_synced)
        if self._sync_error is not None:
            raise self._sync_error

    def __enter__(self) -> "ResultsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _drop_partial_last_line(path: Path) -> None:
    """A run killed while writing can leave half a line: cut it so appends start clean. A
    whole record that lost only its newline is kept (the newline is added)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as fh:
        data = fh.read()
        if data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1
        try:
            whole = isinstance(json.loads(data[start:]), dict)
        except ValueError:
            whole = False
        if whole:
            fh.write(b"\n")
        else:
            fh.truncate(start)


def bundles_digest(files: Iterable[Path], root: Path) -> str:
    """sha256 over the bundle files a run loaded (their paths under the root and bytes)."""
    from bundlegen.harness.bundles import file_name

    digest = hashlib.sha256()
    for path in sorted(Path(f) for f in files):
        # an extension's run reads the built-in bundles too, where the package installed them
        digest.update(file_name(path, root).encode() + b"\0")
        digest.update(safe_read.digest_bytes(path))   # never blocks on a FIFO
    return digest.hexdigest()[:16]


def resume_mismatch(previous: RunTimes | None, current: RunTimes) -> str | None:
    """Why results recorded under `previous` cannot be resumed by `current`, else None."""
    if previous is None:
        return "it has no readable run.json, so what its results were run on is unknown"
    for name in ("engine_spec", "device", "arch", "level", "selection"):
        have, want = getattr(previous, name), getattr(current, name)
        if have != want:
            return f"its {name.replace('_', ' ')} is {have!r}, this run's is {want!r}"
    # before the bundles' digest, which covers the manifest too: the tolerance file is named
    for name, what in (("engine_config_digest", "engine config (engine.toml and claims.json)"),
                       ("tolerances_digest", "tolerance file"), ("bundles_digest", "bundles")):
        have, want = getattr(previous, name), getattr(current, name)
        if have != want:
            if not have:
                return f"it does not record the digest of its {what}"
            return f"its {what} differ{'' if what == 'bundles' else 's'} from this run's " \
                   f"(digest {have[:12]}, this run's {want[:12]})"
    return None


def engine_config_digest(config: EngineConfig) -> str:
    """sha256 of what an engine config decides verdicts by: its override and skip rows and
    its claims (not where it was read from, nor the manifest, which has its own digests)."""
    def plain(value):
        if isinstance(value, (frozenset, set)):
            return sorted(value)
        if isinstance(value, Mapping):
            return dict(value)
        raise TypeError(f"{type(value).__name__} in an engine config")

    content = {"overrides": [asdict(row) for row in config.overrides],
               "skips": [asdict(row) for row in config.skips],
               "claims": {arch: sorted(ids) for arch, ids in config.claims.items()}}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=plain).encode()).hexdigest()


def finished_keys(records: Iterable[Mapping[str, Any]]) -> set[str]:
    return {result_key(r) for r in records}


# ----------------------------------------------------------------------------- junit
def write_junit(path: Path | str, records: list[Mapping[str, Any]], levels: Iterable[str],
                engine_spec: str | None = None) -> None:
    """JUnit XML of the records; a failure names the command that explains it
    (`engine_spec`: the --engine the run was given, else each record's engine name)."""
    root = ET.Element("testsuites", name="bundlegen")
    totals = Counter()
    for level in levels:
        rows = [r for r in records if r.get("level") == level]
        suite = ET.SubElement(root, "testsuite", name=level)
        counts = Counter()
        for r in rows:
            counts["tests"] += 1
            case = ET.SubElement(suite, "testcase", classname=f"bundlegen.{level}.{r.get('group', '')}",
                                 name=str(r.get("case_id", "")), time=f"{r.get('wall_s') or 0.0:.3f}")
            verdict, text = r["verdict"], _junit_text(r)
            if verdict in (V.CRASHED, V.ERROR_BUNDLE):
                counts["errors"] += 1
                ET.SubElement(case, "error", message=verdict, type=verdict).text = text
            elif verdict in V.FAILING:
                counts["failures"] += 1
                explain = repro_command(str(r.get("case_id", "")), engine_spec or str(r.get("engine", "")),
                                        r.get("device"))
                ET.SubElement(case, "failure", message=f"{verdict}; explain: {explain}",
                              type=verdict).text = f"{text}\nexplain: {explain}"
            elif verdict in V.NOT_RUN:
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=f"{verdict}: {text}")
            props = ET.SubElement(case, "properties")
            for name in ("verdict", "margin", "engine", "arch", "tolerance_class"):
                if r.get(name) is not None:
                    ET.SubElement(props, "property", name=name, value=str(r[name]))
        counts["time"] = sum(r.get("wall_s") or 0.0 for r in rows)
        for key in ("tests", "failures", "errors", "skipped"):
            suite.set(key, str(counts[key]))
        suite.set("time", f"{counts['time']:.3f}")
        totals.update(counts)
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(totals[key]))
    _xml_safe_tree(root)
    ET.indent(root)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def _junit_text(record: Mapping[str, Any]) -> str:
    parts = [p for p in (record.get("reason"), record.get("detail")) if p]
    return "; ".join(str(p) for p in parts)


#: characters XML 1.0 cannot carry (C0 controls but tab, newline and carriage return;
#: lone surrogates; U+FFFE/U+FFFF)
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(text: str) -> str:
    """`text` with every character XML cannot carry written as \\xNN / \\uNNNN."""
    return _NOT_XML.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _xml_safe_tree(root: ET.Element) -> None:
    for element in root.iter():
        if element.text:
            element.text = xml_safe(element.text)
        for key, value in element.attrib.items():
            element.set(key, xml_safe(value))


# ----------------------------------------------------------------------------- summary
#: the per-case phases of a record, in the order a case goes through them; a record from
#: before a phase was recorded (or a case that never reached it) counts 0 for it
PHASES = ("materialize_s", "oracle_s", "engine_s", "check_s")


def phase_seconds(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """phase -> summed seconds over the records (missing or null fields count 0)."""
    records = list(records)
    return {phase: sum(r.get(phase) or 0.0 for r in records) for phase in PHASES}


def predicted_phase_seconds(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """phase -> the cost model's seconds summed over the records that carry them."""
    records = [r.get("predicted_phases") for r in records]
    return {phase: sum((p or {}).get(phase) or 0.0 for p in records) for phase in PHASES}


@dataclass(frozen=True)
class LevelSummary:
    level: str
    counts: Mapping[str, int]
    wall_s: float
    predicted_s: float | None   # None when no case of the level has a prediction
    phases: Mapping[str, float] = field(default_factory=dict)  # phase -> summed seconds (PHASES)
    predicted_phases: Mapping[str, float] = field(default_factory=dict)  # phase -> predicted seconds

    @property
    def cases(self) -> int:
        return sum(self.counts.values())

    @property
    def failing(self) -> int:
        return sum(n for v, n in self.counts.items() if v in V.FAILING)


def summarize(records: list[Mapping[str, Any]], levels: Iterable[str]) -> list[LevelSummary]:
    out = []
    for level in levels:
        rows = [r for r in records if r.get("level") == level]
        predicted = [r["predicted_s"] for r in rows if r.get("predicted_s") is not None]
        out.append(LevelSummary(level=level, counts=dict(Counter(r["verdict"] for r in rows)),
                                wall_s=sum(r.get("wall_s") or 0.0 for r in rows),
                                predicted_s=sum(predicted) if predicted else None,
                                phases=phase_seconds(rows), predicted_phases=predicted_phase_seconds(rows)))
    return out


def phase_line(summaries: list[LevelSummary]) -> str:
    """The summed case phases over the levels, each with what the cost model predicted for
    the same cases where the records carry it: 'materialize 1.2 s (predicted 1.0), ...'."""
    total = {p: sum(s.phases.get(p, 0.0) for s in summaries) for p in PHASES}
    predicted = {p: sum(s.predicted_phases.get(p, 0.0) for s in summaries) for p in PHASES}
    shown = any(predicted.values())
    return ", ".join(f"{p.removesuffix('_s')} {total[p]:.1f} s" + (f" (predicted {predicted[p]:.1f})" if shown else "")
                     for p in PHASES)


def summary_table(summaries: list[LevelSummary], title: str = "bundlegen run"):
    """A rich Table: one row per level (its own cases), then the total."""
    from rich.table import Table

    shown = [v for v in V.ALL if any(s.counts.get(v) for s in summaries)]
    table = Table(title=title, caption=f"phases: {phase_line(summaries)}")
    table.add_column("level")
    table.add_column("cases", justify="right")
    for verdict in shown:
        style = "red" if verdict in V.FAILING else ("green" if verdict in (V.PASS, V.REJECTED, V.CONTAINED) else None)
        table.add_column(verdict, justify="right", style=style)
    table.add_column("wall s", justify="right")
    table.add_column("predicted s", justify="right")

    def row(name: str, counts: Mapping[str, int], wall: float, predicted: float | None) -> list[str]:
        return [name, str(sum(counts.values())), *(str(counts.get(v, 0)) for v in shown),
                f"{wall:.1f}", "-" if predicted is None else f"{predicted:.1f}"]

    for s in summaries:
        table.add_row(*row(s.level, s.counts, s.wall_s, s.predicted_s))
    total = Counter()
    for s in summaries:
        total.update(s.counts)
    predicted = [s.predicted_s for s in summaries if s.predicted_s is not None]
    table.add_row(*row("total", total, sum(s.wall_s for s in summaries),
                       sum(predicted) if predicted else None), style="bold")
    return table
