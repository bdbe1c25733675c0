"""`bundlegen mutate`: run every engine mutant over a level and print the kill matrix.

  bundlegen mutate --engine triton --level quick [--device cpu|cuda] [--mutant NAME ...]
                   [-k PATTERN] [--bundles DIR] [--json PATH] [--all-kills]
  bundlegen mutate --engine triton --levels quick,pr [...]

--levels runs the levels in turn, each over its own new cases and only the mutants no lower
level killed, and prints which level first kills each mutant, beside its boundary class
(the kill matrix per level; exit 1 when a mutant is not killed by its `killed_by` level).

Exit 1 when a mutant survives the level (or cannot be built), 2 on a usage error.
On the CPU the Triton engine runs in the Triton interpreter: TRITON_INTERPRET=1 is set
here when it is not set already.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", default="triton",
                        help="engine to mutate (default triton; kernel-flag mutants need triton, "
                             "wrapper mutants work for any engine)")
    parser.add_argument("--level", default=None, help="quick, pr, nightly or full (lower levels included)")
    parser.add_argument("--levels", default=None, metavar="L1,L2,...",
                        help="run these levels in turn (e.g. quick,pr) and report the first level "
                             "that kills each mutant")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available, else cpu)")
    parser.add_argument("--mutant", action="append", default=[], metavar="NAME",
                        help="run only this mutant (repeatable)")
    parser.add_argument("-k", dest="pattern", default=None, metavar="PATTERN",
                        help="only cases whose id, group, level/group/id or an item contains PATTERN "
                             "or matches it as a glob")
    parser.add_argument("--bundles", default=None, metavar="DIR", help="bundle root (default: the repo's bundles/)")
    parser.add_argument("--json", dest="json_path", default=None, metavar="PATH",
                        help="write the kill matrix as JSON")
    parser.add_argument("--all-kills", action="store_true",
                        help="run every case for every mutant and list every kill (slow)")
    parser.add_argument("--repeat", type=int, default=None, metavar="N",
                        help="runs per case for the determinism check (default: the harness's)")
    parser.add_argument("--isolation", action="store_true",
                        help="run each mutant in a worker process (a mutant that kills its process "
                             "costs one case); default in-process")
    parser.add_argument("--list", action="store_true", help="print the catalog and exit")
    parser.add_argument("-q", "--quiet", action="store_true", help="no per-mutant progress lines")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    err = Console(stderr=True, emoji=False, soft_wrap=True)
    if args.list:
        from bundlegen.mutants.catalog import CATALOG
        Console(width=max(Console().width, 160), emoji=False).print(catalog_table(CATALOG))
        return 0
    levels = tuple(x.strip() for x in (args.levels or "").split(",") if x.strip())
    if args.levels is not None and args.level:
        err.print("[red]error:[/red] give --level or --levels, not both")
        return 2
    if levels:
        args.level = levels[-1]
    if not args.level:
        err.print("[red]error:[/red] --level (or --levels) is required")
        return 2
    device = args.device or _default_device()
    if args.engine == "triton" and device.startswith("cpu") and "TRITON_INTERPRET" not in os.environ:
        os.environ["TRITON_INTERPRET"] = "1"   # before anything imports Triton

    from bundlegen.engines.registry import EngineNotFound, engine_class
    from bundlegen.harness.bundles import manifest_of
    from bundlegen.harness.config import EngineConfigError, load_engine_config
    from bundlegen.mutants import catalog
    from bundlegen.mutants.kill import kill_matrix, load_cases
    from bundlegen.workspace import engine_config_dir

    try:
        manifest = manifest_of(args.bundles)
        upto = manifest.levels_upto(args.level)
        for level in levels:
            manifest.levels_upto(level)
        if list(levels) != sorted(levels, key=manifest.level_names.index) or len(set(levels)) != len(levels):
            raise ValueError(f"--levels must name levels once each, lowest first ({', '.join(manifest.level_names)})")
        mutants = catalog.select(args.mutant)
        if not args.mutant:   # by default only the mutants this level must kill
            mutants = tuple(m for m in mutants if m.killed_by in upto)
    except (ValueError, KeyError) as exc:
        err.print(f"[red]error:[/red] {exc.args[0] if exc.args else exc}")
        return 2
    def progress(result) -> None:
        if not args.quiet:
            err.print(f"  {result.name}: {_status_text(result)}", highlight=False)

    if levels:
        return _by_levels(args, manifest, mutants, levels, device, progress)
    cases = load_cases(args.level, args.bundles, args.pattern)

    try:
        config = load_engine_config(engine_config_dir(engine_class(args.engine).name), manifest)
        matrix = kill_matrix(mutants, args.engine, cases, level=args.level, device=device,
                             pattern=args.pattern, first_kill_only=not args.all_kills,
                             repeat=args.repeat, isolation=args.isolation, config=config,
                             on_result=progress)
    except (EngineNotFound, EngineConfigError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    out = Console(width=max(Console().width, 160), emoji=False)
    out.print(matrix_table(matrix, manifest))
    out.print(summary_line(matrix), highlight=False, soft_wrap=True)
    if args.json_path:
        _write_json(args.json_path, matrix.to_json(), out)
    return matrix.exit_code


def _write_json(path, obj, out) -> None:
    from bundlegen.graph import canonical_json
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(canonical_json(obj), encoding="utf-8")
    out.print(f"kill matrix written to {path}", highlight=False)


def _by_levels(args, manifest, mutants, levels, device, progress) -> int:
    """`--levels`: kill.kill_levels over the named levels, then the first-kill table."""
    from rich.console import Console

    from bundlegen.engines.registry import EngineNotFound, engine_class
    from bundlegen.harness.config import EngineConfigError, load_engine_config
    from bundlegen.mutants.kill import kill_levels, load_cases
    from bundlegen.workspace import engine_config_dir

    err = Console(stderr=True, emoji=False, soft_wrap=True)

    def cases_of(level, done):
        seen = {x for d in done for x in manifest.levels_upto(d)}
        if not args.quiet:
            err.print(f"level {level}:", highlight=False)
        return [c for c in load_cases(level, args.bundles, args.pattern) if c.level not in seen]

    try:
        config = load_engine_config(engine_config_dir(engine_class(args.engine).name), manifest)
        result = kill_levels(mutants, args.engine, levels, cases_of, device=device,
                             pattern=args.pattern, first_kill_only=not args.all_kills,
                             repeat=args.repeat, isolation=args.isolation, config=config,
                             on_result=progress)
    except (EngineNotFound, EngineConfigError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    out = Console(width=max(Console().width, 160), emoji=False)
    out.print(levels_table(result, mutants, manifest))
    out.print(levels_summary(result, mutants, args.engine), highlight=False, soft_wrap=True)
    if args.json_path:
        _write_json(args.json_path, result.to_json(mutants), out)
    broken = any(r.status not in ("killed", "survived", "n/a")
                 for m in result.matrices for r in m.results)
    return 1 if result.late(mutants) or broken else 0


def levels_table(result, mutants, manifest=None):
    """One row per mutant: its boundary class, the level it must die by, the level that
    first killed it and the killing case."""
    from rich.markup import escape
    from rich.table import Table

    from bundlegen.mutants.kill import KILLED

    late = set(result.late(mutants))
    table = Table(title=f"kill matrix by level: {', '.join(result.levels)}")
    for col in ("mutant", "boundary class", "must die by", "first killed at", "killing case",
                "its items", "check: verdict", "cases", "s"):
        table.add_column(col, overflow="fold")
    for m in mutants:
        r = result.result(m.name)
        first = result.first_level(m.name)
        k = r.kill if r.status == KILLED else None
        style = "bold red" if m.name in late else ("green" if first else "yellow")
        shown = first or (r.status if r.status != "survived" else "survived all")
        table.add_row(
            m.name, m.boundary_class or "-", m.killed_by, f"[{style}]{escape(shown)}[/{style}]",
            k.where if k else escape(r.note or "-"),
            ", ".join(shown_items(k.items, manifest)) if k else "",
            f"{k.check}: {k.verdict}" if k else "",
            str(sum(x.cases_run for x in _results_of(result, m.name))),
            f"{sum(x.wall_s for x in _results_of(result, m.name)):.1f}")
    return table


def _results_of(result, name):
    return [r for matrix in result.matrices for r in matrix.results if r.name == name]


def levels_summary(result, mutants, engine) -> str:
    counts = {level: sum(result.first_level(m.name) == level for m in mutants) for level in result.levels}
    never = [m.name for m in mutants if result.first_level(m.name) is None]
    text = (f"mutate {engine} {','.join(result.levels)}: first killed at "
            + ", ".join(f"{level} {n}" for level, n in counts.items())
            + f" of {len(mutants)} mutants")
    if never:
        text += f"; not killed: {', '.join(never)}"
    late = result.late(mutants)
    if late:
        text += f"; LATE (not killed by their killed_by level): {', '.join(late)}"
    return text


def _default_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _status_text(result) -> str:
    from bundlegen.mutants.kill import KILLED
    if result.status == KILLED:
        k = result.kill
        share = ""
        if len(result.kills) > 1 or result.exercised > 1:   # every case run (--all-kills)
            share = (f"; killed by {result.exercised_kills} of the {result.exercised} cases meeting its "
                     f"condition ({result.kill_fraction:.0%})")
        return f"killed by {k.where} ({k.verdict}) after {result.cases_run} case(s), {result.wall_s:.1f} s{share}"
    return f"{result.status}{': ' + result.note if result.note else ''} ({result.cases_run} case(s))"


# ----------------------------------------------------------------------------- rendering
def catalog_table(mutants):
    from rich.table import Table

    table = Table(title="mutant catalog")
    for col in ("mutant", "kind", "defect class", "what it does"):
        table.add_column(col, overflow="fold")
    for m in mutants:
        table.add_row(m.name, m.kind, m.defect_class, m.description)
    return table


def matrix_table(matrix, manifest=None):
    from rich.table import Table

    from bundlegen.mutants.kill import KILLED, SURVIVED

    from rich.markup import escape

    table = Table(title=f"kill matrix: {matrix.engine} on {matrix.device} ({matrix.arch}), "
                        f"level {matrix.level}" + (f", -k {matrix.pattern}" if matrix.pattern else ""))
    for col in ("mutant", "kind", "result", "first killing case", "its items", "check: verdict",
                "detail", "cases", "s") + (() if matrix.first_kill_only else ("killed / judged",)):
        table.add_column(col, overflow="fold")
    for r in matrix.results:
        style = {KILLED: "green", SURVIVED: "bold red"}.get(r.status, "yellow")
        k = r.kill
        table.add_row(
            r.name, r.kind, f"[{style}]{r.status}[/{style}]",
            k.where if k else escape(r.note or "-"),
            ", ".join(shown_items(k.items, manifest)) if k else "",
            f"{k.check}: {k.verdict}" if k else "",
            escape(_short(k.detail, 70)) if k else "",
            str(r.cases_run), f"{r.wall_s:.1f}",
            *(() if matrix.first_kill_only else
              (f"{r.exercised_kills} / {r.exercised}" + (f" ({r.kill_fraction:.0%})" if r.exercised else ""),)))
    return table


def shown_items(items, manifest=None) -> list[str]:
    """A case's items less the axis items of default values (every case has most of them);
    `manifest`: the cases' bundle manifest (default: the default bundle root's)."""
    from bundlegen.harness.bundles import manifest_of

    defaults = (manifest or manifest_of()).default_items()
    return [i for i in items if i not in defaults]


def _short(text: str, limit: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def summary_line(matrix) -> str:
    from bundlegen.mutants.kill import KILLED, NOT_APPLICABLE, SURVIVED

    applicable = matrix.applicable
    killed = matrix.count(KILLED)
    pct = 100.0 * killed / applicable if applicable else 100.0
    text = (f"mutate {matrix.engine} {matrix.level}: {killed} of {applicable} mutants killed "
            f"({pct:.0f} %) over {matrix.cases} cases in {matrix.wall_s:.1f} s")
    survived = [r.name for r in matrix.results if r.status == SURVIVED]
    if survived:
        text += f"; SURVIVED: {', '.join(survived)}"
    na = [r.name for r in matrix.results if r.status == NOT_APPLICABLE]
    if na:
        text += f"; not applicable: {', '.join(na)}"
    broken = [r.name for r in matrix.results if r.status not in (KILLED, SURVIVED, NOT_APPLICABLE)]
    if broken:
        text += f"; could not build: {', '.join(broken)}"
    return text
