"""A traceback a run records (run.json's prepare_problem, a crashed case's detail) names its
files as a reader elsewhere can place them: relative to the package root or a library's
sys.path entry, never by this machine's folders; each frame's source line is kept."""
import json

from bundlegen.harness.portable_traceback import PACKAGE_ROOT, portable_path, portable_traceback
from bundlegen.harness.workers.worker import prepare_engine


def _fails():
    json.loads("{not json")


def test_frames_are_named_from_the_package_root_and_from_libraries():
    try:
        _fails()
    except ValueError:
        text = portable_traceback()
    assert str(PACKAGE_ROOT) not in text and "/" + "tests/" not in text
    assert 'File "tests/test_portable_traceback.py"' in text and 'json.loads("{not json")' in text
    assert 'File "json/__init__.py"' in text or 'File "json/decoder.py"' in text   # the stdlib's entry
    assert text.rstrip().endswith("line 1 column 2 (char 1)")
    assert portable_path(str(PACKAGE_ROOT / "engines" / "triton" / "warm.py")) == "engines/triton/warm.py"


def test_a_failed_prepare_is_recorded_portably():
    class Fails:
        score_modifiers = frozenset()

        def prepare(self, graphs):
            _fails()
    problem = prepare_engine(Fails(), [])
    assert problem and str(PACKAGE_ROOT) not in problem and "tests/test_portable_traceback.py" in problem
