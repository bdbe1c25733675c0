"""bench/engine_speed.py --rounds: the engines are timed in turns, each cell is the median
of its rounds, and the target lines give the spread of the per-round ratios."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "bench"))

import engine_speed as ES  # noqa: E402


class _Recorded:
    """An engine that records each run() in a shared log (no aten op to capture: this
    module has no call_by_schema)."""

    def __init__(self, name: str, log: list[str]):
        self.name, self.log = name, log

    def is_applicable(self, graph):
        return None

    def run(self, graph, tensors):
        self.log.append(self.name)


def _timer(values):
    """A timer that calls fn once and answers the next of `values` (ms)."""
    it = iter(values)

    def time_ms(fn):
        fn()
        return next(it)
    return time_ms


def test_rounds_time_the_engines_in_turns_each_round_starting_one_later():
    log: list[str] = []
    engines = {ES.TRITON: _Recorded(ES.TRITON, log), "torch-math": _Recorded("torch-math", log)}
    # timed calls in order: triton, torch-math; torch-math, triton; triton, torch-math
    timer = _timer([2.0, 4.0, 4.4, 1.0, 3.0, 3.0])
    row = ES.measure_shape(ES.Shape(1, 2, 2, 64, 32, "bf16", False), engines, timer,
                           torch.device("cpu"), rounds=3)
    # each engine: one untimed first call, then its timed call of each round
    assert log == [ES.TRITON, ES.TRITON, "torch-math", "torch-math",
                   "torch-math", ES.TRITON, ES.TRITON, "torch-math"]
    ours, theirs = row.cells[ES.TRITON], row.cells["torch-math"]
    assert [r for r, _ in ours.rounds] == [2.0, 1.0, 3.0] and ours.run_ms == 2.0
    assert [r for r, _ in theirs.rounds] == [4.0, 4.4, 3.0] and theirs.run_ms == 4.0
    assert row.ratio("torch-math") == 2.0
    assert row.round_ratios("torch-math") == [2.0, 4.4, 1.0]


def test_one_round_is_the_plain_measurement():
    log: list[str] = []
    engines = {ES.TRITON: _Recorded(ES.TRITON, log)}
    row = ES.measure_shape(ES.Shape(1, 2, 2, 64, 32, "bf16", False), engines, _timer([5.0]),
                           torch.device("cpu"))
    assert log == [ES.TRITON, ES.TRITON]
    assert row.cells[ES.TRITON].run_ms == 5.0 and row.cells[ES.TRITON].rounds == ((5.0, None),)


def test_target_lines_give_the_spread_of_the_per_round_ratios():
    shape = ES.target_shapes()[0]
    cells = {ES.TRITON: ES.Cell(ES.TRITON, run_ms=4.0, rounds=((4.0, None), (4.2, None), (3.9, None))),
             "torch-cudnn": ES.Cell("torch-cudnn", run_ms=3.3, op_ms=3.0,
                                    rounds=((3.4, 3.0), (3.3, 3.0), (3.2, 3.0)))}
    lines = [line for line in ES.target_lines([ES.Row(shape, cells)]) if "torch-cudnn" in line]
    assert len(lines) == 1
    # medians 3.0 / 4.0; per round 3.0/4.0, 3.0/4.2, 3.0/3.9
    assert ": 0.75 (goal >= 0.75: met;" in lines[0]
    assert "3 rounds: 0.714-0.769, 2 at or over" in lines[0]


def test_rounds_must_be_positive(capsys):
    try:
        ES.parse_args(["--rounds", "0"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("--rounds 0 was accepted")
    assert "--rounds 0: expected 1 or more" in capsys.readouterr().err
