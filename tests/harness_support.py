"""Purpose-built engines and bundle files for the harness tests.

Each bad engine is torch-math with one defect, switched on only for graphs with
S_q == BAD_S_Q, so a level can mix good and bad cases. They live in an importable module
so an isolated worker process can build them by `tests.harness_support:Class`."""
from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path
from typing import Iterable

import torch

from bundlegen.graph import Bundle, Case, canonical_json
from bundlegen.engines.torch_math.engine import TorchMathEngine
from bundlegen.harness.config import EngineConfig, OverrideRow
from bundlegen.manifest import load_manifest, manifest_name
from bundlegen.tolerances import tolerances_name
from bundlegen.workspace import builtin_bundle_root
from tests.graph_factory import make_case, make_graph

BAD_S_Q = 5
#: the built-in plan's manifest: what the harness reads beside every bundle root
MANIFEST = load_manifest(builtin_bundle_root())
#: the built-in engine.toml rows are none; the numbers come from the manifest
PLAIN = EngineConfig(manifest=MANIFEST)
#: a generous tolerance so these tests judge the harness, not torch-math's rounding
LOOSE = EngineConfig(overrides=(OverrideRow(filters={}, rtol=0.05, atol=1e-3, index=0),), manifest=MANIFEST)


def case_of(seed: int = 1, *, level: str = "", group: str = "", **graph_kwargs) -> Case:
    small = dict(B=1, H_q=2, H_k=1, H_v=1, S_q=9, S_kv=12, D_qk=8, D_v=8)
    case = make_case(make_graph(**{**small, **graph_kwargs}), seed=seed)
    return _placed(case, level, group)


def declined_case(seed: int = 1, **graph_kwargs) -> Case:
    """A valid case every built-in engine declines: dQ written through a zero head stride
    (H_q = 2), the zero-stride-output decline."""
    D = graph_kwargs.get("D_qk", 8)
    return case_of(seed, out_strides={"dq": (2 * 9 * D, 0, D, 1)}, **graph_kwargs)


def bad_case(seed: int = 1, **graph_kwargs) -> Case:
    return case_of(seed, **{"S_q": BAD_S_Q, **graph_kwargs})


def _placed(case: Case, level: str, group: str) -> Case:
    from dataclasses import replace
    return replace(_with_class(case), level=level, group=group)


def write_manifest(root: Path) -> Path:
    """The built-in manifest, and the tolerance TOML it names, copied into bundle root `root`."""
    path = Path(root) / manifest_name(MANIFEST.plan)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes((builtin_bundle_root() / path.name).read_bytes())
    toml = tolerances_name(MANIFEST.plan)
    (path.parent / toml).write_bytes((builtin_bundle_root() / toml).read_bytes())
    return path


def _with_class(case: Case) -> Case:
    """The case with the plan's tolerance class when it names none, as a generated case
    always does."""
    from dataclasses import replace

    from bundlegen.plans.sdpa_bwd import tolerance_class_for

    if case.tolerance_class is not None:
        return case
    try:
        return replace(case, tolerance_class=tolerance_class_for(case.graph))
    except ValueError:
        return case


def write_bundle(root: Path, level: str, group: str, cases: Iterable[Case]) -> Path:
    """A bundle file (and the manifest, when the root has none yet)."""
    if not (Path(root) / manifest_name(MANIFEST.plan)).is_file():
        write_manifest(root)
    path = Path(root) / level / "sdpa_bwd" / f"{group}.json"
    cases = [_with_class(c) for c in cases]
    path.parent.mkdir(parents=True, exist_ok=True)
    bundle = Bundle(level=level, group=group, cases=tuple(cases))
    path.write_text(canonical_json(bundle.to_json()), encoding="utf-8")
    return path


def element_at(view: torch.Tensor, storage_index: int) -> torch.Tensor:
    """A one-element view of the storage behind `view`, at an absolute storage index."""
    return torch.as_strided(view, (1,), (1,), storage_index)


def last_addressed(view: torch.Tensor) -> int:
    return view.storage_offset() + sum((d - 1) * s for d, s in zip(view.shape, view.stride()))


class _BadEngine(TorchMathEngine):
    """torch-math, then `defect` on the bad graphs."""

    def run(self, graph, tensors):
        super().run(graph, tensors)
        if graph.S_q == BAD_S_Q:
            self.defect(graph, tensors)

    def defect(self, graph, tensors) -> None:
        raise NotImplementedError


class WritesPastEnd(_BadEngine):
    name = "writes-past-end"

    def defect(self, graph, tensors):
        element_at(tensors["dv"], last_addressed(tensors["dv"]) + 1).fill_(0.0)


class WritesBeforeStart(_BadEngine):
    name = "writes-before-start"

    def defect(self, graph, tensors):
        element_at(tensors["dv"], tensors["dv"].storage_offset() - 1).fill_(0.0)


class WritesIntoGap(_BadEngine):
    """For a dv with a row pitch above D_v: writes the first padding element."""
    name = "writes-into-gap"

    def defect(self, graph, tensors):
        dv = tensors["dv"]
        assert dv.stride(2) > dv.shape[3], "needs a padded dv"
        element_at(dv, dv.storage_offset() + dv.shape[3]).fill_(0.0)


class ModifiesInput(_BadEngine):
    name = "modifies-input"

    def defect(self, graph, tensors):
        tensors["k"][0, 0, 0, 0].fill_(1234.0)


class WritesNaN(_BadEngine):
    name = "writes-nan"

    def defect(self, graph, tensors):
        tensors["dq"][0, 0, 0, 0] = float("nan")


class WritesWrongValue(_BadEngine):
    name = "writes-wrong-value"

    def defect(self, graph, tensors):
        tensors["dk"][0, 0, 1, 1] += 100.0


class Noisy(_BadEngine):
    """Claims determinism, but every run scales one element by a different tiny factor
    (well inside the tolerance)."""
    name = "noisy"
    _runs = itertools.count(1)

    def defect(self, graph, tensors):
        tensors["dv"][0, 0, 0, 0] *= 1.0 + next(self._runs) * 2.0 ** -7


class Faulty(TorchMathEngine):
    """Faults by S_q: 3 raises, 4 exits the process, 5 is SIGKILLed, 6 hangs."""
    name = "faulty"

    def run(self, graph, tensors):
        if graph.S_q == 3:
            raise RuntimeError("injected fault")
        if graph.S_q == 4:
            os._exit(1)
        if graph.S_q == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        if graph.S_q == 6:
            time.sleep(120)
        super().run(graph, tensors)


class AcceptsEverything(TorchMathEngine):
    """Never declines: an engine probe given to it is a rejection-accepted."""
    name = "accepts-everything"

    def is_applicable(self, graph):
        return None


class DeclinesEverything(TorchMathEngine):
    name = "declines-everything"

    def is_applicable(self, graph):
        return "head-dim-not-served: test engine"


class ReportsCollector(TorchMathEngine):
    """Declines every graph, saying whether the cyclic garbage collector is on where it
    runs and how many objects it was told to leave alone (gc.freeze)."""
    name = "reports-collector"

    def is_applicable(self, graph):
        import gc
        return f"head-dim-not-served: collector on {gc.isenabled()}, frozen {gc.get_freeze_count()}"


def engine_ref(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def skip_row(filters: dict, reason: str, archs: tuple[str, ...] | None = None):
    from bundlegen.harness.config import SkipRow
    return SkipRow(filters=(filters,), reason=reason, archs=archs)


def pid_exists(pid: int) -> bool:
    """Whether `pid` is a process: running, or a zombie its parent has not reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def start_cli(args: list[str], cwd: Path) -> "subprocess.Popen[str]":
    """`python -m bundlegen ARGS` as a terminal starts a foreground command, so a Ctrl-C
    test's SIGINT reaches it (popen_hearing_sigint)."""
    import subprocess
    import sys

    return popen_hearing_sigint([sys.executable, "-m", "bundlegen", *args], cwd=cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def popen_hearing_sigint(argv: list[str], **kwargs) -> "subprocess.Popen":
    """subprocess.Popen of a child that hears SIGINT, however this pytest was started. A
    process started with SIGINT ignored keeps ignoring it (a shell starts its background
    jobs so, and Python then installs no KeyboardInterrupt handler); the child would
    inherit that from a pytest launched so, and a test's Ctrl-C (or a fixture stopping a
    server with one) would wait out its timeout. A handled signal is reset to its default
    across exec, so SIGINT is handled here while the child starts."""
    import subprocess

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(argv, **kwargs)
    finally:
        if before is not None:   # None: a handler set outside Python, which stays
            signal.signal(signal.SIGINT, before)
