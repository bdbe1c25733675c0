"""The GitHub Actions workflow `bundlegen lanes --emit github-actions` writes from lanes.yaml:
a check job (the workspace's generated files and claims still match their sources) and one
job per lane, each a matrix over its shards, run on the lane's triggers, limited to its
job_timeout, after the check passes. Action majors are ones that run on node24."""
from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

from bundlegen.harness.lanes import Lane, LanesError, LanesFile
from bundlegen.harness.lanes_install import install_problem

WORKFLOW_OUT = Path(".github") / "workflows" / "bundlegen-lanes.yml"
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
#: where Triton keeps compiled kernels, which the workflow caches between runs
TRITON_CACHE = "~/.triton/cache"
PIP_CACHE = "~/.cache/pip"
#: the actions the workflow uses, at majors whose runtime is node24 (node20 is deprecated)
CHECKOUT = "actions/checkout@v5"
SETUP_PYTHON = "actions/setup-python@v6"
CACHE = "actions/cache@v5"
UPLOAD_ARTIFACT = "actions/upload-artifact@v6"
CHECK_JOB = "check"
CHECK_MINUTES = 30
#: the branch a push runs lanes on
PUSH_BRANCHES = ["main"]
ALWAYS = "${{ always() }}"


def github_actions(lanes: LanesFile, python: str = "3.12") -> dict:
    """The workflow as a mapping; LanesError when its install lines cannot bring bundlegen."""
    problem = install_problem(lanes)
    if problem:
        raise LanesError(problem)
    jobs = {CHECK_JOB: _check_job(lanes, python)}
    for lane in lanes.lanes.values():
        jobs[f"lane-{lane.name}"] = _lane_job(lane, lanes, python)
    return {
        "name": "bundlegen lanes",
        "on": _events(lanes),
        # one run per event and ref at a time; a newer push to a pull request cancels its older run
        "concurrency": {"group": "bundlegen-${{ github.workflow }}-${{ github.event_name }}-${{ github.ref }}",
                        "cancel-in-progress": "${{ github.event_name == 'pull_request' }}"},
        "jobs": jobs,
    }


def _events(lanes: LanesFile) -> dict:
    wanted = {t for lane in lanes.lanes.values() for t in lane.triggers}
    events: dict = {}
    if "push" in wanted:
        events["push"] = {"branches": PUSH_BRANCHES}
    if "pull_request" in wanted:
        events["pull_request"] = {}
    crons = list(dict.fromkeys(lane.cron for lane in lanes.lanes.values() if lane.cron))
    if crons:
        events["schedule"] = [{"cron": cron} for cron in crons]
    if "workflow_dispatch" in wanted:
        events["workflow_dispatch"] = {}
    return events


def _runs_on(lane: Lane) -> str:
    """The job's `if`: the lane's triggers (a scheduled run only for the lane's own cron)."""
    tests = [f"github.event_name == '{t}'" for t in lane.triggers if t != "schedule"]
    if lane.cron:
        tests.append(f"(github.event_name == 'schedule' && github.event.schedule == '{lane.cron}')")
    return " || ".join(tests)


def _setup(lanes: LanesFile, python: str, torch_index: str) -> list[dict]:
    """Checkout, Python, pip's cache (keyed by the install lines and the lock files), torch
    and the install lines."""
    installed = hashlib.sha256("\n".join(lanes.install).encode()).hexdigest()[:12]
    locks = ", ".join(f"'{pattern}'" for pattern in lanes.lock)
    pip_key = f"pip-${{{{ runner.os }}}}-py{python}-{installed}-"
    torch = "python -m pip install --upgrade pip\npython -m pip install torch" + (
        f" --index-url {torch_index}" if torch_index else "")
    return [
        {"uses": CHECKOUT},
        {"uses": SETUP_PYTHON, "with": {"python-version": python}},
        {"name": "pip's cache", "uses": CACHE,
         "with": {"path": PIP_CACHE, "key": pip_key + f"${{{{ hashFiles({locks}) }}}}", "restore-keys": pip_key}},
        {"name": "install torch", "run": torch},
        {"name": "install bundlegen and the workspace (lanes.yaml install)", "run": "\n".join(lanes.install)},
    ]


def check_lines(lanes: LanesFile) -> list[str]:
    """What the check job runs, of what the workspace has (when the workflow is emitted):
    its generated bundles match its plan, each engine TOML's generated tolerance block
    matches the tolerance TOML, its support matrix matches the claims and their evidence;
    and the lanes are sound."""
    from bundlegen.tolerance_block import BEGIN
    from bundlegen.workspace import find_workspace

    workspace = find_workspace(lanes.path.parent)
    if workspace is None:
        return ["bundlegen lanes --check"]
    lines = ["bundlegen generate --check"] if workspace.bundles.is_dir() else []
    for engine in dict.fromkeys(lane.engine for lane in lanes.lanes.values()):
        toml = workspace.engine_config_dir(engine) / "engine.toml" if ":" not in engine else None
        if toml is not None and toml.is_file() and BEGIN in toml.read_text(encoding="utf-8"):
            lines.append(f"bundlegen tolerances --check --engine {engine}")
    if workspace.matrix.is_file():
        lines.append("bundlegen matrix --check")
    return [*lines, "bundlegen lanes --check"]


def _check_job(lanes: LanesFile, python: str) -> dict:
    return {"name": "generated files and claims up to date",
            "runs-on": "ubuntu-latest", "timeout-minutes": CHECK_MINUTES,
            "steps": [*_setup(lanes, python, CPU_TORCH_INDEX),
                      {"name": "bundles, tolerance blocks, claims and lanes", "run": "\n".join(check_lines(lanes))}]}


def _lane_job(lane: Lane, lanes: LanesFile, python: str) -> dict:
    """One lane: a matrix over its shards on its runner, restoring Triton's compiled kernels
    (keyed by triton_cache_key), running `bundlegen run --lane L --shard I/N`, showing the
    junit in the job summary and uploading what the lane keeps (and the HTML report, when it
    keeps one), pass or fail."""
    include = []
    for index in range(1, lane.shards + 1):
        out = lane.out_dir((index, lane.shards)).as_posix()
        include.append({"shard": index, "out": out,
                        "artifacts": "\n".join(f"{out}/{name}" for name in lane.kept())})
    runner = list(lane.runner) if isinstance(lane.runner, tuple) else lane.runner
    torch_index = CPU_TORCH_INDEX if lane.device == "cpu" and not lane.devices else ""
    steps = [
        *_setup(lanes, python, torch_index),
        {"name": "the Triton kernels' digest", "id": "triton-key",
         "run": 'echo "key=$(bundlegen lanes --triton-cache-key)" >> "$GITHUB_OUTPUT"'},
        {"name": "Triton's cache", "uses": CACHE,
         "with": {"path": TRITON_CACHE, "key": f"triton-${{{{ runner.os }}}}-{lane.name}-"
                                               "${{ steps.triton-key.outputs.key }}"}},
        {"name": "bundlegen run", "run": f"bundlegen run --lane {lane.name} --shard ${{{{ matrix.shard }}}}/{lane.shards}"},
        {"name": "junit in the job summary", "if": ALWAYS,
         "run": 'bundlegen lanes --junit-summary ${{ matrix.out }}/junit.xml >> "$GITHUB_STEP_SUMMARY"'},
    ]
    if "report" in lane.keep:
        steps.append({"name": "HTML report", "if": ALWAYS,
                      "run": "bundlegen report ${{ matrix.out }} --html ${{ matrix.out }}/report"})
    steps.append({"name": "keep the results", "if": ALWAYS, "uses": UPLOAD_ARTIFACT,
                  "with": {"name": f"bundlegen-{lane.name}-shard-${{{{ matrix.shard }}}}-of-{lane.shards}",
                           "path": "${{ matrix.artifacts }}", "if-no-files-found": "warn"}})
    return {"name": f"{lane.name} ${{{{ matrix.shard }}}}/{lane.shards}", "needs": CHECK_JOB,
            "if": _runs_on(lane), "runs-on": runner, "timeout-minutes": lane.job_minutes,
            "strategy": {"fail-fast": False, "matrix": {"include": include}}, "steps": steps}


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


def workflow_yaml(lanes: LanesFile) -> str:
    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):   # several lines (scripts, artifact paths) as a | block
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    header = f"# Written by `bundlegen lanes --emit github-actions` from {lanes.path.name}; edit that, not this.\n"
    return header + yaml.dump(github_actions(lanes), Dumper=Dumper, sort_keys=False, width=120)
