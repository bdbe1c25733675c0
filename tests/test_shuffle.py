"""Order-independent verdicts (issue 45): `bundlegen run --shuffle SEED` runs the cases in a
seeded order recorded in run.json, and on the CPU two seeds give torch-math the same verdict
for every case; `--shuffle` without a seed draws one and prints it."""
from __future__ import annotations

import json

from bundlegen import reasons as R
from bundlegen.cli import main
from bundlegen.harness.results import read_results
from bundlegen.harness.selection import shuffled
from tests import harness_support as S
from tests.test_harness_run import ZERO_STRIDE_DV, probe

CASES = [S.case_of(n, S_q=3 + n, S_kv=4 + 2 * n, D_qk=8, D_v=8) for n in range(1, 9)] + [
    S.case_of(20, dtype="fp32"), probe("frontend", R.LEFT_BOUND_NONPOSITIVE, left=0),
    probe("engine", R.ZERO_STRIDE_OUTPUT, out_strides=ZERO_STRIDE_DV)]


def run(tmp_path, out: str, *shuffle: str) -> tuple[dict, dict]:
    bundles = tmp_path / "bundles"
    if not bundles.exists():
        S.write_bundle(bundles, "quick", "mixed", CASES)
    assert main(["run", "--level", "quick", "--engine", "torch-math", "--device", "cpu",
                 "--bundles", str(bundles), "--out", str(tmp_path / out), "--quiet", "--no-server",
                 *shuffle]) == 0
    records = {r["case_id"]: r["verdict"] for r in read_results(tmp_path / out / "results.jsonl")}
    return records, json.loads((tmp_path / out / "run.json").read_text())


def test_two_seeds_run_two_orders_and_give_the_same_verdicts(tmp_path):
    first, first_run = run(tmp_path, "seed1", "--shuffle", "1")
    second, second_run = run(tmp_path, "seed2", "--shuffle", "2")
    ids = [c.id for c in CASES]
    assert first_run["shuffle_seed"] == 1 and second_run["shuffle_seed"] == 2
    assert sorted(first_run["order"]) == sorted(ids) == sorted(second_run["order"])
    assert first_run["order"] != second_run["order"] != ids
    assert first_run["order"] == [c.id for c in shuffled(CASES, 1)]
    assert first == second and len(first) == len(CASES)


def test_shuffle_without_a_seed_draws_one_prints_it_and_records_it(tmp_path, capsys):
    _, record = run(tmp_path, "drawn", "--shuffle")
    err = capsys.readouterr().err
    seed = record["shuffle_seed"]
    assert isinstance(seed, int) and f"shuffle seed: {seed} (--shuffle {seed} runs this order again)" in err
    assert record["order"] == [c.id for c in shuffled(CASES, seed)]


def test_an_unshuffled_run_records_no_order(tmp_path):
    _, record = run(tmp_path, "plain")
    assert record["shuffle_seed"] is None and record["order"] == []
