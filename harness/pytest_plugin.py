"""The harness as a pytest plugin: `pytest --bundlegen-level quick --bundlegen-engine
torch-math` collects one test item per case of that level and the lower ones, and runs it
as `bundlegen run` would. A failing verdict fails the item; declined and skipped cases are
reported as pytest skips; a probe rejected as expected passes.

Collection: the session's own collection gets one BundleFile collector per bundle file
(node id `<level>/sdpa_bwd/<group>.json`), each yielding a BundleCaseItem per case (node id
`<level>/sdpa_bwd/<group>.json::<case id>`), so pytest counts, selects (-k, -m) and reports
them like any other test. A malformed file or case is a collection error naming file, case
id and field; the good cases of a file with a bad case are still collected. Items carry the markers `claim`/`probe`/`regression` and their level.

Inert unless --bundlegen-level is given: it then replaces the default test paths with the
cases (explicit paths on the command line are still collected). Under pytest-xdist each
worker builds its own engine; with --bundlegen-device cuda and several GPUs, worker gwN
takes cuda:N mod (GPU count)."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from bundlegen.harness import verdicts as V

# the rest of the harness is imported inside the hooks that use it: every pytest session of
# this environment loads the plugin (the pytest11 entry point), most of them never active.

_EXECUTOR = pytest.StashKey()
_MANIFEST = pytest.StashKey()
_WRITER = pytest.StashKey()
PURPOSE_MARKERS = {"claim": "a bundle case whose pass may become a support claim",
                   "probe": "a bundle case that some layer must reject",
                   "regression": "a bundle case pinning a known defect class"}
#: the case id of a BundleError about a whole file (unreadable, bad header)
FILE_WIDE = "-"


def pytest_addoption(parser) -> None:
    group = parser.getgroup("bundlegen", "bundlegen harness (one test item per bundle case)")
    group.addoption("--bundlegen-level", default=None, help="run the cases of this level and the lower ones")
    group.addoption("--bundlegen-engine", default=None,
                    help="engine name or package.module:Class (required with --bundlegen-level: "
                         "a default would quietly test some other engine)")
    group.addoption("--bundlegen-device", default=None, help="cpu, cuda, cuda:N (default: cuda if available)")
    group.addoption("--bundlegen-bundles", default=None,
                    help="bundle root (default: the workspace's bundles, else the built-in ones)")
    group.addoption("--bundlegen-out", default=None, metavar="DIR",
                    help="where the results go: DIR/results.jsonl, or DIR/results-<worker>.jsonl per "
                         "xdist worker (default out/pytest-<level>)")
    group.addoption("--bundlegen-allow-empty", action="store_true",
                    help="pass a session whose cases were all declined or skipped (else it exits 5)")
    group.addoption("--bundlegen-timeout", type=float, default=None, help="per-case timeout in seconds")
    group.addoption("--bundlegen-no-isolation", action="store_true",
                    help="run the engine in the pytest process (no timeout, no crash isolation)")


def _active(config) -> bool:
    return config.getoption("bundlegen_level", None) is not None


def pytest_configure(config) -> None:
    for purpose, text in PURPOSE_MARKERS.items():
        config.addinivalue_line("markers", f"{purpose}: {text}")
    if not _active(config):
        return
    from bundlegen.graph import BundleError
    from bundlegen.harness.bundles import manifest_of

    bundles = config.getoption("bundlegen_bundles")
    if bundles is not None and not Path(bundles).is_dir():
        raise pytest.UsageError(f"--bundlegen-bundles: {bundles} is not a folder")
    try:
        manifest = manifest_of(_root(config))
    except BundleError as exc:
        raise pytest.UsageError(f"--bundlegen-bundles: {exc}") from None
    config.stash[_MANIFEST] = manifest
    for level in manifest.level_names:
        config.addinivalue_line("markers", f"{level}: a bundle case of level {level}")
    try:
        manifest.levels_upto(config.getoption("bundlegen_level"))
    except ValueError as exc:
        raise pytest.UsageError(f"--bundlegen-level: {exc}") from None
    engine = config.getoption("bundlegen_engine")
    if engine is None:
        raise pytest.UsageError("--bundlegen-level needs --bundlegen-engine NAME (an engine name or "
                                "package.module:Class), as `bundlegen run` needs --engine")
    _check_engine(engine)
    _check_device(config.getoption("bundlegen_device"))
    config.pluginmanager.register(NothingTestedGuard(config), "bundlegen-nothing-tested")


def _root(config) -> Path:
    from bundlegen.workspace import default_bundle_root

    return Path(config.getoption("bundlegen_bundles") or default_bundle_root())


def _check_engine(engine: str) -> None:
    from bundlegen.engines.registry import EngineNotFound, registered_name

    try:
        registered_name(engine)
    except EngineNotFound as exc:
        raise pytest.UsageError(f"--bundlegen-engine: {exc}") from None


def _check_device(device: str | None) -> None:
    """The same rules as `bundlegen run --device`: the name, then this machine has it."""
    if device is None:
        return
    from bundlegen.harness.workers.devices import DEVICE_RE, DeviceUnavailable, check_device

    if not DEVICE_RE.fullmatch(device):
        raise pytest.UsageError(f"--bundlegen-device: {device!r}: expected cpu, cuda or cuda:N")
    try:
        check_device(device)
    except DeviceUnavailable as exc:
        raise pytest.UsageError(f"--bundlegen-device: {exc}") from None


class NothingTestedGuard:
    """Counts, where the reports arrive (the xdist controller too), the cases run and those
    that tested something; a session whose bundle cases were all declined or skipped tested
    nothing and does not pass (exit 5, pytest's "no tests ran") unless
    --bundlegen-allow-empty. The terminal summary says why cases were not run (the most
    frequent reasons, all of them with -v)."""

    def __init__(self, config):
        self.config, self.run, self.tested, self.not_run = config, 0, 0, []

    def pytest_runtest_logreport(self, report) -> None:
        properties = dict(report.user_properties) if report.when == "call" else {}
        verdict = properties.get("verdict")
        if verdict is not None:
            self.run += 1
            self.tested += verdict not in V.NOT_RUN
            if verdict in V.NOT_RUN:
                self.not_run.append(properties)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if hasattr(self.config, "workerinput") or not self.not_run:
            return
        from bundlegen.harness.progress import TOP_REASONS, not_run_reasons

        terminalreporter.section("bundlegen: why cases were not run")
        for line in not_run_reasons(self.not_run, None if self.config.option.verbose > 0 else TOP_REASONS):
            terminalreporter.write_line(line)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        if (hasattr(self.config, "workerinput") or exitstatus != 0 or not self.run or self.tested
                or self.config.getoption("bundlegen_allow_empty")):
            return
        session.exitstatus = V.EXIT_NOTHING_TESTED
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"bundlegen: nothing was tested ({self.run} cases, all declined or skipped); "
                                f"exit {V.EXIT_NOTHING_TESTED} (--bundlegen-allow-empty accepts it)", red=True)


def pytest_ignore_collect(collection_path, config):
    if _active(config) and not config.option.file_or_dir:
        return True  # no paths named: the default test paths give way to the cases
    return None


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """The session's children gain one BundleFile per bundle file of the level."""
    report = yield
    if isinstance(collector, pytest.Session) and _active(collector.config) and report.passed:
        report.result.extend(_bundle_files(collector))
    return report


def _bundle_files(session) -> list[BundleFile]:
    from bundlegen.harness.bundles import load_level

    config = session.config
    root, plan = _root(config), config.stash[_MANIFEST].plan
    loaded = load_level(root, config.getoption("bundlegen_level"), plan)
    paths = list(dict.fromkeys([*loaded.files, *(Path(e.file) for e in loaded.errors)]))
    by_path = {path: ([], []) for path in paths}
    for case in loaded.cases:
        by_path[loaded.file_of[case.id]][0].append(case)
    for error in loaded.errors:
        by_path[Path(error.file)][1].append(error)
    files = []
    for path, (cases, errors) in by_path.items():
        name = _relative(root, path)
        files.append(BundleFile.from_parent(session, path=path, name=name, nodeid=name,
                                            cases=tuple(cases), errors=tuple(errors)))
    return files


def _relative(root: Path, path: Path) -> str:
    from bundlegen.harness.bundles import file_name

    try:
        return file_name(path, root)     # an extension's built-in files: built-in/<path>
    except ValueError:
        return path.as_posix()


class BundleFault(Exception):
    """Faults of a bundle file or case, one line each (file, case id, field, message)."""

    def __init__(self, errors):
        super().__init__("\n".join(f"error:bundle: {error}" for error in errors))


class _ReportsFaults:
    """For collectors: a BundleFault is shown as its lines, without a traceback."""

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, BundleFault):
            return str(excinfo.value)
        return super().repr_failure(excinfo)


class BundleFile(_ReportsFaults, pytest.File):
    """One bundle file: an item per good case and a MalformedCase per bad one, or, when
    the file itself is at fault (unreadable, bad header), one collection error."""

    def __init__(self, *, cases, errors, **kwargs):
        super().__init__(**kwargs)
        self.cases, self.errors = cases, errors

    def collect(self):
        if any(error.case_id == FILE_WIDE for error in self.errors):
            raise BundleFault(self.errors)
        for case in self.cases:
            yield BundleCaseItem.from_parent(self, name=case.id, case=case)
        for error in self.errors:
            yield MalformedCase.from_parent(self, name=f"{error.case_id}:{error.field}", error=error)


class MalformedCase(_ReportsFaults, pytest.Collector):
    """A case its file could not give: a collection error naming file, case id and field."""

    def __init__(self, *, error, **kwargs):
        super().__init__(**kwargs)
        self.error = error

    def collect(self):
        raise BundleFault([self.error])


class BundleCaseFailure(Exception):
    pass


class BundleCaseItem(pytest.Item):
    def __init__(self, *, case, **kwargs):
        super().__init__(**kwargs)
        self.case = case
        self.add_marker(case.purpose)
        if case.level:
            self.add_marker(case.level)
        self.extra_keyword_matches.update({case.group, *case.items})

    def runtest(self) -> None:
        result = _executor(self.config, self.session).execute(self.case)
        _writer(self.config).write(result)
        for name in ("verdict", "reason", "detail", "margin", "wall_s"):
            self.user_properties.append((name, getattr(result, name)))
        if result.verdict in V.FAILING:
            raise BundleCaseFailure(f"{result.verdict}: {result.detail}" +
                                    (f" (reason {result.reason})" if result.reason else ""))
        if result.verdict in V.NOT_RUN:
            pytest.skip(f"{result.verdict}: {result.reason or result.detail}")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, BundleCaseFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, self.nodeid


def _writer(config):
    """One results file per pytest process, opened at its first case (results.jsonl, or
    results-<worker>.jsonl under xdist, where the workers write side by side)."""
    writer = config.stash.get(_WRITER, None)
    if writer is None:
        from bundlegen.harness.results import RESULTS_NAME, ResultsWriter

        out = Path(config.getoption("bundlegen_out") or Path("out") / f"pytest-{config.getoption('bundlegen_level')}")
        worker = getattr(config, "workerinput", {}).get("workerid")   # this session's own xdist worker
        name = f"results-{worker}.jsonl" if worker else RESULTS_NAME
        (out / name).unlink(missing_ok=True)
        writer = config.stash[_WRITER] = ResultsWriter(out / name)
        config.add_cleanup(writer.wait_synced)
    return writer


def _device(config) -> str:
    from bundlegen.harness.workers.devices import default_device

    device = config.getoption("bundlegen_device") or default_device()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if device == "cuda" and worker.startswith("gw"):
        import torch

        count = torch.cuda.device_count()
        if count > 1:
            device = f"cuda:{int(worker[2:]) % count}"
    return device


def _executor(config, session):
    """One executor per session, built at the first case; its engine prepares for every
    selected case then (like `bundlegen run`), and a failed prepare is only a warning."""
    executor = config.stash.get(_EXECUTOR, None)
    if executor is None:
        from bundlegen.harness.executor import CaseExecutor
        from bundlegen.harness.workers.devices import default_timeout

        device = _device(config)
        timeout = config.getoption("bundlegen_timeout") or default_timeout(device)
        executor = CaseExecutor(config.getoption("bundlegen_engine"), device, timeout_s=timeout,
                                manifest=config.stash[_MANIFEST],
                                isolation=not config.getoption("bundlegen_no_isolation"))
        config.stash[_EXECUTOR] = executor
        config.add_cleanup(executor.close)
        problem = executor.prepare([item.case for item in session.items if isinstance(item, BundleCaseItem)])
        if problem:
            warnings.warn(f"bundlegen: engine prepare failed (cases build on use): {problem}")
    return executor
