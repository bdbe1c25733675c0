"""Claim enforcement: bundlegen.claims.store's lookups, `bundlegen run` turning a claimed case that is
declined into claim-broken (bundlegen.harness.case with a claims.json written by bundlegen.claims.store), and
unclaimed support (passing cases with no claim)."""
import pytest
import torch

from bundlegen.claims.harvest import UnclaimedCase, unclaimed_support
from bundlegen.claims.store import ClaimSet, claims_path, is_claimed, load_claims, write_claim_set
from tests.graph_factory import make_case, make_graph


@pytest.fixture()
def root(tmp_path):
    write_claim_set(claims_path("torch-flash", tmp_path),
                    ClaimSet("torch-flash", claims={"sm90": frozenset({"a", "b"}), "sm120": frozenset()},
                             declines={"sm90": {"c": "hv-not-hk"}}))
    return tmp_path


def test_load_claims_and_is_claimed(root):
    assert load_claims("torch-flash", root) == {"sm90": {"a", "b"}, "sm120": set()}
    assert is_claimed("torch-flash", "sm90", "a", root)
    assert not is_claimed("torch-flash", "sm120", "a", root)
    assert not is_claimed("torch-flash", "sm90", "c", root)       # declined is not claimed
    assert load_claims("torch-cudnn", root) == {}                   # never harvested


def test_checked_in_claims_files_parse():
    from bundlegen.engines.registry import known_names

    for name in known_names():
        load_claims(name)      # raises ClaimsError on a malformed file


class DecliningEngine:
    name, arch, deterministic = "torch-flash", "sm90", False
    device = torch.device("cuda")

    def is_applicable(self, graph):
        return "mask-not-served: the op takes is_causal only"

    def run(self, graph, tensors):
        raise AssertionError("a declined case is never run")


@pytest.mark.parametrize("claimed,verdict", [(True, "claim-broken"), (False, "declined")])
def test_run_enforces_claims(root, claimed, verdict):
    from bundlegen.harness import config
    from bundlegen.harness.case import run_case

    case = make_case(make_graph(left=4, right=0))
    ids = {case.id} if claimed else {"someone-else"}
    write_claim_set(claims_path("torch-flash", root), ClaimSet("torch-flash", claims={"sm90": frozenset(ids)}))
    outcome = run_case(case, DecliningEngine(), config.load_engine_config(root / "torch_flash"))
    assert outcome.verdict == verdict
    assert outcome.reason.startswith("mask-not-served")


def _r(case, verdict="pass", purpose="claim", arch="sm90", margin=3.0):
    return {"case_id": case, "verdict": verdict, "purpose": purpose, "arch": arch,
            "engine": "torch-flash", "margin": margin}


def test_unclaimed_support(root):
    results = [_r("a"), _r("x"), _r("y", verdict="declined"), _r("z", verdict="fail:numeric"),
               _r("p", purpose="probe"), _r("g", purpose="regression"), _r("a", arch="sm120")]
    found = unclaimed_support(results, load_claims("torch-flash", root))
    assert found == [UnclaimedCase("torch-flash", "sm120", "a"), UnclaimedCase("torch-flash", "sm90", "g"),
                     UnclaimedCase("torch-flash", "sm90", "x")]
    assert found[-1].margin == 3.0
