"""Reading what `bundlegen run` writes: results.jsonl (also gzip-compressed, `.jsonl.gz`)
and run.json. The harness writes them; the harness, claims and `bundlegen calibrate` read
them through this module.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from bundlegen import safe_read

RESULTS_NAME = "results.jsonl"
RUN_NAME = "run.json"
#: where `bundlegen run` writes by default (`out/<engine>-<level>`, `out/lanes/<lane>`), relative
#: to the folder it runs in; the next run there overwrites it, so claims never cite it
DEFAULT_OUT = Path("out")


def results_file(path: Path | str) -> Path:
    """A results file (.jsonl or .jsonl.gz), or a run directory holding results.jsonl."""
    path = Path(path)
    return path / RESULTS_NAME if path.is_dir() else path


def read_results(path: Path | str) -> list[dict]:
    """Every complete record of a results file (or run directory); a line that does not
    parse (a torn write) is ignored; an absent file has none."""
    path = results_file(path)
    if not path.is_file():
        return []
    records = []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "verdict" in record:
                records.append(record)
    return records


@dataclass(frozen=True)
class RunTimes:
    """Where one `bundlegen run` invocation's time went around its cases (run.json, rewritten
    by every invocation). `bundlegen calibrate` fits the cost model's run_start_s to it."""
    run_id: str
    level: str
    engine: str
    arch: str
    device: str
    cases: int            # cases this invocation ran
    start_s: float        # until the worker's engine was built and warmed up (bundles load meanwhile)
    prepare_s: float      # Engine.prepare (compiling ahead on a cold cache)
    cases_s: float        # the case loop
    finish_s: float       # junit, summary, worker stop
    elapsed_s: float      # all of run_level
    prepare_problem: str | None = None
    before_s: float | None = None   # the process's start until run_level (None: the OS does not say)
    engine_spec: str = ""           # --engine as given (a name or package.module:Class)
    selection: str = ""             # the -k expressions and --shard, as resume compares them
    bundles_digest: str = ""        # sha256 over the bundle files the run loaded
    complete: bool = True           # False while the run is going on, or when it was cut short
    versions: Mapping[str, str] = field(default_factory=dict)   # torch, triton, cudnn, cuda, driver
    # one entry per worker process, in the order they were started: {"device", "worker",
    # "cases", "seconds"} (the worker's index on its device, cases run and their summed
    # wall seconds); one entry for a single-worker run
    per_device: tuple[Mapping[str, Any], ...] = ()
    lane: str = ""                  # --lane, when the run came from lanes.yaml
    workers_per_device: int = 1     # worker processes sharing each device (--workers-per-device)
    # the workers came from `bundlegen serve`: its pid and socket, how long before this run
    # its workers started, the runs it served before and its workers' restarts until then
    served_by: Mapping[str, Any] | None = None
    mps: bool = False               # the GPU workers were clients of a CUDA MPS server (--mps)
    mps_reruns: int = 0             # cases that crashed beside other workers and were run again alone
    # what decides verdicts besides the bundles, as resume compares it: sha256 of the engine
    # config (engine.toml's rows and claims.json) and the manifest's tolerance file digest
    engine_config_digest: str = ""
    tolerances_digest: str = ""
    # --shuffle: the seed, and the case ids in the order this invocation ran them
    shuffle_seed: int | None = None
    order: tuple[str, ...] = ()
    # --run-skipped: the skip rows' cases were run; each row whose cases all passed
    # ({"row", "detail", "cases"}: harness.stale_skips)
    run_skipped: bool = False
    stale_skips: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:   # read back from JSON, per_device is a list
        object.__setattr__(self, "per_device", tuple(dict(d) for d in self.per_device))
        object.__setattr__(self, "order", tuple(self.order))
        object.__setattr__(self, "stale_skips", tuple(dict(s) for s in self.stale_skips))

    @property
    def outside_cases_s(self) -> float:
        return (self.before_s or 0.0) + self.elapsed_s - self.cases_s

    def to_json(self) -> dict:
        return {**asdict(self), "outside_cases_s": self.outside_cases_s}


def run_json_of(results: Path | str) -> Path:
    """The run.json that belongs to a results file: `run.json` beside `results.jsonl[.gz]`
    (a run directory), else `<name>.run.json` beside `<name>.results.jsonl[.gz]`."""
    path = results_file(results)
    if path.name.startswith(RESULTS_NAME):
        return path.with_name(RUN_NAME)
    name = path.name
    for suffix in (".gz", ".jsonl", ".results"):
        name = name.removesuffix(suffix)
    return path.with_name(f"{name}.{RUN_NAME}")


def read_run_times(path: Path | str) -> RunTimes | None:
    """run.json of a run directory (or the file itself); None when absent or unreadable."""
    path = Path(path)
    path = path / RUN_NAME if path.is_dir() else path
    try:
        data = json.loads(safe_read.read_text(path))    # a FIFO there must not block a resume
        names = {f for f in RunTimes.__dataclass_fields__}
        return RunTimes(**{k: v for k, v in data.items() if k in names})
    except (OSError, ValueError, TypeError):
        return None
