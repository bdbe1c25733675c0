"""bundlegen: test plan, bundles, harness and support matrix for the SDPA backward pass.

Each subcommand lives in the package that owns the work, as a module with
`add_arguments(parser)` and `main(args) -> int`; this file only routes.
"""
from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "generate": ("bundlegen.generator.command", "expand the plan into bundles and tolerance blocks"),
    "run": ("bundlegen.harness.command", "run a level's cases against an engine"),
    "serve": ("bundlegen.harness.serve_command", "keep warm workers for later runs of the same engine and devices"),
    "lanes": ("bundlegen.harness.lanes_command", "check, list or emit the CI lanes of lanes.yaml"),
    "harvest": ("bundlegen.claims.harvest_command", "turn passing results into support claims"),
    "matrix": ("bundlegen.claims.matrix_command", "render SUPPORT_MATRIX.md from the claims"),
    "report": ("bundlegen.claims.report_command", "an HTML report of results with plots"),
    "mutate": ("bundlegen.mutants.command", "run engine mutants and print the kill matrix"),
    "calibrate": ("bundlegen.generator.calibrate_command", "fit the cost model to measured case times"),
    "repro": ("bundlegen.harness.repro_command", "run one case in-process and explain its verdict"),
    "shrink": ("bundlegen.generator.shrink_command", "shrink a failing case to a minimal graph and a Regression"),
    "tolerance-power": ("bundlegen.harness.tolerance_power_command",
                        "apply defect models to the oracle's outputs: can each tolerance see them"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; given `command`, only that subcommand's module is imported (the others
    are listed for --help but get no arguments), so `bundlegen run` never pays for the
    imports of `calibrate` or `report`."""
    parser = argparse.ArgumentParser(prog="bundlegen", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name) if command in (None, name) else None
        p = sub.add_parser(name, help=help_text, description=help_text)
        if module is not None:
            module.add_arguments(p)
            p.set_defaults(_main=module.main)
    return parser


class _Version(argparse.Action):
    """--version, looked up when asked: importlib.metadata costs every command some 15 ms."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs):
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0,
                         help="show program's version number and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog} {version()}")   # on stdout, as argparse's own action
        parser.exit()


def version() -> str:
    from importlib import metadata

    return metadata.version("bundlegen")


def main(argv: list[str] | None = None) -> int:
    from bundlegen.harness import pycache

    pycache.keep_bytecode_in_this_process()   # the subcommand's imports, as a worker's
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command if command in SUBCOMMANDS else None).parse_args(argv)
    return int(args._main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
