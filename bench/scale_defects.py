"""How many cases of a level fail a scaled gradient: the power of the verdict (worst-case
bound and statistical judge together) against an engine whose output is a few per cent off.

Each case the engine serves is laid out and run once (a correct engine, torch-math by
default); then every defect scales a copy of the engine's outputs (a whole output, or one
head of it: the middle head of the output's head axis) and the harness's own checks judge
it, as they would a mutant engine that computed those numbers. A case counts for a defect
only when the scaled part is not all zero. Prints, per defect and io dtype, the cases that
fail, and which judge failed them.

    python bench/scale_defects.py [--level quick] [--engine torch-math] [-k PATTERN] [--json PATH]
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from dataclasses import dataclass

import torch

from bundlegen.engines.registry import engine_class
from bundlegen.harness import case as C, checks, materialize as M, verdicts as V
from bundlegen.harness.bundles import default_bundle_root, load_level
from bundlegen.harness.config import load_engine_config
from bundlegen.harness.selection import matches_pattern
from bundlegen.harness.tolerance_power import SCALE_E
from bundlegen.workspace import engine_config_dir


@dataclass(frozen=True)
class Defect:
    name: str
    port: str
    factor: float | None      # None: tolerance_power.SCALE_E of the graph's dtype
    one_head: bool = False

    def scale(self, dtype: str) -> float:
        return 1.0 + (SCALE_E[dtype] if self.factor is None else self.factor - 1.0)


DEFECTS = (
    Defect("dq x1.05", "dq", 1.05), Defect("dk x1.02", "dk", 1.02), Defect("dk x1.05", "dk", 1.05),
    Defect("dk x1.10", "dk", 1.10), Defect("dk x1.10 one head", "dk", 1.10, True), Defect("dv x1.05", "dv", 1.05),
    *(Defect(f"{p} x(1+e)", p, None) for p in ("dq", "dk", "dv")),
    *(Defect(f"{p} x(1+e) one head", p, None, True) for p in ("dq", "dk", "dv")),
)


def scaled_part(t: torch.Tensor, one_head: bool) -> torch.Tensor:
    """The part of an output [B, H, S, D] or ragged [T, H, D] a defect scales."""
    if not one_head:
        return t
    axis = 1
    return t.select(axis, t.shape[axis] // 2)


def judge(m: M.Materialized, tol) -> str:
    outputs, reference = M.judged_outputs(m)
    errors = checks.PendingErrors(checks.output_pairs(outputs, reference), tol)
    slices = C.pending_slices(m, outputs, reference, tol)
    read = checks.read_back([*errors.tensors, *slices.tensors])
    n = len(errors.tensors)
    return checks.judge_errors(errors.resolve(read[:n]), tol, slices.resolve(read[n:])).verdict


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="quick")
    parser.add_argument("--engine", default="torch-math")
    parser.add_argument("-k", dest="pattern", default=None)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    loaded = load_level(default_bundle_root(), args.level)
    engine = engine_class(args.engine)("cpu")
    config = load_engine_config(engine_config_dir(engine.name), loaded.manifest)
    counts = collections.defaultdict(lambda: collections.Counter())
    judged = 0
    for case in loaded.cases:
        if case.purpose == "probe" or not matches_pattern(case, args.pattern):
            continue
        if config.skip_reason(case, engine.arch) or C.decline_reason(engine, case.graph):
            continue
        if C.too_large_for_cpu(case.graph, loaded.manifest):
            continue
        tol = config.tolerance_for(case)
        m = M.materialize(case, "cpu")
        engine.run(case.graph.as_launched(), m.tensors)
        if judge(m, tol) != V.PASS:
            print(f"{case.id}: the correct engine fails; left out", file=sys.stderr)
            continue
        judged += 1
        saved = {p: m.tensors[p].clone() for p in ("dq", "dk", "dv")}
        dtype = case.graph.dtype
        for defect in DEFECTS:
            part = scaled_part(m.tensors[defect.port], defect.one_head)
            if not part.count_nonzero():
                continue
            part.mul_(defect.scale(dtype))
            counts[(defect.name, dtype)][judge(m, tol)] += 1
            m.tensors[defect.port].copy_(saved[defect.port])
        print(f"\r{judged} cases judged", end="", file=sys.stderr)
    print(file=sys.stderr)
    rows = []
    for (name, dtype), verdicts in sorted(counts.items()):
        total = sum(verdicts.values())
        failed = total - verdicts[V.PASS]
        rows.append({"defect": name, "dtype": dtype, "cases": total, "failed": failed,
                     "numeric": verdicts[V.FAIL_NUMERIC], "statistical": verdicts[V.FAIL_STATISTICAL]})
        print(f"{name:22s} {dtype:5s} {failed:4d} of {total:4d} fail ({100 * failed / total:5.1f} %): "
              f"{verdicts[V.FAIL_NUMERIC]} by the bound, {verdicts[V.FAIL_STATISTICAL]} by the statistical judge")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump({"level": args.level, "engine": args.engine, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
