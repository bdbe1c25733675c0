"""`bundlegen tolerance-power --level quick [--levels quick,pr] [--sample N]`: apply the generic
defect models to the oracle's own outputs of a level's sampled cases and report, per output,
the share of cases whose bound each model falls outside (bundlegen.harness.tolerance_power).
Exit 1 when an output has a model that some case applies and no case sees, or a model of a few
per cent (TP.POWERED_MODELS) that fewer than TP.MIN_SHARE of the cases it applies to fail."""
from __future__ import annotations

import argparse

#: cases judged per level unless --sample says otherwise (CPU seconds: about 0.1 each)
DEFAULT_SAMPLE = 40


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--level", default=None, help="one level (the cases of it and every lower level)")
    parser.add_argument("--levels", default=None, help="comma-separated levels, each reported on its own")
    parser.add_argument("--sample", type=int, default=DEFAULT_SAMPLE, metavar="N",
                        help=f"cases judged per level (default {DEFAULT_SAMPLE}; every case with a "
                             "reduced output first)")
    parser.add_argument("--root", default=None, help="bundle root (default: the workspace's, else the built-in)")
    parser.add_argument("--plan", default=None, metavar="NAME", help="the plan, when the root holds several")


def main(args: argparse.Namespace) -> int:
    from bundlegen.harness import tolerance_power as TP
    from bundlegen.harness.bundles import load_level
    from bundlegen.harness.config import EngineConfig
    from bundlegen.workspace import default_bundle_root

    levels = [lv for lv in (args.levels or args.level or "quick").split(",") if lv]
    root = args.root or default_bundle_root()
    powers = []
    for level in levels:
        loaded = load_level(root, level, args.plan)
        # the bound the harness gives each case: the manifest's numbers for its class
        tolerance_for = EngineConfig(manifest=loaded.manifest).tolerance_for

        def progress(power):
            if args.verbose:   # -v (the CLI's own flag): one line per case
                unseen = [f"{r.output}/{r.model}" for r in power.results if not r.seen]
                print(f"  {power.case_id} ({power.tolerance_class}): "
                      + (f"unseen {', '.join(unseen)}" if unseen else "every model seen"))

        chosen = TP.sample(loaded.cases, args.sample)
        powers.append(TP.level_power(level, chosen, tolerance_for, progress))
    for line in TP.report_lines(powers):
        print(line)
    blind = [(lp.level, o, m) for lp in powers for o, m in lp.invisible()]
    for level, output, model in blind:
        share = next(lp for lp in powers if lp.level == level).shares[(output, model)]
        if share.seen:
            print(f"tolerance-power: {level}: {model} in {output} is seen by {share.seen} of {share.applicable} "
                  f"sampled cases, under {TP.MIN_SHARE:.0%}")
        else:
            print(f"tolerance-power: {level}: no sampled case sees {model} in {output}")
    return 1 if blind else 0
