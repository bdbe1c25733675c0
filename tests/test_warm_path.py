"""harness/workers/warm_path.py: a GPU worker's warm-up of the case path (its gain is measured on a
GPU: bench/first_case.py --no-warm-path)."""
from bundlegen.harness.workers import warm_path


def test_every_check_runs_to_the_end_for_each_dtype():
    """A pass means materialize, the oracle, every check and the determinism re-run ran:
    an engine that left its outputs unwritten would stop the path at the NaN check."""
    assert warm_path.warm("cpu") == ["pass"] * len(warm_path.DTYPES)
    assert {c.graph.dtype for c in warm_path.warm_cases()} == set(warm_path.DTYPES)


def test_only_gpu_workers_warm_and_the_switch_turns_it_off(monkeypatch):
    assert warm_path.start("cpu") is None
    monkeypatch.setenv(warm_path.SWITCH, "0")
    assert warm_path.start("cuda:0") is None
