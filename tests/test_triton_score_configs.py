"""The configs a launch with score modifiers or dropout switches to (configs.BlockConfig's
modifiers, dropout, drawn_dropout; launch.prepare through for_scores): which one each graph
runs, that shrinking leaves them, and sm90's dropout and modifier tiles on the interpreter
(the kernels as those configs launch them, judged against the oracle)."""
from __future__ import annotations

import dataclasses

import pytest

from bundlegen.engines.triton import configs, launch
from bundlegen.engines.triton.engine import TritonEngine, banded
from bundlegen.graph import dense_graph, with_modifiers
from bundlegen.harness import verdicts as V
from bundlegen.harness.case import run_case
from bundlegen.plans import sdpa_bwd as P
from tests import harness_support as S
from tests.graph_factory import make_case

MODS = {"plain": {}, "bias": dict(bias="full"), "softcap": dict(softcap=5.0), "alibi": dict(alibi_slopes="head"),
        "port": dict(dropout=0.5, dropout_mask="full"), "drawn": dict(dropout=0.5, dropout_mask=None),
        "port+bias": dict(dropout=0.5, dropout_mask="full", bias="full")}


def _graph(d: int, mod: str, causal: bool = False, **kw):
    base = dict(dtype="bf16", B=1, H_q=2, H_k=1, S_q=40, S_kv=72, D_qk=d, right=0 if causal else None,
                alignment="BOTTOM_RIGHT")
    g = dense_graph(**{**base, **kw})
    return with_modifiers(g, **MODS[mod]) if MODS[mod] else g


def _expected(table: configs.BlockConfig, mod: str) -> configs.BlockConfig:
    """The config the launch should run, read from the table's fields (not for_scores)."""
    sub = {"port": table.dropout, "port+bias": table.dropout, "drawn": table.drawn_dropout,
           "plain": None}.get(mod, table.modifiers)
    return sub or table


@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("d", (64, 128, 256))
def test_each_launch_runs_its_modifiers_or_dropout_config(d, causal):
    """sm90: a dropout launch runs its form's config, a modifier launch without dropout the
    modifiers' config, a plain launch the table's, where the (banded) tier config has one."""
    seen = set()
    for mod in MODS:
        graph = _graph(d, mod, causal)
        table = configs.config_for("sm90", d, d, banded(graph))
        L = launch.prepare(graph, launch.meta_tensors(graph), table)
        assert L.cfg == _expected(table, mod), (d, causal, mod)
        seen.add(L.cfg != table)
    assert True in seen   # every tier has configs of its own for dropout


def test_sm90_serves_dropout_at_every_tier_with_configs_of_its_own():
    """Every tier the capability row serves dropout at with aligned rows has dropout configs
    (the tuned tiles spill with the mask tile), plain and banded, but for D 64's band with the
    mask port, which runs the band's own tiles (measured faster; its variants within the known
    spills, test_triton_resources); the cpu table has none."""
    from bundlegen.engines.triton.capabilities import ROWS
    for tier in (64, 128, 192, 256):
        cfg = configs.ARCHS["sm90"].for_block_d(tier)
        for c in (cfg, cfg.banded or cfg):
            assert c.drawn_dropout is not None, tier
            assert (c.dropout is None) == (tier == 64 and c is cfg.banded), tier
        for form in ("port", "drawn"):
            assert ROWS["sm90"].dropout_spill(_graph(tier, form)) is None
    assert all(c.switches() == (c,) or c.pointer_loads for _, c in configs.ARCHS["cpu"].tiers)


def test_shrink_leaves_the_score_configs():
    table = configs.config_for("sm90", 128, 128)
    assert len(table.switches()) > 2
    smaller = configs.shrink(table)
    assert smaller.switches() == (smaller,)
    assert (smaller.modifiers, smaller.dropout, smaller.drawn_dropout) == (None, None, None)


class Sm90TilesEngine(TritonEngine):
    """The Triton engine on the interpreter with sm90's table configs (their modifiers and
    dropout configs included)."""

    def config(self, graph):
        return configs.config_for("sm90", graph.D_qk, graph.D_v, banded(graph))


@pytest.mark.parametrize("d, mod, causal", [(64, "port", False), (64, "drawn", True), (128, "port", True),
                                            (128, "drawn", False), (128, "bias", False), (192, "port", True),
                                            (192, "drawn", False), (256, "port", False), (256, "drawn", True)])
def test_sm90_score_tiles_pass_on_the_interpreter(d, mod, causal):
    graph = _graph(d, mod, causal)
    table = configs.config_for("sm90", d, d, banded(graph))
    assert launch.prepare(graph, launch.meta_tensors(graph), table).cfg == _expected(table, mod) != table
    case = dataclasses.replace(make_case(graph, seed=5), tolerance_class=P.tolerance_class_for(graph))
    out = run_case(case, Sm90TilesEngine("cpu"), S.PLAIN)
    assert out.verdict == V.PASS, out


def test_the_preprocess_kernel_runs_the_given_config():
    """One preprocess variant per tier: its Q tile and options are the table config's, not the
    modifier or dropout config's the other kernels switch to (whose dQ tiles differ)."""
    table = configs.config_for("sm90", 128, 128)
    seen, switched = set(), set()

    class Kernels:   # records the preprocess launch's compile-time arguments
        class bwd_preprocess:
            def __class_getitem__(cls, grid):
                return lambda *args, **kw: seen.add(tuple(sorted((k, v) for k, v in kw.items()
                                                                 if k.isupper() or k.startswith("num_"))))

    for mod in ("plain", "port", "drawn", "bias"):
        graph = _graph(128, mod)
        L = launch.prepare(graph, launch.meta_tensors(graph), table)
        launch.run_preprocess(dataclasses.replace(L, kernels=Kernels))
        switched.add((L.cfg.block_m2, L.cfg.num_warps_dq))
    assert len(seen) == 1 and len(switched) > 1, (seen, switched)
