"""Engine.prepare: called once per run, in the worker, after the engine is built and before
the first case, with the graphs the run will execute (no probes); a prepare that raises or
kills its worker never stops the run. run.json says where the run's time went. The
Triton engine's prepare compiles only the variants without a marker (engines/triton/warm.py)."""
from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from bundlegen import reasons as R
from bundlegen.engines.registry import engine_class
from bundlegen.graph import Rejection, dense_graph
from bundlegen.harness import verdicts as V
from bundlegen.harness.results import RUN_NAME, read_results, read_run_times
from bundlegen.harness.level import run_level
from tests import harness_support as S
from bundlegen.engines.triton.aot import compile_env
from tests.graph_factory import make_case, make_graph

pytest_plugins = ["pytester"]
LOG_ENV = "BUNDLEGEN_TEST_PREPARE_LOG"


def _log(line: str) -> None:
    with open(os.environ[LOG_ENV], "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


class LogsPrepare(S.TorchMathEngine):
    name = "logs-prepare"

    def prepare(self, graphs):
        _log("prepare " + " ".join(str(g.S_q) for g in graphs))

    def run(self, graph, tensors):
        if graph.S_q != 16:  # not warm_up's tiny graph
            _log(f"run {graph.S_q}")
        super().run(graph, tensors)


class PrepareRaises(S.TorchMathEngine):
    name = "prepare-raises"

    def prepare(self, graphs):
        raise RuntimeError("injected prepare fault")


class PrepareKillsWorker(S.TorchMathEngine):
    name = "prepare-kills-worker"

    def prepare(self, graphs):
        os._exit(3)


def _level(tmp_path, probe: bool = False):
    cases = [S.case_of(1, S_q=3), S.case_of(2, S_q=4)]
    if probe:
        cases.append(make_case(make_graph(B=1, H_q=1, S_q=7, S_kv=7, D_qk=8, left=0),
                               purpose="probe", rejection=Rejection("frontend", R.LEFT_BOUND_NONPOSITIVE)))
    S.write_bundle(tmp_path / "bundles", "quick", "g", cases)
    return cases


def _run(tmp_path, engine, **kwargs):
    return run_level("quick", S.engine_ref(engine), device="cpu", bundles=tmp_path / "bundles",
                     out=tmp_path / "out", config=S.LOOSE, repeat=1, **kwargs)


@pytest.mark.parametrize("isolation", [True, False], ids=["isolated", "in-process"])
def test_prepare_sees_the_executed_graphs_once_before_the_first_case(tmp_path, monkeypatch, isolation):
    monkeypatch.setenv(LOG_ENV, str(tmp_path / "log.txt"))
    _level(tmp_path, probe=True)
    summary = _run(tmp_path, LogsPrepare, isolation=isolation)
    assert (tmp_path / "log.txt").read_text().splitlines() == ["prepare 3 4", "run 3", "run 4"]
    assert summary.counts() == {V.PASS: 2, V.REJECTED: 1}
    assert summary.times.prepare_problem is None


@pytest.mark.parametrize("engine, problem", [(PrepareRaises, "injected prepare fault"),
                                             (PrepareKillsWorker, "worker died in engine prepare")])
def test_a_failed_prepare_is_reported_and_the_run_goes_on(tmp_path, engine, problem):
    _level(tmp_path)
    summary = _run(tmp_path, engine)
    assert problem in summary.times.prepare_problem
    assert [r["verdict"] for r in read_results(summary.results_path)] == [V.PASS, V.PASS]


def test_run_json_accounts_for_the_run(tmp_path):
    _level(tmp_path)
    summary = _run(tmp_path, S.TorchMathEngine)
    data = json.loads((tmp_path / "out" / RUN_NAME).read_text())
    times = read_run_times(tmp_path / "out")
    assert times == summary.times and data["cases"] == 2 and data["engine"] == "torch-math"
    parts = times.start_s + times.prepare_s + times.cases_s + times.finish_s
    assert min(times.start_s, times.prepare_s, times.cases_s, times.finish_s) >= 0
    assert parts == pytest.approx(times.elapsed_s, rel=1e-6)
    case_wall = sum(r["wall_s"] for r in read_results(summary.results_path))
    assert case_wall <= times.cases_s
    if os.path.exists("/proc/self/stat"):   # the process's own start (this test process: long ago)
        assert times.before_s is not None and times.before_s > 0
    assert data["outside_cases_s"] == pytest.approx((times.before_s or 0) + times.elapsed_s - times.cases_s)


def test_process_age_counts_from_the_process_start():
    import subprocess
    import sys

    code = "import time; time.sleep(0.5); from bundlegen.harness.level import process_age_s; print(process_age_s())"
    age = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    if age.strip() != "None":
        assert 0.45 <= float(age) < 5.0


# ----------------------------------------------------------------------------- triton markers
class _InlinePool:
    """multiprocessing's spawn context stand-in: runs imap_unordered in this process."""

    def __init__(self, jobs):
        self.jobs = jobs

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def imap_unordered(self, fn, args):
        return (fn(a) for a in args)


class _InlineContext:
    #: (jobs, initializer, initargs) of each pool made, in order (what a test checks)
    pools: list = []

    def Pool(self, jobs, initializer=None, initargs=()):  # noqa: N802 - multiprocessing's name
        self.pools.append((jobs, initializer, initargs))
        return _InlinePool(jobs)


@pytest.fixture
def warm(tmp_path, monkeypatch):
    from bundlegen.engines.triton import warm

    compiled: list[tuple] = []

    def fake_compile(device, launches):
        compiled.extend(launches)
        warm.calls.append(launches)
        return len(launches)

    monkeypatch.setattr(warm, "cache_dir", lambda: tmp_path / "cache")
    monkeypatch.setattr(warm, "fingerprint", lambda arch: f"{arch}-sources-v1")
    monkeypatch.setattr(warm.mp, "get_context", lambda method: _InlineContext())
    monkeypatch.setattr(warm, "_compile_launches", fake_compile)
    monkeypatch.setattr(warm, "compiled", compiled, raising=False)   # what the fakes saw
    monkeypatch.setattr(warm, "calls", [], raising=False)
    return warm


def _graphs():
    from bundlegen.graph import dense_graph
    return [dense_graph(S_q=16, D_qk=64), dense_graph(S_q=300, D_qk=64),      # one variant
            dense_graph(S_q=16, D_qk=64, dtype="bf16"),                       # another dtype
            dense_graph(S_q=16, D_qk=64, right=0)]                            # causal


def test_twins_deduplicate_by_variant(warm):
    keys, wide = warm.twin_keys(_graphs())
    assert len(keys) == 3 and wide == 0


def _names(launches):
    return sorted(name for name, _, _ in launches)


def test_compile_missing_compiles_each_variant_once(warm, monkeypatch):
    assert warm.compile_missing("cuda", "sm90", _graphs(), jobs=2, announce=False) == (3, 0, 0)
    # three twins launch 9 kernels; fp16 and bf16 share none, the causal twin shares the
    # preprocess kernel of its dtype: 8 distinct launches, each compiled once
    assert _names(warm.compiled) == ["bwd_dkdv"] * 3 + ["bwd_dq"] * 3 + ["bwd_preprocess"] * 2
    assert warm.compile_missing("cuda", "sm90", _graphs(), jobs=2, announce=False) == (0, 3, 0)
    assert len(warm.compiled) == 8
    # a left bound alone is a band kind of its own, yet the causal twin's variant
    left_only = replace(_graphs()[0], attributes=replace(_graphs()[0].attributes, left_bound=4))
    assert warm.compile_missing("cuda", "sm90", _graphs() + [left_only], jobs=2,
                                announce=False) == (0, 3, 0)
    wider = dense_graph(S_q=16, D_qk=32)
    assert warm.compile_missing("cuda", "sm90", _graphs() + [wider], jobs=2,
                                announce=False) == (1, 3, 0)
    # changed kernel sources (another fingerprint): everything again
    monkeypatch.setattr(warm, "fingerprint", lambda arch: f"{arch}-sources-v2")
    assert warm.compile_missing("cuda", "sm90", _graphs(), jobs=2, announce=False) == (3, 0, 0)


def _with_arg(launch, position, value):
    name, args, kwargs = launch
    return name, args[:position] + (value,) + args[position + 1:], kwargs


def _odd_stride_twin(launch):
    """The launch with one do_not_specialize integer (sq_s) of another kind: ("int", 0)
    where the launch's is ("int", 16), or the other way: another launch_key, one kernel."""
    from bundlegen.engines.triton.launch import kernels_module
    position = kernels_module().bwd_dkdv.arg_names.index("sq_s")
    return _with_arg(launch, position, 17 if launch[1][position] % 16 == 0 else 32)


def _dkdv(launches):
    return next(c for c in launches if c[0] == "bwd_dkdv")


def test_launches_triton_compiles_as_one_kernel_form_one_group(warm):
    """Launches that differ only in an integer the kernel does not specialise are one kernel
    to Triton: one group. A specialised difference (a constexpr) is another group; the
    heaviest kernels come first."""
    launches = list(warm.twin_launches(warm.twin_keys(_graphs()[:1])[0], "sm90").values())
    dkdv = _dkdv(launches)
    odd = _odd_stride_twin(dkdv)
    assert warm.launch_key(*odd) != warm.launch_key(*dkdv)
    other = (dkdv[0], dkdv[1], {**dkdv[2], "EVEN": not dkdv[2]["EVEN"]})
    groups = warm.compile_groups(launches + [odd, other])
    assert len(groups) == len(launches) + 1
    assert [dkdv, odd] in groups and [other] in groups
    weights = [-warm._COMPILE_WEIGHT.get(g[0][0], 0.5) for g in groups]
    assert weights == sorted(weights)


def test_compile_missing_hands_each_group_to_one_call(warm, monkeypatch):
    """So the second launch of a group finds the first in Triton's in-process cache."""
    recorded = warm.twin_launches

    def with_odd_twin(keys, arch):
        launches = recorded(keys, arch)
        odd = _odd_stride_twin(_dkdv(launches.values()))
        return {**launches, warm.launch_key(*odd): odd}

    monkeypatch.setattr(warm, "twin_launches", with_odd_twin)
    warm.compile_missing("cuda", "sm90", _graphs(), jobs=2, announce=False)
    assert len(warm.calls) == len(warm.compiled) - 1
    assert [c[0][0] for c in warm.calls if len(c) == 2] == ["bwd_dkdv"]


def test_a_long_compile_says_how_far_it_is(warm, monkeypatch, capsys):
    monkeypatch.setattr(warm, "PROGRESS_EVERY_S", 0.0)
    warm.compile_missing("cuda", "sm90", _graphs(), jobs=2, announce=True)
    lines = capsys.readouterr().err.splitlines()
    groups = len(warm.compile_groups(warm.compiled))
    assert lines[0].startswith("triton: compiling 3 kernel variant(s), 8 distinct kernel launches")
    assert [line.split()[1] for line in lines[1:]] == [f"{i}/{groups}" for i in range(1, groups + 1)]


def test_the_compile_processes_start_before_the_launches_are_recorded(warm, monkeypatch):
    """So their imports and device contexts overlap the parent's recording on a cold run:
    the pool exists, with every core's process and the start-up step, when twin_launches
    runs; the jobs asked for are kept."""
    events = []
    recorded = warm.twin_launches
    monkeypatch.setattr(_InlineContext, "pools", [])
    monkeypatch.setattr(warm.os, "cpu_count", lambda: 16)

    def recording(keys, arch):
        events.append(("record", len(_InlineContext.pools)))
        return recorded(keys, arch)

    monkeypatch.setattr(warm, "twin_launches", recording)
    warm.compile_missing("cuda:1", "sm90", _graphs(), announce=False)
    assert events == [("record", 1)]
    assert _InlineContext.pools == [(16, warm._start_compiler, ("cuda:1",))]
    warm.compile_missing("cuda", "sm90", _graphs() + [dense_graph(S_q=16, D_qk=32)], jobs=3, announce=False)
    assert _InlineContext.pools[-1][0] == 3


def test_a_compile_process_start_never_raises(monkeypatch):
    """A pool whose initializer raises starts processes without end: the start-up step
    swallows its error (the compile repeats the step and raises it)."""
    from bundlegen.engines.triton import launch, warm

    def broken():
        raise RuntimeError("no driver")

    monkeypatch.setattr(launch, "kernels_module", broken)
    assert warm._start_compiler("cpu") is None


def test_a_failed_compile_leaves_no_marker(warm, monkeypatch):
    def fails(device, launches):
        raise RuntimeError("ptxas died")

    monkeypatch.setattr(warm, "_compile_launches", fails)
    with pytest.raises(RuntimeError, match="ptxas"):
        warm.compile_missing("cuda", "sm90", _graphs(), jobs=2, announce=False)
    assert not list((warm.cache_dir()).rglob("*"))


def test_only_the_product_modules_are_warmed(monkeypatch):
    """A Triton engine given other modules (a source-patch mutant) compiles its own variants
    on use: its prepare neither compiles product variants nor reads or writes their markers."""
    import torch

    from bundlegen.engines.triton import warm
    from bundlegen.engines.triton.engine import TritonEngine
    from bundlegen.mutants import catalog

    asked = []
    monkeypatch.setattr(warm, "compile_missing", lambda device, arch, graphs, **kw: asked.append(arch))
    for engine in (TritonEngine("cpu"), catalog.by_name("drop-tail-block").wrap(TritonEngine("cpu")),
                   catalog.by_name("top-left-for-bottom-right").wrap(TritonEngine("cpu"))):
        triton = getattr(engine, "inner", engine)   # a mutant wraps the engine that prepares
        triton.device, triton.arch = torch.device("cuda"), "sm90"   # no GPU needed: nothing runs
        engine.prepare([])
    assert asked == ["sm90"]


def _gpu_triton(monkeypatch, wrap=None):
    """A Triton engine taken for sm90's (no GPU needed: nothing runs), or `wrap` of one (a
    mutant), its runs and the device synchronisations recorded."""
    import torch

    from bundlegen.engines.triton.engine import TritonEngine
    triton = TritonEngine("cpu")
    triton.device, triton.arch = torch.device("cuda"), "sm90"
    engine = wrap(triton) if wrap else triton
    log = []
    monkeypatch.setattr(TritonEngine, "run", lambda self, graph, tensors: log.append("run"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("sync"))
    monkeypatch.setattr(torch, "zeros", lambda *a, **kw: None)   # the base warm-up's tensors
    return engine, log


def test_a_gpu_warm_up_compiles_nothing_and_prepare_compiles_its_kernels(tmp_path, monkeypatch):
    """In a Triton cache without warm_up's kernels the warm-up only makes the GPU's context
    (no compile holds up the worker's start); prepare compiles them with the cases' variants,
    and from then on the warm-up runs its tiny backward."""
    from bundlegen.engines.base import tiny_graph
    from bundlegen.engines.triton import warm
    monkeypatch.setattr(warm, "cache_dir", lambda: tmp_path / "cache")
    engine, log = _gpu_triton(monkeypatch)
    engine.warm_up()
    assert log == ["sync"]
    compiled = []
    monkeypatch.setattr(warm, "compile_missing", lambda device, arch, graphs, **kw: compiled.extend(graphs))
    engine.prepare([])
    assert compiled == [tiny_graph()]
    marker = warm.marker("sm90", warm.twin(tiny_graph()))
    marker.parent.mkdir(parents=True)
    marker.touch()
    log.clear()
    engine.warm_up()
    assert log == ["run", "sync"]


def test_a_marker_names_the_variant_whichever_twin_stood_for_it(tmp_path, monkeypatch):
    from bundlegen.engines.base import tiny_graph
    from bundlegen.engines.triton import warm
    monkeypatch.setattr(warm, "cache_dir", lambda: tmp_path / "cache")
    d8, d16 = warm.twin(tiny_graph(D=8)), warm.twin(tiny_graph(D=16))
    assert d8 != d16 and warm.marker("sm90", d8) == warm.marker("sm90", d16)


def test_other_modules_warm_up_as_before(monkeypatch):
    from bundlegen.mutants import catalog
    engine, log = _gpu_triton(monkeypatch, catalog.by_name("drop-tail-block").wrap)
    engine.warm_up()
    assert log == ["run", "sync"]


def test_fingerprint_follows_the_kernel_sources(tmp_path, monkeypatch):
    from bundlegen.engines.triton import warm

    before = warm.fingerprint.__wrapped__("sm90")
    assert before == warm.fingerprint.__wrapped__("sm90")
    assert before != warm.fingerprint.__wrapped__("sm100")
    copied = tmp_path / "triton"
    copied.mkdir()
    for name in warm.SOURCES:
        (copied / name).write_bytes((warm.Path(warm.__file__).parent / name).read_bytes())
    (copied / "kernels.py").write_bytes((copied / "kernels.py").read_bytes() + b"\n# changed\n")
    monkeypatch.setattr(warm, "__file__", str(copied / "warm.py"))
    assert warm.fingerprint.__wrapped__("sm90") != before


def test_a_twin_compiles_the_variant_of_its_graph():
    """Every constexpr choice the launcher makes from the graph is the same for a bundle
    case and its tiny twin: dtype, head-dim tiles, mask kinds, dK/dV passes, program order, VEC,
    the bias and dropout mask's alignment (launch.score_vec: dense graphs)."""
    from bundlegen.engines.triton import configs, launch, warm

    def choices(graph):
        a = graph.attributes
        return (graph.dtype, configs.block_d(graph.D_qk), configs.block_d(graph.D_v),
                a.left_bound is not None, a.right_bound is not None, graph.H_k == graph.H_v,
                launch.block_major(graph), warm._vec(graph), launch.modifier_flags(graph)["HAS_DROPOUT"],
                launch.modifier_flags(graph)["DRAWN_DROPOUT"],
                tuple(v for k, v in sorted(launch.ragged_flags(graph).items()) if k.startswith("HAS_USED")),
                graph.ragged is None and warm._scores_aligned(graph))

    # graphs with score modifiers reach prepare only for an engine that lists them
    served = frozenset(getattr(engine_class("triton"), "score_modifiers", ()))
    graphs = [g for g in warm.level_graphs(["quick", "pr"]) if g.modifiers <= served]
    keys = [k for k in (warm.twin(g) for g in graphs) if k is not None]
    assert len(graphs) > 300 and len(keys) > 300
    assert len({choices(g) for g in graphs}) > 10 and any(launch.block_major(g) for g in graphs)
    for graph in graphs:
        key = warm.twin(graph)
        if key is not None:
            assert choices(warm.twin_graph(key)) == choices(graph), graph


def test_a_twin_loads_through_descriptors_where_its_graph_does():
    """Whether the launcher may load the streamed tiles through TMA descriptors follows the
    graph into its twin: K read through zero strides keeps both on pointer loads."""
    import torch

    from bundlegen.graph import dense_graph
    from bundlegen.validate import GUARD_ELEMS
    from bundlegen.engines.triton import addressing, configs, launch, warm

    def descriptors(graph):
        cfg = configs.config_for("sm90", graph.D_qk, graph.D_v)
        views = {p: torch.empty(1, dtype=torch.float16, device="meta").as_strided(
                     t.dims, t.strides, t.offset + GUARD_ELEMS)
                 for p, t in graph.tensors.items()}
        return launch.descriptor_loads(graph, cfg, launch.head_tiles(graph, cfg),
                                       addressing.vec_for(views), views)

    args = dict(H_q=2, S_q=32, D_qk=64)
    for graph, expected in ((dense_graph(**args), True),
                            (dense_graph(strides={"k": (0, 0, 64, 1)}, **args), False)):
        assert descriptors(graph) is expected
        assert descriptors(warm.twin_graph(warm.twin(graph))) is expected


def test_the_pytest_plugin_prepares_for_the_selected_cases(tmp_path, monkeypatch, pytester):
    monkeypatch.setenv(LOG_ENV, str(tmp_path / "log.txt"))
    cases = _level(tmp_path, probe=True)
    result = pytester.runpytest_inprocess(
        "--bundlegen-level=quick", f"--bundlegen-engine={S.engine_ref(LogsPrepare)}",
        "--bundlegen-device=cpu", f"--bundlegen-bundles={tmp_path / 'bundles'}",
        "--bundlegen-no-isolation", "-p", "no:xdist", "-k", f"not {cases[0].id}")
    result.assert_outcomes(passed=2, deselected=1)
    assert (tmp_path / "log.txt").read_text().splitlines() == ["prepare 4", "run 4", "run 4"]  # + determinism re-run


class PrepareLogsAndRaises(S.TorchMathEngine):
    name = "prepare-logs-and-raises"

    def prepare(self, graphs):
        _log("prepare")
        raise RuntimeError("injected prepare fault")


def test_a_prepare_failed_in_the_first_worker_is_not_repeated_in_the_others(tmp_path, monkeypatch):
    monkeypatch.setenv(LOG_ENV, str(tmp_path / "log.txt"))
    _level(tmp_path)
    summary = _run(tmp_path, PrepareLogsAndRaises, workers_per_device=3)
    assert "injected prepare fault" in summary.times.prepare_problem
    assert (tmp_path / "log.txt").read_text().splitlines() == ["prepare"]
    assert [r["verdict"] for r in read_results(summary.results_path)] == [V.PASS, V.PASS]


class LogsSharedPrepare(LogsPrepare):
    """A prepare whose work every process of the host shares (as Triton's disk cache)."""
    name = "logs-shared-prepare"
    prepare_shared = True


@pytest.mark.parametrize("engine, switch, prepares", [
    (LogsSharedPrepare, None, 1),    # the first worker's prepare serves the host
    (LogsSharedPrepare, "0", 3),     # BUNDLEGEN_SHARED_PREPARE=0: every worker prepares
    (LogsPrepare, None, 3),          # a prepare of the worker's own: every worker
])
def test_workers_repeat_a_prepare_unless_the_first_one_did_it_for_the_host(tmp_path, monkeypatch,
                                                                          engine, switch, prepares):
    from bundlegen.harness.level import SHARED_PREPARE_SWITCH

    monkeypatch.setenv(LOG_ENV, str(tmp_path / "log.txt"))
    if switch is None:
        monkeypatch.delenv(SHARED_PREPARE_SWITCH, raising=False)
    else:
        monkeypatch.setenv(SHARED_PREPARE_SWITCH, switch)
    _level(tmp_path)
    summary = _run(tmp_path, engine, workers_per_device=3)
    lines = (tmp_path / "log.txt").read_text().splitlines()
    assert [line for line in lines if line.startswith("prepare")] == ["prepare 3 4"] * prepares
    assert [r["verdict"] for r in read_results(summary.results_path)] == [V.PASS, V.PASS]


_KEY_CHECK = r"""
import collections, torch
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import make_backend
from triton.runtime.jit import create_function_from_signature
from bundlegen.engines.triton import warm
from bundlegen.engines.triton.capabilities import ROWS
from bundlegen.engines.triton.launch import kernels_module

backend, kernels, binders = make_backend(GPUTarget("cuda", 90, 32)), kernels_module(), {}
def triton_key(name, args, kwargs):
    fn = getattr(kernels, name)
    if name not in binders:
        binders[name] = create_function_from_signature(fn.signature, fn.params, backend)
    real = lambda a: warm.real_arg(a, "cpu")
    _, spec, opts = binders[name](*map(real, args), **{k: real(v) for k, v in kwargs.items()},
                                  debug=False)
    return (name, str(spec), str(opts))

graphs = [g for g in warm.level_graphs(["quick", "pr"]) if ROWS["sm90"].mismatch(g) is None]
keys, _ = warm.twin_keys(graphs)
ours, launches = collections.defaultdict(set), []
for key in keys:
    for name, args, kwargs in warm.twin_launches([key], "sm90").values():
        ours[warm.launch_key(name, args, kwargs)].add(triton_key(name, args, kwargs))
        launches.append((name, args, kwargs))
merged = {k: v for k, v in ours.items() if len(v) > 1}
groups = [{triton_key(*launch) for launch in group} for group in warm.compile_groups(launches)]
kernels = set().union(*groups)
split = sum(len(g) > 1 for g in groups)
print(len(keys), len(ours), len(merged), len(groups), len(kernels), split)
"""


def test_launch_keys_never_merge_launches_triton_compiles_apart():
    """The compile plan compiles one launch per launch_key; Triton's own key (the binder's
    specialisation and options, for sm90) must be the same for every launch sharing it, or
    a case would compile on use. And compile_groups' groups are Triton's kernels exactly:
    one key per group (else a process compiles two kernels one after the other), one group
    per key (else two processes compile the same kernel). Runs without TRITON_INTERPRET
    (the kernels as compiled)."""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _KEY_CHECK], env=compile_env(), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    twins, launches, merged, groups, kernels, split = map(int, out.stdout.split())
    assert twins > 200 and launches > twins and merged == 0
    assert groups == kernels < launches and split == 0


def test_a_compile_process_takes_the_device_as_prepare_names_it():
    """`bundlegen run --device cuda` hands the compile processes "cuda" (no index): they
    compile on the current device. Before any launch, so no GPU is needed here."""
    from bundlegen.engines.triton import warm
    assert warm._compile_launches("cuda", []) == 0


@pytest.mark.parametrize("offset", [0, 1, 8])
def test_the_vec_warm_predicts_is_the_one_the_harness_storages_give(offset):
    """warm picks a variant's VEC from the graph alone, modelling where the harness puts a
    view in its storage (bundlegen.validate.GUARD_ELEMS in): the launcher's own pick on a
    materialized case must agree, or prepare compiles a variant no case launches."""
    from bundlegen.graph import dense_graph
    from bundlegen.harness.materialize import materialize
    from bundlegen.engines.triton import addressing, launch, warm
    from tests.graph_factory import make_case

    graph = dense_graph(H_q=2, S_q=16, D_qk=16, offsets={"q": offset})
    expected = launch.VEC if offset % launch.VEC == 0 else 1
    assert warm._vec(graph) == expected
    assert addressing.vec_for(materialize(make_case(graph, seed=1), "cpu").tensors) == expected
