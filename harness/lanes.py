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
        skips:               # optional: rows shaped like engine.toml [[test_skips]]
          - filters: {item: "AX-FOO*"}
            reason: "PROJ-12: flaky on the interpreter"

    install:                 # optional: the workflow's install lines, run after torch
      - python -m pip install "bundlegen[triton]"
      - python -m pip install -e .
    lock: [requirements.txt] # optional: files (globs) whose digest keys the pip cache

Without `install`, the workflow installs bundlegen (with the extras its lanes need) and then
the workspace's own package when the workspace root has one (pyproject.toml, setup.py).
Read with pyyaml's safe loader; every error is one line `<file>: lanes.<name>.<key>: ...`.
bundlegen/schemas/lanes.schema.json is the JSON Schema of the file (lanes_schema())."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from bundlegen.engines.registry import EngineNotFound, registered_name
from bundlegen.graph import BundleError
from bundlegen.workspace import find_workspace
from bundlegen.harness import bundles as B
from bundlegen.harness.config import EngineConfigError, SkipRow, skip_row
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
             "timeout", "keep", "runner", "skips", "description")
REQUIRED = ("engine", "device", "level")
#: the keys of the file's top level
TOP_KEYS = ("lanes", "install", "lock")
#: the files whose digest keys the pip cache when lanes.yaml names none (globs, as
#: GitHub's hashFiles takes them; a pattern that matches nothing adds nothing)
DEFAULT_LOCK = ("pyproject.toml", "setup.py", "setup.cfg", "requirements*.txt", "*.lock")
#: what makes a folder a Python package the default install installs (pip install -e .)
PACKAGE_FILES = ("pyproject.toml", "setup.py")
#: where Triton keeps compiled kernels, which the workflow caches between runs
TRITON_CACHE = "~/.triton/cache"
PIP_CACHE = "~/.cache/pip"


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
    skips: tuple[SkipRow, ...] = ()
    description: str = ""

    def out_dir(self, shard: tuple[int, int] | None = None) -> Path:
        """Where `bundlegen run --lane` writes (the workflow uploads from here)."""
        base = Path("out") / "lanes" / self.name
        return base if shard is None else base / f"shard-{shard[0]}-of-{shard[1]}"

    def kept(self) -> tuple[str, ...]:
        """The names under out_dir that CI keeps."""
        return (ALWAYS_KEPT, *(KEEP[key] for key in self.keep))


@dataclass(frozen=True)
class LanesFile:
    path: Path
    lanes: Mapping[str, Lane]
    install: tuple[str, ...] | None = None   # None: default_install
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
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
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
    return Lane(name=name, engine=text("engine"), device=text("device"), level=text("level"),
                shards=shards, timeout_s=None if timeout is None else float(timeout),
                keep=tuple(dict.fromkeys(keep)), runner=runner,
                arch=text("arch"), devices=devices, workers_per_device=per_device, mps=mps,
                skips=_skips(path, name, body.get("skips", [])),
                description=text("description") or "")


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
        "install": {**lines, "description": "the workflow's install lines (default: bundlegen with the "
                                              "extras the lanes need, then the workspace's package)"},
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
    """What `bundlegen lanes --check` reports, one line each: an engine that does not
    exist, a level the bundles do not have, a skip that matches no case of the lane's
    levels or names no ticket."""
    problems = []
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
            if not any(row.selects(c, manifest.plan) for c in cases):
                problems.append(f"{where}.skips[{i}].filters: match no case of level {lane.level} "
                                "(the cases it skipped are gone: drop the row)")
    return problems


# ----------------------------------------------------------------------------- workflow
WORKFLOW_OUT = Path(".github") / "workflows" / "bundlegen-lanes.yml"
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def default_install(lanes: LanesFile) -> tuple[str, ...]:
    """bundlegen with the extras the lanes need (triton for a triton lane, report for a lane
    that keeps one), then the workspace's own package when its root has one."""
    extras = sorted({"triton" for lane in lanes.lanes.values() if lane.engine == "triton"}
                    | {"report" for lane in lanes.lanes.values() if "report" in lane.keep})
    lines = [f'python -m pip install "bundlegen{"[" + ",".join(extras) + "]" if extras else ""}"']
    workspace = find_workspace(lanes.path.parent)
    root = workspace.root if workspace is not None else lanes.path.parent
    if any((root / name).is_file() for name in PACKAGE_FILES):
        lines.append("python -m pip install -e .")
    return tuple(lines)


def install_lines(lanes: LanesFile) -> tuple[str, ...]:
    return lanes.install if lanes.install is not None else default_install(lanes)


def triton_cache_key() -> str:
    """What the Triton cache of a CI runner is keyed by: a digest of the installed Triton
    engine's source files (bundlegen/engines/triton/*.py) and the installed Triton's version,
    read without importing either; a change to a kernel starts a fresh cache."""
    import importlib.util
    from importlib import metadata

    digest = hashlib.sha256()
    spec = importlib.util.find_spec("bundlegen.engines.triton")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        for source in sorted(Path(folder).glob("*.py")):
            digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    try:
        digest.update(f"triton {metadata.version('triton')}".encode())
    except metadata.PackageNotFoundError:
        digest.update(b"triton not installed")
    return digest.hexdigest()[:16]


def github_actions(lanes: LanesFile, python: str = "3.12") -> dict:
    """A GitHub Actions workflow: one job, a matrix over lanes x shards (each entry runs on
    its lane's runner), each installing torch and then the lanes file's install lines
    (pip's cache kept between runs, keyed by the install lines and the lock files), keeping
    Triton's compiled kernels between runs (keyed by triton_cache_key), running
    `bundlegen run --lane L --shard I/N`, showing the junit in the job summary and uploading
    what the lane keeps (and the HTML report, when it keeps one), pass or fail."""
    include = []
    for lane in lanes.lanes.values():
        for index in range(1, lane.shards + 1):
            out = lane.out_dir((index, lane.shards)).as_posix()
            include.append({
                "lane": lane.name, "shard": index, "shards": lane.shards,
                "runner": list(lane.runner) if isinstance(lane.runner, tuple) else lane.runner,
                "out": out, "report": "report" in lane.keep,
                "torch_index": CPU_TORCH_INDEX if lane.device == "cpu" and not lane.devices else "",
                "artifacts": "\n".join(f"{out}/{name}" for name in lane.kept())})
    always = "${{ always() }}"
    install = install_lines(lanes)
    # the pip cache's key: the Python, what is installed, and the lock files' digest
    installed = hashlib.sha256("\n".join(install).encode()).hexdigest()[:12]
    locks = ", ".join(f"'{pattern}'" for pattern in lanes.lock)
    pip_key = f"pip-${{{{ runner.os }}}}-py{python}-{installed}-"
    steps = [
        {"uses": "actions/checkout@v4"},
        {"uses": "actions/setup-python@v5", "with": {"python-version": python}},
        {"name": "pip's cache", "uses": "actions/cache@v4",
         "with": {"path": PIP_CACHE, "key": pip_key + f"${{{{ hashFiles({locks}) }}}}",
                  "restore-keys": pip_key}},
        {"name": "install torch",
         "run": "python -m pip install --upgrade pip\n"
                "if [ -n \"${{ matrix.torch_index }}\" ]; then\n"
                "  python -m pip install torch --index-url \"${{ matrix.torch_index }}\"\n"
                "else\n  python -m pip install torch\nfi"},
        {"name": "install bundlegen and the workspace (lanes.yaml install)", "run": "\n".join(install)},
        {"name": "the Triton kernels' digest", "id": "triton-key",
         "run": 'echo "key=$(bundlegen lanes --triton-cache-key)" >> "$GITHUB_OUTPUT"'},
        {"name": "Triton's cache", "uses": "actions/cache@v4",
         "with": {"path": TRITON_CACHE,
                  "key": "triton-${{ runner.os }}-${{ matrix.lane }}-${{ steps.triton-key.outputs.key }}"}},
        {"name": "bundlegen run",
         "run": "bundlegen run --lane ${{ matrix.lane }} --shard ${{ matrix.shard }}/${{ matrix.shards }}"},
        {"name": "junit in the job summary", "if": always,
         "run": 'bundlegen lanes --junit-summary ${{ matrix.out }}/junit.xml >> "$GITHUB_STEP_SUMMARY"'},
        {"name": "HTML report", "if": "${{ always() && matrix.report }}",
         "run": "bundlegen report ${{ matrix.out }} --html ${{ matrix.out }}/report"},
        {"name": "keep the results", "if": always, "uses": "actions/upload-artifact@v4",
         "with": {"name": "bundlegen-${{ matrix.lane }}-shard-${{ matrix.shard }}-of-${{ matrix.shards }}",
                  "path": "${{ matrix.artifacts }}", "if-no-files-found": "warn"}},
    ]
    return {
        "name": "bundlegen lanes",
        "on": {"push": {"branches": ["main"]}, "pull_request": {}, "workflow_dispatch": {}},
        "jobs": {"lane": {
            "name": "${{ matrix.lane }} ${{ matrix.shard }}/${{ matrix.shards }}",
            "runs-on": "${{ matrix.runner }}",
            "strategy": {"fail-fast": False, "matrix": {"include": include}},
            "steps": steps}},
    }


def workflow_yaml(lanes: LanesFile) -> str:
    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):   # several lines (scripts, artifact paths) as a | block
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    header = f"# Written by `bundlegen lanes --emit github-actions` from {lanes.path.name}; edit that, not this.\n"
    return header + yaml.dump(github_actions(lanes), Dumper=Dumper, sort_keys=False, width=120)
