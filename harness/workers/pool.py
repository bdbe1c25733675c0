"""A run's (or a server's) set of workers: the spec each is started from, its share of the
host's cores, and closing them all at once."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping

from bundlegen.engines.registry import registered_name
from bundlegen.manifest import Manifest
from bundlegen.workspace import engine_config_dir
from bundlegen.harness.bundles import manifest_of
from bundlegen.harness.config import EngineConfig, load_engine_config
from bundlegen.harness.workers.worker import WorkerSpec


def worker_spec(engine: str, device: str, *, config: EngineConfig | None = None,
                manifest: Manifest | None = None, repeat: int | None = None,
                timeout_s: float | None = None, cpu_threads: int | None = None,
                env: Mapping[str, str] | None = None) -> WorkerSpec:
    """What a worker of `engine` on `device` is started with. An unknown engine name fails
    here, before any worker starts. `config`: the engine's (default: its engine config
    folder's); `manifest`: the bundle manifest of the cases to run (default: the config's,
    else the default bundle root's)."""
    name = registered_name(engine)
    if config is None:
        config = load_engine_config(engine_config_dir(name))
    if manifest is None and config.manifest is None:
        manifest = manifest_of()
    if manifest is not None:
        config = config.with_manifest(manifest)
    return WorkerSpec(engine=engine, device=str(device), config=config, repeat=repeat,
                      timeout_s=timeout_s, cpu_threads=cpu_threads,
                      env=tuple(sorted((env or {}).items())))


def cpu_share(workers: int) -> int | None:
    """Each worker's share of this host's cores when several run side by side, else None."""
    if workers < 2:
        return None
    return max(1, (os.cpu_count() or 1) // workers)


def close_all(runners: list, wait: bool = True) -> None:
    """Close every worker (anything with close(wait)), all at once: a worker busy with a
    case gets a few seconds to answer the stop before it is killed. `wait` False, when
    every worker is idle: told to stop, and left to exit while the run writes its files
    (worker.IsolatedRunner.close)."""
    if len(runners) <= 1 or not wait:
        for runner in runners:
            runner.close(wait)
        return
    with ThreadPoolExecutor(len(runners)) as pool:
        list(pool.map(lambda runner: runner.close(), runners))
