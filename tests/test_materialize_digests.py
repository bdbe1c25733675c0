"""materialize writes the same bits as it did before its writes moved to the device: every
input storage (guards included) of a fixed set of bundle cases against digests recorded
with the earlier materialize (tests/materialize_digests.py), and, where a GPU is present,
q, k, v, do there too (O and Stats come from the oracle on the case's device)."""
from __future__ import annotations

import json

import pytest
import torch

from tests import materialize_digests as T


@pytest.fixture(scope="module")
def recorded():
    data = json.loads(T.DIGESTS_PATH.read_text())
    assert data["device"] == "cpu"
    return data["cases"]


@pytest.fixture(scope="module")
def cases():
    return T.cases()


def test_the_recorded_cases_are_all_there(recorded, cases):
    assert sorted(c.id for c in cases) == sorted(recorded)


def test_every_input_storage_has_the_recorded_bits_on_the_cpu(recorded, cases):
    differ = {c.id: [p for p, d in T.digests(c, "cpu").items() if d != recorded[c.id][p]]
              for c in cases}
    assert {i: ports for i, ports in differ.items() if ports} == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_drawn_inputs_have_the_recorded_bits_on_a_gpu(recorded, cases):
    differ = {c.id: [p for p, d in T.digests(c, "cuda").items()
                     if p in ("q", "k", "v", "do") and d != recorded[c.id][p]]
              for c in cases}
    assert {i: ports for i, ports in differ.items() if ports} == {}
