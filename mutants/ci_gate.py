"""The mutation gate CI can afford: every mutant of the catalog, over the Triton engine in
the Triton interpreter on the CPU, over the whole quick level, each stopped at its first kill.
One run per case: the determinism re-run is `bundlegen run`'s check, and no mutant here
needs it to die. tests/test_mutation_gate.py runs it in the test suite; by hand:

    python -m bundlegen.mutants.ci_gate [--mutant NAME ...] [--json PATH]
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Sequence

from bundlegen.graph import Case


@dataclass(frozen=True)
class Gate:
    engine: str = "triton"
    device: str = "cpu"
    level: str = "quick"
    repeat: int = 1


GATE = Gate()


def use_interpreter() -> None:
    """TRITON_INTERPRET=1 for this process; Triton must not be imported without it yet."""
    os.environ["TRITON_INTERPRET"] = "1"
    from bundlegen.engines.triton.engine import triton_mode_error
    error = triton_mode_error()
    if error is not None:
        raise RuntimeError(f"the CPU mutation gate needs the Triton interpreter: {error}")


def run_gate(names: Sequence[str] | None = None, cases: Sequence[Case] | None = None,
             gate: Gate = GATE, **kwargs):
    """The kill matrix of the named mutants (default: all) over `cases` (default: the
    gate's level from the checked-in bundles)."""
    from bundlegen.mutants import catalog
    from bundlegen.mutants.kill import kill_matrix, load_cases

    use_interpreter()
    if cases is None:
        cases = load_cases(gate.level)
    return kill_matrix(catalog.select(names), gate.engine, list(cases), level=gate.level,
                       device=gate.device, repeat=gate.repeat, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bundlegen.mutants.ci_gate", description=__doc__.splitlines()[0])
    parser.add_argument("--mutant", action="append", default=[], metavar="NAME")
    parser.add_argument("--json", dest="json_path", default=None, metavar="PATH")
    args = parser.parse_args(argv)
    use_interpreter()

    from rich.console import Console

    from bundlegen.graph import canonical_json
    from bundlegen.mutants.command import matrix_table, summary_line

    matrix = run_gate(args.mutant or None)
    out = Console(width=160, emoji=False)
    out.print(matrix_table(matrix))
    out.print(summary_line(matrix), highlight=False, soft_wrap=True)
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            fh.write(canonical_json(matrix.to_json()))
    return matrix.exit_code


if __name__ == "__main__":
    sys.exit(main())
