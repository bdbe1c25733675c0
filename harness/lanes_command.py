"""`bundlegen lanes`: check, list or turn the workspace's lanes.yaml into a CI workflow."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

# the harness is imported inside the functions that use it: `bundlegen --help` imports every
# command module, and should not pay for what only this command runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true",
                      help="engines and levels exist; every lane skip still matches a case and names a ticket")
    what.add_argument("--list", action="store_true", help="one line per lane")
    what.add_argument("--emit", choices=["github-actions"],
                      help="write a CI workflow: a job matrix over lanes x shards")
    what.add_argument("--triton-cache-key", action="store_true",
                      help="print the digest the workflow keys Triton's cache by (the installed "
                           "Triton engine's source and Triton's version)")
    what.add_argument("--junit-summary", default=None, metavar="JUNIT",
                      help="print a junit file as Markdown (the workflow appends it to the job summary)")
    parser.add_argument("--output", type=Path, default=None, metavar="PATH",
                        help="where --emit writes (default: standard output)")
    parser.add_argument("--lanes-file", default=None, metavar="PATH",
                        help="the lanes file (default: the workspace's, lanes.yaml)")
    parser.add_argument("--bundles", default=None, metavar="DIR",
                        help="bundle root --check reads (default: the workspace's, else the built-in)")


def main(args: argparse.Namespace) -> int:
    from bundlegen.harness import verdicts as V
    from bundlegen.harness.lanes import LanesError, check_lanes, lanes_path, load_lanes
    from bundlegen.harness.workflow import triton_cache_key, workflow_yaml

    if args.triton_cache_key:   # these two need no lanes file: they run inside the workflow's job
        print(triton_cache_key())
        return 0
    if args.junit_summary is not None:
        from bundlegen.harness.job_summary import junit_markdown

        sys.stdout.write(junit_markdown(args.junit_summary))
        return 0
    try:
        lanes = load_lanes(lanes_path(args.lanes_file))
    except LanesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return V.EXIT_USAGE
    if args.check:
        problems = check_lanes(lanes, args.bundles)
        for line in problems:
            print(line)
        if problems:
            return 1
        print(f"{lanes.path}: {len(lanes.lanes)} lanes ok")
        return 0
    if args.list:
        for lane in lanes.lanes.values():
            devices = lane.devices or lane.device
            print(f"{lane.name}: {lane.engine} on {devices}, level {lane.level}, {lane.shards} shard(s), "
                  f"runs on {lane.runner if isinstance(lane.runner, str) else '+'.join(lane.runner)}, keeps {', '.join(lane.keep)}")
        return 0
    try:
        text = workflow_yaml(lanes)
    except LanesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return V.EXIT_USAGE
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
        print(f"lanes: wrote {args.output}")
    return 0
