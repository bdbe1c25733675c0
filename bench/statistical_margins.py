"""The statistical judge's margins in results files: per engine and level, how many cases it
judged, how many it failed, and the distribution of their least statistical margin (and of
the engine's error over the io-precision reference's, per output).

    python bench/statistical_margins.py RESULTS.jsonl[.gz] ... [--json PATH]
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys


def records(path: str):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def summary(paths: list[str]) -> list[dict]:
    margins = collections.defaultdict(list)
    ratios = collections.defaultdict(list)
    fails = collections.Counter()
    for path in paths:
        for r in records(path):
            key = (r["engine"], r.get("level", "?"))
            if r.get("verdict") == "fail:statistical":
                fails[key] += 1
            if isinstance(r.get("statistical_margin"), (int, float)):
                margins[key].append(r["statistical_margin"])
            for port, out in (r.get("outputs") or {}).items():
                if isinstance(out, dict) and isinstance(out.get("error_ratio"), (int, float)):
                    ratios[key + (port,)].append(out["error_ratio"])
    rows = []
    for key in sorted(margins):
        m = margins[key]
        rows.append({"engine": key[0], "level": key[1], "judged": len(m), "fail_statistical": fails[key],
                     "margin_min": min(m), "margin_p1": quantile(m, 0.01), "margin_p5": quantile(m, 0.05),
                     "margin_median": quantile(m, 0.5),
                     "ratio_max": {p: max(ratios[key + (p,)]) for p in ("dq", "dk", "dv", "dbias", "dsinks")
                                   if ratios[key + (p,)]}})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    rows = summary(args.paths)
    for row in rows:
        ratio = ", ".join(f"{p} {v:.2f}" for p, v in row["ratio_max"].items())
        print(f"{row['engine']:16s} {row['level']:8s} judged {row['judged']:5d}  fail:statistical "
              f"{row['fail_statistical']:3d}  margin min {row['margin_min']:.2f} p1 {row['margin_p1']:.2f} "
              f"p5 {row['margin_p5']:.2f} median {row['margin_median']:.2f}  largest error ratio: {ratio}")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
