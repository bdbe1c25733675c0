"""Digests of what `materialize` writes for a fixed set of bundle cases: every input
storage (q, k, v, o, do, stats, guards included) hashed bitwise. `tests/data/
materialize_digests.json` holds the digests recorded before materialize moved its writes
to the device (so a faster materialize is proved to give the same bits); re-record only
when the values are meant to change:

    python -m tests.materialize_digests [--device cpu] > tests/data/materialize_digests.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

DIGESTS_PATH = Path(__file__).parent / "data" / "materialize_digests.json"
#: the case ids (round-4 H200 results' slowest materialize cases, and one of each layout
#: kind: broadcast, padded, interleaved, overlapping rows, ragged, the three distributions)
CASE_IDS = (
    "81632be7ef7f", "e604b13e4ab0", "b8c9490509d7", "dab139523148", "35efe96dcbda",
    "eaf31fed9031", "9167a418c9f8", "eaf5a18883af", "81604a521bbb",
)
#: two ragged claims (pinned: a new ragged case sorting first must not swap them out)
RAGGED_IDS = ("08de3b8b4b89", "095edcbd6a91")
#: catalog entries whose first case is added (a broadcast head, overlapping input rows)
ITEMS = ("SHP-BROADCAST-HEAD-INPUTS", "SHP-OVERLAPPING-INPUT-ROWS")


def cases():
    from bundlegen.harness import bundles as B

    root = B.default_bundle_root()
    loaded = B.load_level(root, "full", B.manifest_of(root, None).plan)
    by_id = {c.id: c for c in loaded.cases}
    chosen = [by_id[i] for i in CASE_IDS]
    for item in ITEMS:
        chosen += [c for c in loaded.cases if item in c.items and c.expected_rejection is None][:2]
    return chosen + [by_id[i] for i in RAGGED_IDS]


def digests(case, device: str) -> dict[str, str]:
    from bundlegen.graph import INPUT_PORTS
    from bundlegen.harness import materialize as M
    from bundlegen.harness.checks import bit_pattern

    m = M.materialize(case, device)
    return {port: hashlib.blake2b(bit_pattern(m.storages[port]).cpu().contiguous().numpy().tobytes(),
                                  digest_size=16).hexdigest()
            for port in INPUT_PORTS}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    out = {c.id: digests(c, args.device) for c in cases()}
    json.dump({"device": args.device, "cases": out}, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
