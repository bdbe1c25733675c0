"""CI lanes (`lanes.yaml` in the workspace, CONTRACTS "Lanes"): named runs with their engine,
device, level, shard count, per-case timeout, what CI keeps, where they run, and extra
skips that each name a ticket.

    lanes:
      cpu-quick:
        engine: torch-math
        device: cpu
        level: quick
        shards: 1            # optional, default 1
        timeout: 600         # optional, seconds per case
        keep: [results, junit, report]   # optional, default [results, junit]
        runner: ubuntu-latest            # optional: GitHub Actions runs-on (a label or a list)
        arch: sm90           # optional: the arch the lane is meant for (documentation)
        devices: all         # optional: several devices of one host (bundlegen run --devices)
        workers_per_device: 4   # optional, default 1: worker processes sharing each device
        mps: true            # optional, default false: GPU workers share a private CUDA MPS server
        triggers: [pull_request, push]   # optional, default: pull_request, push, workflow_dispatch
        cron: "0 3 * * *"    # optional: also on this schedule (UTC)
        job_timeout: 60      # optional, default 60: minutes the CI job may take (timeout-minutes)
        skips:               # optional: rows shaped like engine.toml [[test_skips]]
          - filters: {item: "AX-FOO*"}
            reason: "PROJ-12: flaky on the interpreter"

    install:                 # the workflow's install lines, run after torch: where bundlegen
      - python -m pip install "bundlegen[triton] @ git+https://example.org/bundlegen.git@v1.0"
      - python -m pip install -e .
    lock: [requirements.txt] # optional: files (globs) whose digest keys the pip cache

`lanes --emit` and `lanes --check` refuse install lines that cannot bring bundlegen
(harness.lanes_install.install_problem): it is not on the public package index.
Read with pyyaml's safe loader; every error is one line `<file>: lanes.<name>.<key>: ...`.
bundlegen/schemas/lanes.schema.json is the JSON Schema of the file (lanes_schema())."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from bundlegen import safe_read
from bundlegen.results_file import DEFAULT_OUT
from bundlegen.engines.registry import EngineNotFound, registered_name
from bundlegen.graph import BundleError
from bundlegen.workspace import find_workspace
from bundlegen.harness import bundles as B
from bundlegen.harness.config import EngineConfigError, SkipRow, plan_names, skip_row
from bundlegen.harness.workers.devices import DEVICE_RE, device_list
from bundlegen.harness.workers.mps import mps_devices_problem

#: what a ticket looks like where a skip names one: PROJECT-123, owner/repo#123 or a URL
TICKET_RE = re.compile(r"\b[A-Z][A-Z0-9_]*-\d+\b|\b[\w.-]+/[\w.-]+#\d+\b|https?://\S+")
LANE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
#: keep entry -> what it keeps of the lane's out folder; run.json (what the run was) is always kept
KEEP = {"results": "results.jsonl", "junit": "junit.xml", "report": "report"}
ALWAYS_KEPT = "run.json"
DEFAULT_KEEP = ("results", "junit")
DEFAULT_RUNNER = "ubuntu-latest"
LANE_KEYS = ("engine", "device", "devices", "workers_per_device", "mps", "arch", "level", "shards",
             "timeout", "keep", "runner", "triggers", "cron", "job_timeout", "skips", "description")
#: the GitHub events a lane may run on (`schedule` comes with `cron`)
TRIGGERS = ("pull_request", "push", "schedule", "workflow_dispatch")
DEFAULT_TRIGGERS = ("pull_request", "push", "workflow_dispatch")
#: a cron line as GitHub's schedule takes it: five fields (minute hour day month weekday)
CRON_RE = re.compile(r"^\S+( \S+){4}$")
DEFAULT_JOB_MINUTES = 60
REQUIRED = ("engine", "device", "level")
#: the keys of the file's top level
TOP_KEYS = ("lanes", "install", "lock")
#: the files whose digest keys the pip cache when lanes.yaml names none (globs, as
#: GitHub's hashFiles takes them; a pattern that matches nothing adds nothing)
DEFAULT_LOCK = ("pyproject.toml", "setup.py", "setup.cfg", "requirements*.txt", "*.lock")


class LanesError(ValueError):
    """lanes.yaml is missing or malformed, or names no such lane: one line naming file, lane, key."""


def names_ticket(text: str) -> bool:
    return TICKET_RE.search(text) is not None


@dataclass(frozen=True)
class Lane:
    name: str
    engine: str
    device: str
    level: str
    shards: int = 1
    timeout_s: float | None = None
    keep: tuple[str, ...] = DEFAULT_KEEP
    runner: str | tuple[str, ...] = DEFAULT_RUNNER   # runs-on: a label, or labels all required
    arch: str | None = None
    devices: str | None = None          # as --devices takes it: "all" or "cuda:0,cuda:1"
    workers_per_device: int = 1         # as --workers-per-device takes it
    mps: bool = False                   # as --mps takes it
    triggers: tuple[str, ...] = DEFAULT_TRIGGERS   # the events the lane's CI job runs on
    cron: str | None = None             # a schedule (with "schedule" among the triggers)
    job_minutes: int = DEFAULT_JOB_MINUTES   # the CI job's timeout-minutes
    skips: tuple[SkipRow, ...] = ()
    description: str = ""

    def out_dir(self, shard: tuple[int, int] | None = None) -> Path:
        """Where `bundlegen run --lane` writes (the workflow uploads from here)."""
        base = DEFAULT_OUT / "lanes" / self.name
        return base if shard is None else base / f"shard-{shard[0]}-of-{shard[1]}"

    def kept(self) -> tuple[str, ...]:
        """The names under out_dir that CI keeps."""
        return (ALWAYS_KEPT, *(KEEP[key] for key in self.keep))


@dataclass(frozen=True)
class LanesFile:
    path: Path
    lanes: Mapping[str, Lane]
    install: tuple[str, ...] | None = None   # None: lanes.yaml names none (emit refuses)
    lock: tuple[str, ...] = DEFAULT_LOCK

    def lane(self, name: str) -> Lane:
        if name not in self.lanes:
            raise LanesError(f"{self.path}: lanes.{name}: no such lane "
                             f"(known: {', '.join(self.lanes) or 'none'})")
        return self.lanes[name]


def lanes_path(explicit: Path | str | None = None) -> Path:
    """`explicit`, else the current workspace's lanes file; LanesError outside a workspace."""
    if explicit is not None:
        return Path(explicit)
    workspace = find_workspace()
    if workspace is None:
        raise LanesError(f"{Path.cwd()} is not inside a bundlegen workspace, so it has no lanes file "
                         "(give --lanes-file)")
    return workspace.lanes


def load_lanes(path: Path | str) -> LanesFile:
    path = Path(path)
    try:
        doc = yaml.safe_load(safe_read.read_text(path))
    except OSError as exc:
        raise LanesError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f"line {where.line + 1}: " if where is not None else ""
        raise LanesError(f"{path}: {line}not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(doc, dict) or set(doc) - set(TOP_KEYS):
        raise LanesError(f"{path}: top level: expected a mapping of {', '.join(TOP_KEYS)}")
    raw = doc.get("lanes")
    if not isinstance(raw, dict) or not raw:
        raise LanesError(f"{path}: lanes: expected a mapping of lane name -> lane")
    install = _lines(path, "install", doc.get("install"))
    lock = _lines(path, "lock", doc.get("lock"))
    return LanesFile(path=path, lanes={str(name): _lane(path, name, body) for name, body in raw.items()},
                     install=install, lock=DEFAULT_LOCK if lock is None else lock)


def _lines(path: Path, key: str, raw: Any) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw or not all(isinstance(v, str) and v.strip() for v in raw):
        raise LanesError(f"{path}: {key}: expected a list of non-empty strings, got {raw!r}")
    return tuple(raw)


def _lane(path: Path, name: Any, body: Any) -> Lane:
    where = f"{path}: lanes.{name}"
    if not isinstance(name, str) or not LANE_NAME_RE.match(name):
        raise LanesError(f"{where}: a lane name is lower-case letters, digits and '-'")
    if not isinstance(body, dict):
        raise LanesError(f"{where}: expected a mapping of {', '.join(LANE_KEYS)}")
    for key in body:
        if key not in LANE_KEYS:
            raise LanesError(f"{where}.{key}: unknown key (known: {', '.join(LANE_KEYS)})")
    for key in REQUIRED:
        if key not in body:
            raise LanesError(f"{where}.{key}: missing (a lane needs {', '.join(REQUIRED)})")

    def text(key: str, default: str | None = None) -> str | None:
        value = body.get(key, default)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise LanesError(f"{where}.{key}: expected a non-empty string, got {value!r}")
        return value

    shards = body.get("shards", 1)
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise LanesError(f"{where}.shards: expected a whole number >= 1, got {shards!r}")
    per_device = body.get("workers_per_device", 1)
    if isinstance(per_device, bool) or not isinstance(per_device, int) or per_device < 1:
        raise LanesError(f"{where}.workers_per_device: expected a whole number >= 1, got {per_device!r}")
    mps = body.get("mps", False)
    if not isinstance(mps, bool):
        raise LanesError(f"{where}.mps: expected true or false, got {mps!r}")
    timeout = body.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0):
        raise LanesError(f"{where}.timeout: expected seconds > 0, got {timeout!r}")
    keep = body.get("keep", list(DEFAULT_KEEP))
    if not isinstance(keep, list) or not all(isinstance(k, str) and k in KEEP for k in keep):
        raise LanesError(f"{where}.keep: expected a list of {', '.join(KEEP)}, got {keep!r}")
    if not DEVICE_RE.fullmatch(text("device")):
        raise LanesError(f"{where}.device: {body['device']!r}: expected cpu, cuda or cuda:N")
    devices = text("devices")
    try:
        if devices is not None:
            device_list(devices)
    except ValueError as exc:
        raise LanesError(f"{where}.devices: {str(exc).removeprefix('--devices ')}") from None
    if mps:
        problem = mps_devices_problem((device_list(devices) or ["cuda"]) if devices else [text("device")])
        if problem:
            raise LanesError(f"{where}.mps: {problem.removeprefix('--mps: ')}")
    runner = body.get("runner", DEFAULT_RUNNER)
    if isinstance(runner, list) and runner and all(isinstance(r, str) and r.strip() for r in runner):
        runner = tuple(runner)
    elif not (isinstance(runner, str) and runner.strip()):
        raise LanesError(f"{where}.runner: expected a runner label or a list of labels, got {runner!r}")
    triggers, cron, job_minutes = _schedule(where, body, timeout)
    return Lane(name=name, engine=text("engine"), device=text("device"), level=text("level"),
                shards=shards, timeout_s=None if timeout is None else float(timeout),
                keep=tuple(dict.fromkeys(keep)), runner=runner,
                arch=text("arch"), devices=devices, workers_per_device=per_device, mps=mps,
                triggers=triggers, cron=cron, job_minutes=job_minutes,
                skips=_skips(path, name, body.get("skips", [])),
                description=text("description") or "")


def _schedule(where: str, body: Mapping, case_timeout: float | None) -> tuple[tuple[str, ...], str | None, int]:
    """When the lane's CI job runs and how long it may take: its triggers (a cron adds
    `schedule`), its cron line, its timeout-minutes (at least one case's timeout)."""
    triggers = body.get("triggers", list(DEFAULT_TRIGGERS))
    if (not isinstance(triggers, list) or not triggers
            or not all(isinstance(t, str) and t in TRIGGERS for t in triggers)):
        raise LanesError(f"{where}.triggers: expected a list of {', '.join(TRIGGERS)}, got {triggers!r}")
    cron = body.get("cron")
    if cron is not None and not (isinstance(cron, str) and CRON_RE.match(cron)):
        raise LanesError(f"{where}.cron: expected five fields (minute hour day month weekday), got {cron!r}")
    if cron is not None and "schedule" not in triggers:
        triggers = [*triggers, "schedule"]
    if "schedule" in triggers and cron is None:
        raise LanesError(f"{where}.triggers: schedule needs a cron line (cron: \"0 3 * * *\")")
    minutes = body.get("job_timeout", DEFAULT_JOB_MINUTES)
    if isinstance(minutes, bool) or not isinstance(minutes, int) or minutes < 1:
        raise LanesError(f"{where}.job_timeout: expected whole minutes >= 1, got {minutes!r}")
    if case_timeout is not None and minutes * 60 < case_timeout:
        raise LanesError(f"{where}.job_timeout: {minutes} min is shorter than one case's timeout "
                         f"({case_timeout:g} s)")
    return tuple(dict.fromkeys(triggers)), cron, minutes


def _skips(path: Path, name: str, rows: Any) -> tuple[SkipRow, ...]:
    """engine.toml's [[test_skips]] row rules (bundlegen.harness.config), with errors that
    name the lane."""
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise LanesError(f"{path}: lanes.{name}.skips: expected a list of mappings (filters, reason)")
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(skip_row(path, f"lanes.{name}.skips[{i}]", row))
        except EngineConfigError as exc:
            raise LanesError(str(exc)) from None
    return tuple(out)


def lanes_schema() -> dict:
    """A JSON Schema (draft 2020-12) of lanes.yaml, built from the keys and rules load_lanes
    checks by (a skip row is engine.toml's [[test_skips]] row, skip_row_schema); published as
    bundlegen/schemas/lanes-yaml.schema.json. What needs the machine (are the MPS devices
    GPUs, does the engine exist) stays with the loader and `lanes --check`."""
    from bundlegen.harness.config import skip_row_schema

    text = {"type": "string", "pattern": "\\S"}
    lines = {"type": "array", "minItems": 1, "items": text}
    count = {"type": "integer", "minimum": 1}
    lane = {
        "engine": {**text, "description": "engine name or package.module:Class"},
        "device": {"type": "string", "pattern": f"^(?:{DEVICE_RE.pattern})$"},
        "devices": {**text, "description": "several devices of one host: all, or cuda:0,cuda:1"},
        "workers_per_device": {**count, "default": 1},
        "mps": {"type": "boolean", "default": False},
        "arch": text,
        "level": text,
        "shards": {**count, "default": 1},
        "timeout": {"type": "number", "exclusiveMinimum": 0, "description": "seconds per case"},
        "keep": {"type": "array", "items": {"enum": list(KEEP)}, "default": list(DEFAULT_KEEP)},
        "runner": {"oneOf": [text, lines], "default": DEFAULT_RUNNER,
                   "description": "GitHub Actions runs-on: a label, or labels all required"},
        "triggers": {"type": "array", "minItems": 1, "items": {"enum": list(TRIGGERS)},
                     "default": list(DEFAULT_TRIGGERS)},
        "cron": {"type": "string", "pattern": CRON_RE.pattern, "description": "a schedule, UTC"},
        "job_timeout": {**count, "default": DEFAULT_JOB_MINUTES, "description": "the CI job's minutes"},
        "skips": {"type": "array", "items": {"$ref": "#/$defs/skip"}},
        "description": text,
    }
    assert tuple(lane) == LANE_KEYS
    skip = {key: value for key, value in skip_row_schema().items() if key not in ("$schema", "$defs")}
    defs = {"skip": skip, **skip_row_schema()["$defs"]}
    top = {
        "lanes": {"type": "object", "minProperties": 1,
                  "propertyNames": {"pattern": LANE_NAME_RE.pattern},
                  "additionalProperties": {"$ref": "#/$defs/lane"}},
        "install": {**lines, "description": "the workflow's install lines: where bundlegen comes from "
                                              "(a pinned git URL, a wheel path or a checkout)"},
        "lock": {**lines, "default": list(DEFAULT_LOCK),
                 "description": "files (globs) whose digest keys the workflow's pip cache"},
    }
    assert tuple(top) == TOP_KEYS
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "lanes.yaml (bundlegen CI lanes)",
            "type": "object", "additionalProperties": False, "required": ["lanes"], "properties": top,
            "$defs": {"lane": {"type": "object", "additionalProperties": False, "required": list(REQUIRED),
                               "properties": lane}, **defs}}


# ----------------------------------------------------------------------------- check
def check_lanes(lanes: LanesFile, bundles: Path | str | None = None) -> list[str]:
    """What `bundlegen lanes --check` reports, one line each: install lines that cannot
    bring bundlegen, an engine that does not exist, a level the bundles do not have, a skip
    that matches no case of the lane's levels or names no ticket, an override or skip row
    of a lane's engine.toml that selects no case of the plan."""
    from bundlegen.harness.lanes_install import install_problem

    problems = []
    install = install_problem(lanes)
    if install:
        problems.append(install)
    root = Path(bundles) if bundles is not None else B.default_bundle_root()
    try:
        manifest = B.manifest_of(root)
    except BundleError as exc:
        return [f"{lanes.path}: bundles: {exc}"]
    for lane in lanes.lanes.values():
        where = f"{lanes.path}: lanes.{lane.name}"
        try:
            registered_name(lane.engine)
        except EngineNotFound as exc:
            problems.append(f"{where}.engine: {exc}")
        if lane.level not in [lv.name for lv in manifest.levels]:
            problems.append(f"{where}.level: {lane.level!r} is not a level of plan {manifest.plan} "
                            f"({', '.join(lv.name for lv in manifest.levels)})")
            continue
        if not lane.skips:
            continue
        cases = B.load_level(root, lane.level, manifest.plan).cases
        for i, row in enumerate(lane.skips):
            if not names_ticket(row.detail):
                problems.append(f"{where}.skips[{i}].reason: names no ticket ({row.detail!r}; "
                                "expected PROJECT-123, owner/repo#123 or a URL)")
            if not any(row.selects(c, plan_names(manifest)) for c in cases):
                problems.append(f"{where}.skips[{i}].filters: match no case of level {lane.level} "
                                "(the cases it skipped are gone: drop the row)")
    return problems + _engine_dead_rows(lanes, root, manifest)


def _engine_dead_rows(lanes: LanesFile, root: Path, manifest) -> list[str]:
    """The rows of the lanes' engines' engine.toml files that select no case of the plan."""
    from bundlegen.harness.config import load_engine_config
    from bundlegen.harness.dead_rows import dead_rows, plan_cases
    from bundlegen.workspace import engine_config_dir

    configs, problems = [], []
    for engine in dict.fromkeys(lane.engine for lane in lanes.lanes.values()):
        try:
            configs.append(load_engine_config(engine_config_dir(registered_name(engine)), manifest))
        except EngineNotFound:
            continue   # reported with the lane
        except (EngineConfigError, ValueError) as exc:
            problems.append(str(exc))
    if any(c.overrides or c.skips for c in configs):
        cases = plan_cases(root, manifest)
        problems += [f"{line} (drop or mend the row)" for config in configs for line in dead_rows(config, cases)]
    return problems
