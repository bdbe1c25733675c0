"""The progress line's time left comes from the predictions of the cases not yet finished
(harness/progress.py), and the summary sets the predicted phases beside the measured ones."""
from bundlegen.harness.progress import Progress, case_of, clock
from bundlegen.harness.results import phase_line, summarize


def test_time_left_is_the_predicted_seconds_of_the_unfinished_cases():
    predicted = {"a" * 12: 50.0, "b" * 12: 1.0, "c" * 12: 1.0, "d" * 12: 2.0}
    p = Progress("lines", 4, predicted)
    # one worker: a case started means the one before it finished
    assert p.left_s("quick/g/" + "a" * 12) == 54.0
    assert p.left_s("quick/g/" + "b" * 12) == 4.0          # the long one is done: no doubling
    assert p.left_s("quick/g/" + "c" * 12 + " [cpu]") == 3.0
    assert p.left_s("quick/g/" + "d" * 12) == 2.0
    assert p.left_s(None) == 0.0


def test_time_left_is_shared_by_the_workers():
    p = Progress("lines", 3, {"a": 4.0, "b": 4.0, "c": 2.0}, workers=2)
    assert p.left_s("q/g/a") == 5.0      # both workers busy next: nothing finished yet
    assert p.left_s("q/g/b") == 5.0
    assert p.left_s("q/g/c") == 3.0      # a worker took c, so a finished
    assert Progress(None, 1).left_s("q/g/a") is None


def test_labels_and_clock():
    assert case_of("pr/ragged-axes/0123456789ab [cuda:1, alone]") == "0123456789ab"
    assert clock(42) == "0:42" and clock(185) == "3:05" and clock(3729) == "1:02:09"


def test_summary_shows_predicted_phases_beside_measured():
    rows = [{"level": "quick", "verdict": "pass", "wall_s": 2.0, "materialize_s": 0.5, "oracle_s": 0.5,
             "engine_s": 0.5, "check_s": 0.5,
             "predicted_phases": {"materialize_s": 0.25, "oracle_s": 1.0, "engine_s": 2.0, "check_s": 0.0}},
            {"level": "quick", "verdict": "declined", "wall_s": 0.1}]
    line = phase_line(summarize(rows, ["quick"]))
    assert line == ("materialize 0.5 s (predicted 0.2), oracle 0.5 s (predicted 1.0), "
                    "engine 0.5 s (predicted 2.0), check 0.5 s (predicted 0.0)")
