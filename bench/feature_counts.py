"""Per-engine verdict counts over the cases of one feature, from results files: for
ragged batches, which of their cases each engine passed, declined (and why), contained
(device probes) or failed.

    python bench/feature_counts.py evidence/h200/*.results.jsonl.gz
    python bench/feature_counts.py --feature RAGGED --feature INT64 out/*/results.jsonl

A case belongs to a feature when one of its plan items names it (`AX-RAGGED-...`,
`SHP-RAGGED-...`, `PRB-RAGGED-...`), unless that item is the feature's absence (`AX-BIAS-NONE`,
`AX-SINKS-OFF`). Decline reasons are counted by code.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict

from bundlegen.reasons import code_of
from bundlegen.results_file import read_results


#: the axis values that mean a feature is absent (AX-BIAS-NONE, AX-SINKS-OFF)
ABSENT = ("NONE", "OFF")


def belongs(items, feature: str) -> bool:
    return any(feature in parts and parts[-1] not in ABSENT
               for parts in (item.split("-") for item in items))


def counts(paths, feature: str):
    """(engine -> verdict -> n, engine -> decline code -> n), the latest record per case."""
    latest = {}
    for path in paths:
        for record in read_results(path):
            if belongs(record.get("items") or (), feature):
                latest[(record["engine"], record["case_id"])] = record
    verdicts, declines = defaultdict(Counter), defaultdict(Counter)
    for (engine, _), record in sorted(latest.items()):
        verdicts[engine][record["verdict"]] += 1
        if record["verdict"] == "declined":
            declines[engine][code_of(record.get("reason") or "?")] += 1
    return verdicts, declines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="results.jsonl(.gz) files or run folders")
    parser.add_argument("--feature", action="append", default=None,
                        help="an item word, e.g. RAGGED (default), INT64; repeatable")
    args = parser.parse_args(argv)
    found = 0
    for feature in args.feature or ["RAGGED"]:
        verdicts, declines = counts(args.results, feature)
        if not verdicts:
            print(f"{feature}: no case in these files", file=sys.stderr)
            continue
        found += 1
        print(f"== cases traced to a {feature} item")
        for engine in sorted(verdicts):
            row = ", ".join(f"{n} {v}" for v, n in sorted(verdicts[engine].items()))
            print(f"{engine:16s} {sum(verdicts[engine].values()):4d} cases: {row}")
            for code, n in declines[engine].most_common():
                print(f"{'':16s}      declined {n:3d} x {code}")
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
