"""The harness as a pytest plugin: `pytest --bundlegen-level quick --bundlegen-engine
torch-math` collects one test item per case (named level/group/id) and runs it as
`bundlegen run` would. A failing verdict fails the item; declined and skipped cases are
reported as pytest skips; a probe rejected as expected passes.

Inert unless --bundlegen-level is given: it then replaces the default test paths with the
cases (explicit paths on the command line are still collected). Under pytest-xdist each
worker builds its own engine; with --bundlegen-device cuda and several GPUs, worker gwN
takes cuda:N mod (GPU count)."""
from __future__ import annotations

import os
import warnings

import pytest

_EXECUTOR = pytest.StashKey()


def pytest_addoption(parser) -> None:
    group = parser.getgroup("bundlegen", "bundlegen harness (one test item per bundle case)")
    group.addoption("--bundlegen-level", default=None, help="run the cases of this level and the lower ones")
    group.addoption("--bundlegen-engine", default="torch-math",
                    help="engine name or package.module:Class (default torch-math)")
    group.addoption("--bundlegen-device", default=None, help="cpu, cuda, cuda:N (default: cuda if available)")
    group.addoption("--bundlegen-bundles", default=None, help="bundle root (default: the repo's bundles/)")
    group.addoption("--bundlegen-timeout", type=float, default=None, help="per-case timeout in seconds")
    group.addoption("--bundlegen-no-isolation", action="store_true",
                    help="run the engine in the pytest process (no timeout, no crash isolation)")


def _active(config) -> bool:
    return config.getoption("bundlegen_level", None) is not None


def pytest_ignore_collect(collection_path, config):
    if _active(config) and not config.option.file_or_dir:
        return True  # no paths named: the default test paths give way to the cases
    return None


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselect the items
def pytest_collection_modifyitems(session, config, items) -> None:
    if not _active(config):
        return
    from bundlegen.harness.bundles import default_bundle_root, error_location, load_level

    root = config.getoption("bundlegen_bundles") or default_bundle_root()
    try:
        loaded = load_level(root, config.getoption("bundlegen_level"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    parent = BundleCollector.from_parent(session, name="bundlegen", nodeid="bundlegen")
    for error in loaded.errors:
        level, group = error_location(error)
        items.append(BundleErrorItem.from_parent(
            parent, name=f"{level}/{group}/{error.case_id}:{error.field}", error=error))
    for case in loaded.cases:
        items.append(BundleCaseItem.from_parent(parent, name=f"{case.level}/{case.group}/{case.id}",
                                                case=case))


class BundleCollector(pytest.Collector):
    def collect(self):
        return []


class BundleCaseFailure(Exception):
    pass


class BundleCaseItem(pytest.Item):
    def __init__(self, *, case, **kwargs):
        super().__init__(**kwargs)
        self.case = case
        self.extra_keyword_matches.update({case.group, *case.items})

    def runtest(self) -> None:
        from bundlegen.harness import verdicts as V

        result = _executor(self.config, self.session).execute(self.case)
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
        return self.path, None, f"bundlegen {self.name}"


class BundleErrorItem(pytest.Item):
    """A malformed bundle file or case: always fails, naming file, case id and field."""

    def __init__(self, *, error, **kwargs):
        super().__init__(**kwargs)
        self.error = error

    def runtest(self) -> None:
        raise BundleCaseFailure(f"error:bundle: {self.error}")

    def repr_failure(self, excinfo, style=None):
        return str(excinfo.value)

    def reportinfo(self):
        return self.path, None, f"bundlegen {self.name}"


def _device(config) -> str:
    from bundlegen.harness.run import default_device

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
        from bundlegen.harness.run import CaseExecutor, default_timeout

        device = _device(config)
        timeout = config.getoption("bundlegen_timeout") or default_timeout(device)
        executor = CaseExecutor(config.getoption("bundlegen_engine"), device, timeout_s=timeout,
                                isolation=not config.getoption("bundlegen_no_isolation"))
        config.stash[_EXECUTOR] = executor
        config.add_cleanup(executor.close)
        problem = executor.prepare([item.case for item in session.items if isinstance(item, BundleCaseItem)])
        if problem:
            warnings.warn(f"bundlegen: engine prepare failed (cases build on use): {problem}")
    return executor
