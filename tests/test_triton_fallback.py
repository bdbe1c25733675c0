"""The Triton engine's fallback when a launch runs out of resources: the next smaller config
(configs.shrink) for that variant only, remembered for it, so that a case's config, and so
its bits, never depend on which cases ran before it in the worker."""
import pytest

from bundlegen.engines.triton import configs
from bundlegen.engines.triton.engine import TritonEngine
from tests.triton_reference import prepare
from tests import triton_oor_launch as oor


class OutOfResourcesEngine(TritonEngine):
    launch_module = "tests.triton_oor_launch"


@pytest.fixture
def engine():
    oor.launched.clear()
    oor.refused.clear()
    return OutOfResourcesEngine("cpu")


def _run(engine, graph):
    engine.run(graph, prepare(graph, seed=0).views)
    return oor.launched[-1][1]


def test_only_the_variant_that_ran_out_of_resources_runs_a_smaller_config(engine, capsys):
    from bundlegen.graph import dense_graph
    causal, plain = dense_graph(right=0), dense_graph()
    table = engine.config(causal)
    assert table == engine.config(plain)
    smaller = configs.shrink(table)

    assert _run(engine, causal) == smaller
    assert len(oor.refused) == 1
    assert "ran out of resources" in capsys.readouterr().err
    assert _run(engine, plain) == table        # the same tier, another variant: its own config
    assert _run(engine, causal) == smaller     # remembered: no second refusal
    assert len(oor.refused) == 1
    assert _run(engine, plain) == table


def test_a_case_gets_the_same_config_whatever_ran_before_it(engine):
    from bundlegen.graph import dense_graph
    causal, plain = dense_graph(right=0), dense_graph()
    first = [_run(engine, g) for g in (plain, causal)]
    other = OutOfResourcesEngine("cpu")
    second = [_run(other, g) for g in (causal, plain)][::-1]
    assert first == second


def test_a_launch_error_that_is_not_resources_is_raised(engine, monkeypatch):
    from bundlegen.graph import dense_graph

    def broken(L):
        raise RuntimeError("illegal memory access")
    monkeypatch.setattr(oor, "run", broken)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        engine.run(dense_graph(), prepare(dense_graph(), seed=0).views)
