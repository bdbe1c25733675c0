"""The generated block of an engine TOML: one `[[tolerance_overrides]]` row per tolerance class
of a plan, between the BEGIN and END marker lines, for a harness that is not Python (it reads
its engine TOML, not our manifest) to take our numbers.

A row's filters pick exactly the cases of its class: the harness gives each case the class
its bundle record names (`tolerance_class`), so that is the row's key, with the plan and the
class's dtype beside it (every case of a class has the class's dtype). Head dims, level or
item could not: the class follows from the longest reduction, which no one of them fixes.

Everything outside the markers stays byte for byte. Without markers the block goes before the
file's first hand-written `[[tolerance_overrides]]` row, so a hand row still wins (the last
matching row applies), or at the end of a file that has none."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import Mapping

from bundlegen.tolerance import Tolerance
from bundlegen.tolerance_bounds import TOLERANCE_KEYS

BEGIN = "# BEGIN generated tolerance classes (bundlegen)"
END = "# END generated tolerance classes (bundlegen)"
ROW_HEADER = "[[tolerance_overrides]]"


class BlockError(ValueError):
    """The engine TOML's markers, or the TOML around them, do not allow a block (one line)."""


@dataclass(frozen=True)
class Refreshed:
    text: str          # the engine TOML with the block written or refreshed
    changed: bool
    rows: int


def row_filters(plan: str, tc: Tolerance) -> dict[str, str]:
    return {"plan": plan, "tolerance_class": tc.name, "dtype": tc.dtype}


def block_text(plan: str, classes: Mapping[str, Tolerance], source: str, digest: str,
               newline: str = "\n") -> str:
    """BEGIN line to END line (no newline after END) for `classes` in their order."""
    import tomlkit      # the writer's dependency only

    lines = [BEGIN,
             f"# Written by `bundlegen tolerances` from {source}",
             f"# ({digest}).",
             "# Do not edit between the markers: run the command again after `bundlegen generate`.",
             "# One row per tolerance class; a case takes the row of the class its bundle record",
             "# names (`tolerance_class`). A row written after the END marker still wins: the last",
             "# matching row applies."]
    for name, tc in classes.items():
        inline = tomlkit.inline_table()
        inline.update(row_filters(plan, tc))
        lines += ["", f"# {name}: {tc.dtype} io, longest reduction {_low(classes, tc)} to {tc.max_reduction} terms",
                  ROW_HEADER, f"filters = {inline.as_string()}",
                  *(f"{key} = {tomlkit.item(float(getattr(tc, key))).as_string()}" for key in TOLERANCE_KEYS)]
    lines += ["", END]
    return newline.join(lines)


def _low(classes: Mapping[str, Tolerance], tc: Tolerance) -> int:
    """The least reduction the class covers: one past the next smaller class of its dtype."""
    below = [c.max_reduction for c in classes.values() if c.dtype == tc.dtype and c.max_reduction < tc.max_reduction]
    return max(below, default=0) + 1


def refresh(text: str, block: str) -> Refreshed:
    """`text` with `block` between its markers (or inserted, see the module's doc). Raises
    BlockError when the markers are malformed, or when the block would not read back as its
    own rows where it stands (keys after the END marker would join its last row)."""
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.splitlines(keepends=True)
    bare = [line.rstrip("\r\n") for line in lines]
    _refuse_near_misses(bare)
    begins = [i for i, line in enumerate(bare) if line == BEGIN]
    ends = [i for i, line in enumerate(bare) if line == END]
    if len(begins) > 1 or len(ends) > 1 or len(begins) != len(ends) or (begins and begins[0] > ends[0]):
        raise BlockError(f"expected one {BEGIN!r} line and, after it, one {END!r} line, or neither "
                         f"(found {len(begins)} and {len(ends)})")
    block = block.replace("\n", newline) if newline != "\n" else block
    if begins:
        start, end = begins[0], ends[0]
        before = "".join(lines[:start])
        after_end = lines[end][len(bare[end]):]           # END's own line ending stays
        new = before + block + after_end + "".join(lines[end + 1:])
    else:
        at = next((i for i, line in enumerate(bare) if line.strip() == ROW_HEADER), None)
        while at is not None and at > 0 and bare[at - 1].lstrip().startswith("#"):
            at -= 1                                       # the hand row's own comment lines
        if at is None:
            head = text if not text or text.endswith(("\n", "\r")) else text + newline
            new = head + (newline if head.strip() else "") + block + newline
        else:
            new = "".join(lines[:at]) + block + newline + newline + "".join(lines[at:])
    rows = _check_reads_back(new, block)
    return Refreshed(text=new, changed=new != text, rows=rows)


def _marker_key(line: str) -> str:
    """A line as a near-miss of a marker would read: spaces squeezed, case folded."""
    return " ".join(line.split()).casefold()


def _refuse_near_misses(bare: list[str]) -> None:
    """A line that is a marker but for its spacing or case (`# BEGIN ... ` with a trailing
    space, an indented marker) would not be found, and a second block would be written
    below a stale one: refuse it, naming the line."""
    for number, line in enumerate(bare, 1):
        for marker in (BEGIN, END):
            if line != marker and _marker_key(line) == _marker_key(marker):
                raise BlockError(f"line {number}: {line!r} is not exactly the marker {marker!r} "
                                 "(spacing or case differs): write the marker line exactly")


def _check_reads_back(text: str, block: str) -> int:
    try:
        own = tomllib.loads(block).get("tolerance_overrides", [])
        whole = tomllib.loads(text).get("tolerance_overrides", [])
    except tomllib.TOMLDecodeError as exc:
        raise BlockError(f"the file with the block is not valid TOML: {exc}") from None
    if not any(whole[i:i + len(own)] == own for i in range(len(whole) - len(own) + 1)):
        raise BlockError("the block does not read back as its own rows where the markers stand: "
                         "put the END marker before a table header, not before plain keys")
    return len(own)

