"""Exit codes that mean what they say (issue 45): exit 0 needs at least one case judged on
its gradients; a run whose claim and regression cases were all skipped exits 5 like an empty
one, whatever its probes did."""
from __future__ import annotations

from bundlegen import reasons as R
from bundlegen.harness import verdicts as V
from bundlegen.harness.config import EngineConfig
from bundlegen.harness.level import run_level
from tests import harness_support as S
from tests.test_harness_run import ZERO_STRIDE_DV, probe


def run(tmp_path, cases, config):
    S.write_bundle(tmp_path / "bundles", "quick", "g", cases)
    return run_level("quick", S.engine_ref(S.TorchMathEngine), device="cpu", bundles=tmp_path / "bundles",
                     out=tmp_path / "out", isolation=False, config=config)


def skip_all(config: EngineConfig) -> EngineConfig:
    from dataclasses import replace
    return replace(config, skips=(S.skip_row({"purpose": ("claim", "regression")}, "every case skipped"),))


def test_probes_alone_pass_no_run(tmp_path):
    cases = [S.case_of(1), probe("frontend", R.LEFT_BOUND_NONPOSITIVE, left=0),
             probe("engine", R.ZERO_STRIDE_OUTPUT, out_strides=ZERO_STRIDE_DV)]
    summary = run(tmp_path, cases, skip_all(S.LOOSE))
    counts = summary.counts()
    assert counts.get(V.REJECTED) == 2 and counts.get(V.SKIPPED) == 1, counts
    assert summary.exit_code == V.EXIT_NOTHING_TESTED


def test_one_case_judged_on_its_gradients_passes_the_run(tmp_path):
    cases = [S.case_of(1), probe("frontend", R.LEFT_BOUND_NONPOSITIVE, left=0)]
    summary = run(tmp_path, cases, S.LOOSE)
    assert summary.counts().get(V.PASS) == 1 and summary.exit_code == V.EXIT_OK
