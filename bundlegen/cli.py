"""bundlegen: test plan, bundles, harness and support matrix for the SDPA backward pass.

Each subcommand lives in the package that owns the work, as a module with
`add_arguments(parser)` and `main(args) -> int`; this file only routes.
"""
from __future__ import annotations

import argparse
import importlib
import logging
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
    "tolerances": ("bundlegen.claims.hipdnn_tolerances_command",
                   "write the tolerance classes into an engine TOML's generated block (ours or hipDNN's)"),
    "export": ("bundlegen.claims.hipdnn_command", "write the plan's bundles in a consumer's format (hipDNN)"),
}


VERBOSE_HELP = "more output: -v info logs and every decline reason, -vv debug logs"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; given `command`, only that subcommand's module is imported (the others
    are listed for --help but get no arguments), so `bundlegen run` never pays for the
    imports of `calibrate` or `report`, and `bundlegen --help` or `--version` imports no
    subcommand (nor torch) at all."""
    parser = argparse.ArgumentParser(prog="bundlegen", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_Version)
    parser.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
    # the same switch after the command (`bundlegen run ... -v`); SUPPRESS keeps a count
    # given before the command when none is given after it
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name) if command == name else None
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[verbose])
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


def configure_logging(verbose: int) -> None:
    """stdlib logging on stderr: warnings by default, -v info (and every decline reason in
    a run's summary), -vv debug."""
    logger = logging.getLogger("bundlegen")   # ours only: the root logger is the host's (pytest's too)
    logger.setLevel(logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG)
    if not any(getattr(h, "name", None) == LOG_HANDLER for h in logger.handlers):
        handler = StderrHandler()
        handler.name = LOG_HANDLER
        handler.setFormatter(logging.Formatter("%(name)s: %(levelname)s: %(message)s"))
        logger.addHandler(handler)


#: the name of the handler configure_logging adds (once) to the `bundlegen` logger
LOG_HANDLER = "bundlegen-cli"


class StderrHandler(logging.StreamHandler):
    """Writes to sys.stderr as it is when a record is written: a handler made once keeps
    following a redirected or captured stderr."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command if command in SUBCOMMANDS else None).parse_args(argv)
    configure_logging(args.verbose)
    from bundlegen.extras import MissingExtra

    try:
        return int(args._main(args) or 0)
    except MissingExtra as exc:   # an optional dependency this command needs: one line, no traceback
        from bundlegen.harness.verdicts import EXIT_USAGE

        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
