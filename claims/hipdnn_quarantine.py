"""The engine side of a hipDNN export: which exported cases a hipDNN engine's known defects
cover. An engine's `[[test_skips]]` rows (its bundlegen engine.toml, kept under
`hipdnn-<engine>`) select cases; the valid graphs among them become hipDNN `[[test_skips]]`
rows (bundlegen.claims.hipdnn_toml), the rejection probes a quarantine for the tier YAML,
as hipDNN asks for probes an engine wrongly accepts (an accepted probe fails its lane, and
a test_skips row would hide the probe from every engine). Probes seen `rejection-accepted`
in given results join the quarantine too."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from bundlegen.results_file import read_results
from bundlegen.claims import hipdnn_format as fmt
from bundlegen.claims.hipdnn_export import Export, Exported
from bundlegen.harness.config import EngineConfigError, SkipRow, load_engine_config
from bundlegen.harness.verdicts import REJECTION_ACCEPTED
from bundlegen.workspace import engine_config_dir

NO_TICKET = "no ticket"


@dataclass(frozen=True)
class KnownDefect:
    """One skip row (or accepted probe) and the exported cases it covers, by full GTest name."""
    ticket: str
    reason: str
    archs: tuple[str, ...] | None
    names: tuple[str, ...]


def skip_rows(engine: str, config_root: Path | None = None) -> tuple[SkipRow, ...]:
    """The [[test_skips]] rows of hipDNN engine `engine`'s bundlegen engine.toml (none when
    it has no config folder)."""
    store = fmt.store_engine(engine)
    directory = (config_root / store.replace("-", "_")) if config_root is not None else engine_config_dir(store)
    if directory is None or not (directory / "engine.toml").is_file():
        return ()
    try:
        return load_engine_config(directory).skips
    except EngineConfigError as exc:
        raise ValueError(str(exc)) from None


def defects(export: Export, rows: Sequence[SkipRow], plan: str | None, probes: bool) -> list[KnownDefect]:
    """Per skip row, the exported cases it selects: the rejection probes (`probes`) or the rest."""
    out = []
    for row in rows:
        names = tuple(sorted(e.placement.gtest_name for e in export.exported
                             if _is_probe(e) == probes and row.selects(e.case, plan)))
        if names:
            out.append(KnownDefect(ticket=row.ticket or NO_TICKET, reason=row.reason, archs=row.archs, names=names))
    return out


def _is_probe(e: Exported) -> bool:
    return e.case.expected_rejection is not None


def accepted_probes(export: Export, engine: str, results: Iterable[Path]) -> KnownDefect | None:
    """The exported probes the given results saw the engine accept (its store name or its
    hipDNN name in the records)."""
    by_id = {e.case.id: e.placement.gtest_name for e in export.exported if _is_probe(e)}
    seen = {by_id[r["case_id"]] for path in results for r in read_results(path)
            if r.get("engine") in (engine, fmt.store_engine(engine)) and r.get("verdict") == REJECTION_ACCEPTED
            and r.get("case_id") in by_id}
    if not seen:
        return None
    return KnownDefect(ticket=NO_TICKET, reason="seen accepted in the given results", archs=None,
                       names=tuple(sorted(seen)))


def quarantine_text(export: Export, engine: str, config_root: Path | None, results: Iterable[Path]) -> str:
    """The tier-YAML quarantine: one list of full GTest names, each group under its ticket."""
    found = defects(export, skip_rows(engine, config_root), export.plan, probes=True)
    extra = accepted_probes(export, engine, results)
    found += [extra] if extra is not None else []
    lines = [f"# Rejection probes {engine} is known to accept: quarantined (a tier's `exclude` list takes them).",
             "# Written by `bundlegen export hipdnn --tier-yaml`; run it again after regenerating the export.",
             "bundlegen_sdpa_backward_quarantine:"]
    listed: set[str] = set()
    for defect in found:
        names = [n for n in defect.names if n not in listed]
        listed.update(names)
        if names:
            lines.append(f"  # {defect.ticket}: {' '.join(defect.reason.split())}")
            lines += [f"  - \"{name}\"" for name in names]
    if not listed:
        lines[-1] += " []"
    return "\n".join(lines) + "\n"


def write_text_whole(path: Path, text: str) -> None:
    """The one writer of a single file here: written beside it, then renamed over it, so a
    reader sees the old text or the new one, never a part."""
    path = Path(path)
    staging = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        staging.write_text(text, encoding="utf-8", newline="")
        os.replace(staging, path)
    except OSError as exc:
        staging.unlink(missing_ok=True)
        raise ValueError(f"{path}: cannot write: {exc}") from None
