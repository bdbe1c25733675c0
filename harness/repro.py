"""One case, in-process, explained: find a case by id or unique id prefix in a
bundle root, run it through the harness's own `run_case` (its verdict is the verdict),
and for a case that ran, run the engine once more on the same materialized inputs to
read the worst elements and the error's pattern. `CaseRunner` is also what `bundlegen
shrink` judges candidate graphs with."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from bundlegen.engines.registry import EngineNotFound, registered_name
from bundlegen.graph import BundleError, Case
from bundlegen.workspace import default_bundle_root, engine_config_dir
from bundlegen.harness.bundles import load_level, manifest_of
from bundlegen.harness.case import CaseOutcome, run_case, run_engine
from bundlegen.harness.config import EngineConfig, EngineConfigError, Tolerance, load_engine_config
from bundlegen.harness.stale_skips import skipping_row, stale_skips, without_skips
from bundlegen.harness.workers.devices import DeviceUnavailable
from bundlegen.harness.workers.worker import WorkerSpec, WorkerStartError, build_engine

if TYPE_CHECKING:
    from bundlegen.harness.diagnose import PortPattern, WorstElement
    from bundlegen.harness.materialize import Materialized

# materialize and diagnose (and torch with them) are imported where a case is captured:
# `bundlegen shrink` and `repro` parse their arguments and find the case first.


def add_case_arguments(parser) -> None:
    """The arguments `bundlegen repro` and `bundlegen shrink` share: the case, the engine,
    the device, the bundle root and the engine's config folder."""
    parser.add_argument("case_id", metavar="CASE_ID", help="a case id, or a prefix only one case id has")
    parser.add_argument("--engine", required=True,
                        help="engine name or package.module:Class (a mutant: "
                             "bundlegen.mutants.catalog:ENGINE@MUTANT)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--bundles", default=None, metavar="DIR",
                        help="bundle root (default: the workspace's bundles, else the built-in ones)")
    parser.add_argument("--engine-config", default=None, metavar="DIR",
                        help="folder with the engine's engine.toml and claims.json")


class CaseNotFound(LookupError):
    """No case, or more than one, has the id or prefix asked for (one line)."""


def find_case(case_id: str, root: Path | str | None = None, plan: str | None = None) -> Case:
    """The case of every level of the bundle root whose id is `case_id`, or the only one
    whose id starts with it."""
    root = Path(root) if root is not None else default_bundle_root()
    manifest = manifest_of(root, plan)
    cases = load_level(root, manifest.level_names[-1], manifest.plan).cases
    exact = [c for c in cases if c.id == case_id]
    found = exact or [c for c in cases if c.id.startswith(case_id)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise CaseNotFound(f"case {case_id}: no case with this id or id prefix in {root} "
                           f"(plan {manifest.plan}, levels {', '.join(manifest.level_names)})")
    raise CaseNotFound(f"case {case_id}: the prefix matches {len(found)} cases "
                       f"({', '.join(c.id for c in found[:5])}{', ...' if len(found) > 5 else ''})")


class RunnerError(ValueError):
    """The engine, its config or the device cannot be had (one line)."""


def open_runner(engine: str, device: str = "cpu", *, engine_config: Path | str | None = None,
                bundles: Path | str | None = None, plan: str | None = None, claims: bool = True,
                run_skipped: bool = False) -> "CaseRunner":
    """A CaseRunner; RunnerError for an unknown engine, a bad engine config folder, an
    engine that cannot be built or a device this machine lacks."""
    try:
        if engine_config is not None and not Path(engine_config).is_dir():
            raise EngineConfigError(f"--engine-config {engine_config}: not a folder")
        config = load_engine_config(engine_config) if engine_config is not None else None
        return CaseRunner(engine, device, config=config, bundles=bundles, plan=plan, claims=claims,
                          run_skipped=run_skipped)
    except (EngineNotFound, EngineConfigError, WorkerStartError, DeviceUnavailable, BundleError) as exc:
        raise RunnerError(str(exc)) from exc


class CaseRunner:
    """An engine built once, in this process, and the config its cases are judged with."""

    def __init__(self, engine: str, device: str = "cpu", *, config: EngineConfig | None = None,
                 bundles: Path | str | None = None, plan: str | None = None, claims: bool = True,
                 repeat: int | None = None, run_skipped: bool = False):
        """`claims=False` judges every case as unclaimed (shrinking compares verdict classes,
        and a claim belongs to one case id only). `run_skipped`: a case a skip row selects is
        run too (`skip_config` keeps the rows, to say which one and whether it is stale)."""
        if config is None:
            config = load_engine_config(engine_config_dir(registered_name(engine)))
        config = config.with_manifest(manifest_of(bundles, plan))
        if not claims:
            config = dataclasses.replace(config, claims={})
        self.skip_config = config if run_skipped else None
        if run_skipped:
            config = without_skips(config)
        self.spec_name, self.device, self.config, self.repeat = engine, str(device), config, repeat
        self.engine = build_engine(WorkerSpec(engine=engine, device=str(device), config=config))
        self.runs = 0

    def verdict(self, case: Case) -> CaseOutcome:
        self.runs += 1
        return run_case(case, self.engine, self.config, self.repeat)

    def capture(self, case: Case) -> "Captured":
        """The case materialized and run once: inputs, the engine's outputs, the reference."""
        from bundlegen.harness import materialize as M   # torch: see the top of this module

        m = M.materialize(case, self.engine.device)
        run_engine("engine.run", self.engine, case.graph, m.tensors)
        outputs = {p: m.tensors[p].detach().to("cpu", copy=True) for p in case.graph.output_ports}
        return Captured(m, outputs, self.config.tolerance_for(case))


@dataclass(frozen=True, eq=False)
class Captured:
    materialized: "Materialized"
    outputs: Mapping[str, Any]       # port -> CPU copy of the engine's output view
    tolerance: Tolerance


@dataclass(frozen=True, eq=False)
class Repro:
    case: Case
    engine: str                      # the engine as asked for (name or module:Class)
    engine_name: str
    arch: str
    device: str
    outcome: CaseOutcome
    worst: tuple["WorstElement", ...] = ()
    patterns: tuple["PortPattern", ...] = ()
    captured: Captured | None = None
    skip_note: tuple[str, ...] = ()  # --run-skipped: the row that would skip the case, stale or not


def skip_note(case: Case, runner: CaseRunner, outcome: CaseOutcome) -> tuple[str, ...]:
    """--run-skipped: which skip row would have skipped the case, and whether it is stale
    (its one case here passes now)."""
    config = runner.skip_config
    index = None if config is None else skipping_row(config, case, runner.engine.arch)
    if index is None:
        return ()
    lines = [f"skipped by: {config.source} test_skips[{index}] ({config.skips[index].detail}); "
             "run anyway (--run-skipped)"]
    lines += [row.line(config.source) for row in
              stale_skips(config, [case], {case.id: outcome.verdict}, runner.engine.arch)]
    return tuple(lines)


def reproduce(case: Case, runner: CaseRunner, worst: int = 8) -> Repro:
    """The harness's verdict for the case and, when the engine ran it, what its outputs got wrong."""
    from bundlegen.harness import diagnose   # torch: see the top of this module

    outcome = runner.verdict(case)
    base = dict(case=case, engine=runner.spec_name, engine_name=runner.engine.name,
                arch=runner.engine.arch, device=runner.device, outcome=outcome,
                skip_note=skip_note(case, runner, outcome))
    if outcome.tolerance is None:    # set only once the engine ran the case (case.execute_case)
        return Repro(**base)
    captured = runner.capture(case)
    ref = captured.materialized.reference
    return Repro(**base, captured=captured,
                 worst=diagnose.worst_elements(captured.outputs, ref, captured.tolerance, worst),
                 patterns=diagnose.error_patterns(captured.outputs, ref, captured.tolerance))
