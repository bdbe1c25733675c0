"""`bundlegen run`: a thin layer over bundlegen.harness.level.run_level."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from bundlegen.harness.workers import pycache

# the harness is imported in main, after the bytecode prefix is set (workers.pycache), and
# so that `bundlegen --help` (which imports every command module) stays light


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--level", default=None,
                        help="quick, pr, nightly or full (lower levels included); required without --lane")
    parser.add_argument("--engine", default=None,
                        help="engine name (torch-math, triton, ...) or package.module:Class; "
                             "required without --lane")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available, else cpu)")
    parser.add_argument("--devices", default=None, metavar="LIST",
                        help="several devices of this host, one worker each (cuda:0,cuda:1 or all; "
                             "cpu,cpu runs two CPU workers): cases go out longest predicted first "
                             "into one results.jsonl")
    parser.add_argument("--workers-per-device", type=int, default=None, metavar="N",
                        help="N worker processes share each device (default 1): the cases' host "
                             "work (inputs, checks) then overlaps while the GPU is shared; with "
                             "--devices cuda:0,cuda:1, N per GPU")
    parser.add_argument("--mps", action="store_true", default=None,
                        help="the GPU workers are clients of a private CUDA MPS server, so that "
                             "several workers per GPU run their kernels side by side instead of "
                             "time-slicing; a case that crashes beside others is run again alone")
    parser.add_argument("--lane", default=None, metavar="NAME",
                        help="take engine, device(s), level, timeout and extra skips from lane NAME "
                             "of the workspace's lanes.yaml (flags given here win); without --shard "
                             "the whole lane runs at once")
    parser.add_argument("--lanes-file", default=None, metavar="PATH",
                        help="the lanes file for --lane (default: the workspace's)")
    parser.add_argument("--out", default=None, help="output directory (default out/<engine>-<level>)")
    parser.add_argument("-k", dest="pattern", action="append", default=None, metavar="EXPRESSION",
                        help="only cases matching EXPRESSION: terms joined by and/or/not and "
                             "parentheses; a term matches when the case id, group, level/group/id "
                             "or an item contains it or matches it as a glob; repeated -k must all match")
    parser.add_argument("--shard", default=None, metavar="I/N",
                        help="run shard I of N (1-based), split by a hash of the case id")
    parser.add_argument("--resume", action="store_true",
                        help="keep OUT/results.jsonl and skip the cases it already records")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="per-case timeout in seconds (default 300 on cuda, 600 on cpu)")
    parser.add_argument("--repeat", type=int, default=None, metavar="N",
                        help="runs per case for the determinism check (default 2 for a deterministic engine)")
    parser.add_argument("--no-isolation", action="store_true",
                        help="run the engine in this process (debugging: no timeout, a crash ends the run)")
    parser.add_argument("--bundles", default=None, metavar="DIR",
                        help="bundle root (default: the workspace's bundles, else the built-in ones)")
    parser.add_argument("--engine-config", default=None, metavar="DIR",
                        help="folder with the engine's engine.toml and claims.json (default: the "
                             "workspace's folder for the engine, else the built-in engine's)")
    parser.add_argument("--allow-empty", action="store_true",
                        help="exit 0 even when nothing was tested (every case declined or skipped, "
                             "or none selected); without it such a run exits 5")
    parser.add_argument("--plan", default=None, metavar="NAME",
                        help="the plan to run when the bundle root holds several")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--shuffle", nargs="?", const="draw", default=None, metavar="SEED",
                        help="run the cases in the order this seed shuffles them to (without a "
                             "seed: one drawn and printed); run.json records the seed and order")
    parser.add_argument("--run-skipped", action="store_true",
                        help="run the cases the engine config's [[test_skips]] rows skip, and report "
                             "each row whose cases all pass as stale")
    parser.add_argument("--allow-stale-tolerances", action="store_true",
                        help="run although the engine TOML's generated tolerance block differs from the "
                             "tolerance TOML (every result records it)")
    parser.add_argument("--no-server", action="store_true",
                        help="start fresh workers even when a matching `bundlegen serve` is running")


def shuffle_seed(given: str | None) -> int | None:
    """--shuffle's seed: None without it; drawn (and printed) when given no seed."""
    if given is None:
        return None
    if given == "draw":
        import secrets

        seed = secrets.randbelow(2 ** 32)
        print(f"shuffle seed: {seed} (--shuffle {seed} runs this order again)", file=sys.stderr, flush=True)
        return seed
    try:
        seed = int(given)
    except ValueError:
        raise ValueError(f"--shuffle {given}: expected a whole number (a seed)") from None
    if seed < 0:
        raise ValueError(f"--shuffle {given}: expected a seed of 0 or more")
    return seed


def resume_command(argv: list[str] | None = None) -> str:
    """This command line with --resume, to go on where an interrupted run stopped."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--resume" not in args:
        args.append("--resume")
    return " ".join(shlex.quote(a) for a in ["bundlegen", *args])


#: failing cases listed in full after the summary; the rest are counted
LIST_FAILING = 40


def print_failing(out, records, args: argparse.Namespace) -> None:
    """Each failing case: verdict, where, items, detail, and the command that re-runs it."""
    from bundlegen.harness import verdicts as V
    from bundlegen.harness.results import repro_command

    failing = [r for r in records if r.get("verdict") in V.FAILING]
    if not failing:
        return
    out.print(f"failing cases ({len(failing)}):", style="bold red")
    for r in failing[:LIST_FAILING]:
        where = r.get("file") or f"{r.get('level')}/{r.get('group')}"
        detail = " ".join(str(r.get("detail") or r.get("reason") or "").split())
        out.print(f"  {r['verdict']}  {r.get('case_id')}  {where}  {' '.join(r.get('items') or [])}",
                  highlight=False, soft_wrap=True)
        if detail:
            out.print(f"    {detail[:300]}", highlight=False, soft_wrap=True)
        if r.get("level") and r.get("case_id"):
            out.print(f"    re-run: {rerun_command(args, r)}", highlight=False, soft_wrap=True)
            explain = repro_command(r["case_id"], args.engine, r.get("device"))
            if args.bundles:
                explain += f" --bundles {shlex.quote(str(args.bundles))}"
            out.print(f"    explain: {explain}", highlight=False, soft_wrap=True)
    if len(failing) > LIST_FAILING:
        out.print(f"  ... and {len(failing) - LIST_FAILING} more in the results file", highlight=False)


def rerun_command(args: argparse.Namespace, record) -> str:
    """The command that runs one recorded case alone."""
    words = ["bundlegen", "run", "--level", record["level"], "--engine", args.engine,
             "--device", record.get("device") or args.device or "cpu", "-k", record["case_id"],
             "--out", f"out/rerun-{record['case_id']}"]
    if args.bundles:
        words += ["--bundles", str(args.bundles)]
    return " ".join(shlex.quote(w) for w in words)


def device_split(per_device) -> str:
    """run.json's per-worker tallies summed per device: 'cuda:0 (4 workers) 1200 cases 81.0 s'
    (seconds: the workers' case wall time added up)."""
    sums: dict[str, list] = {}
    for d in per_device:
        row = sums.setdefault(d["device"], [0, 0, 0.0])
        row[0] += 1
        row[1] += d["cases"]
        row[2] += d["seconds"]
    return ", ".join(f"{dev}{f' ({n} workers)' if n > 1 else ''} {cases} cases {seconds:.1f} s"
                     for dev, (n, cases, seconds) in sums.items())


def take_lane(args: argparse.Namespace, lane, shard: tuple[int, int] | None) -> None:
    """Fill what the command line left open from the lane (flags given win)."""
    args.engine = args.engine or lane.engine
    args.level = args.level or lane.level
    if args.device is None and args.devices is None:
        if lane.devices:
            args.devices = lane.devices
        else:
            args.device = lane.device
    if args.workers_per_device is None:
        args.workers_per_device = lane.workers_per_device
    if args.mps is None:
        args.mps = lane.mps
    if args.timeout is None:
        args.timeout = lane.timeout_s
    if args.out is None:
        args.out = str(lane.out_dir(shard))


def with_lane_skips(config, engine: str, lane):
    """The engine's configuration with the lane's skips after its own [[test_skips]]."""
    from dataclasses import replace

    from bundlegen.engines.registry import registered_name
    from bundlegen.harness.config import load_engine_config
    from bundlegen.workspace import engine_config_dir

    if config is None:
        config = load_engine_config(engine_config_dir(registered_name(engine)))
    return replace(config, skips=config.skips + lane.skips)


def _stderr():
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


def _plain(message) -> str:
    """A message shown as written: brackets in it (pip's `bundlegen[triton]`) are not rich markup."""
    from rich.markup import escape

    return escape(str(message))


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a CI job cancelled, a parent ending its children): ended as Ctrl-C is."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def main(args: argparse.Namespace) -> int:
    """The run command; SIGTERM ends it as Ctrl-C does (what finished is recorded, one line
    says so, the workers exit quietly), not with the silent death of the default action."""
    import signal

    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:          # not the main thread: leave the signal as it is
        previous = None
    try:
        return _main(args)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main(args: argparse.Namespace) -> int:
    # bytecode kept as a worker keeps it (workers.pycache), before the harness is imported
    pycache.keep_bytecode_in_this_process()
    # only what starts the workers is imported before run_level (rich, the results module
    # and lanes after, or where needed): each millisecond here delays the workers' start
    from bundlegen.engines.registry import EngineNotFound
    from bundlegen.harness import verdicts as V
    from bundlegen.harness.bundles import levels_upto
    from bundlegen.harness.config import EngineConfigError, load_engine_config
    from bundlegen.harness.level import NothingSelected, run_level
    from bundlegen.harness.selection import parse_shard, selection
    from bundlegen.harness.workers.devices import DEVICE_RE, DeviceUnavailable, resolve_devices
    from bundlegen.harness.workers.mps import MpsError
    from bundlegen.harness.workers.worker import WorkerStartError

    lane = None
    try:
        shard = parse_shard(args.shard)
        if args.lane is not None:
            from bundlegen.harness.lanes import lanes_path, load_lanes

            lane = load_lanes(lanes_path(args.lanes_file)).lane(args.lane)
            take_lane(args, lane, shard)
        if args.level is None or args.engine is None:
            raise ValueError("--level and --engine are required (or --lane NAME)")
        levels_upto(args.level, args.bundles, args.plan)
        selection(args.pattern)
        if args.device is not None and args.devices is not None:
            raise ValueError("give --device or --devices, not both")
        if args.device is not None and not DEVICE_RE.fullmatch(args.device):
            raise ValueError(f"--device {args.device}: expected cpu, cuda or cuda:N")
        devices = resolve_devices(args.devices) if args.devices is not None else None
        shuffle = shuffle_seed(getattr(args, "shuffle", None))
        workers_per_device = 1 if args.workers_per_device is None else args.workers_per_device
        if workers_per_device < 1:
            raise ValueError(f"--workers-per-device {workers_per_device}: expected 1 or more")
    except (ValueError, DeviceUnavailable) as exc:   # LanesError is a ValueError
        _stderr().print(f"[red]error:[/red] {_plain(exc)}", highlight=False)
        return V.EXIT_USAGE
    try:
        config = None
        if args.engine_config is not None:
            if not Path(args.engine_config).is_dir():
                raise EngineConfigError(f"--engine-config {args.engine_config}: not a folder")
            config = load_engine_config(args.engine_config)
        if lane is not None and lane.skips:
            config = with_lane_skips(config, args.engine, lane)
        summary = run_level(
            args.level, args.engine, device=args.device, out=args.out, bundles=args.bundles, plan=args.plan,
            pattern=args.pattern, shard=shard, resume=args.resume, timeout_s=args.timeout,
            repeat=args.repeat, isolation=not args.no_isolation, config=config,
            progress=None if args.quiet else ("bar" if sys.stderr.isatty() else "lines"),
            devices=devices, lane=args.lane or "", workers_per_device=workers_per_device,
            server=not args.no_server, allow_empty=args.allow_empty, mps=bool(args.mps), shuffle=shuffle,
            run_skipped=bool(getattr(args, "run_skipped", False)),
            allow_stale_tolerances=bool(getattr(args, "allow_stale_tolerances", False)))
    except NothingSelected:
        _nothing_tested("no case was selected", "; the out folder is left as it was")
        return V.EXIT_NOTHING_TESTED
    except (EngineNotFound, EngineConfigError, WorkerStartError, DeviceUnavailable, ValueError,
            MpsError) as exc:
        _stderr().print(f"[red]error:[/red] {_plain(exc)}", highlight=False)
        return V.EXIT_USAGE
    from rich.console import Console

    from bundlegen.harness.results import read_results, summary_table

    err = _stderr()
    if summary.server_note:
        err.print(summary.server_note, highlight=False)
    served = summary.times.served_by if summary.times is not None else None
    if served:
        err.print(f"workers: pre-started by bundlegen serve (pid {served['pid']}, "
                  f"{served['workers_started_s_ago']:.0f} s ago)", highlight=False)
    for line in summary.bundle_errors:
        err.print(f"[red]malformed bundle:[/red] {line}", highlight=False)
    for line in summary.dead_rows:
        err.print(f"[yellow]warning:[/yellow] {_plain(line)}", highlight=False)
    if summary.times is not None and summary.times.prepare_problem:
        err.print(f"[yellow]engine prepare failed (cases built on use instead):[/yellow] "
                  f"{summary.times.prepare_problem}", highlight=False)
    table = summary_table(list(summary.levels), title=f"{args.engine} {args.level}")
    out = Console()
    if not out.is_terminal:   # a log is as wide as the table needs, never cut at 80 columns
        out = Console(width=max(80, Console(width=1000).measure(table).maximum,
                                len(str(table.caption or "")) + 2))
    out.print(table)
    records = read_results(summary.results_path)
    print_failing(out, records, args)
    from bundlegen.harness.progress import TOP_REASONS, not_run_reasons
    for line in not_run_reasons(records, None if getattr(args, "verbose", 0) else TOP_REASONS):
        out.print(f"not run: {line}", highlight=False, soft_wrap=True)
    for line in summary.stale_skips:
        out.print(line, highlight=False, soft_wrap=True)
    resumed = f" ({summary.resumed} already recorded)" if summary.resumed else ""
    out.print(f"ran {summary.ran} cases{resumed}; results {summary.results_path}, "
              f"junit {summary.junit_path}", highlight=False, soft_wrap=True)
    if summary.times is not None:
        t = summary.times
        before = f"process start {t.before_s:.1f} + " if t.before_s is not None else ""
        out.print(f"time: {(t.before_s or 0.0) + t.elapsed_s:.1f} s = {before}worker start {t.start_s:.1f} "
                  f"+ prepare {t.prepare_s:.1f} + cases {t.cases_s:.1f} + finish {t.finish_s:.1f}",
                  highlight=False, soft_wrap=True)
        if len(t.per_device) > 1:
            out.print("devices: " + device_split(t.per_device), highlight=False, soft_wrap=True)
    code = summary.exit_code
    if summary.interrupted:
        err.print(f"[yellow]interrupted[/yellow] after {summary.ran} of {summary.planned} cases; "
                  f"results, junit and run.json are written. Go on with:\n  {resume_command()}",
                  highlight=False)
        return code
    if code == V.EXIT_NOTHING_TESTED:
        counts = summary.counts()
        why = (", ".join(f"{counts[v]} {v}" for v in V.ALL if counts.get(v))
               or "no case was selected") + "; no case judged on its gradients"
        if args.allow_empty:
            return V.EXIT_OK
        _nothing_tested(why)
    return code


def _nothing_tested(why: str, after: str = "") -> None:
    from bundlegen.harness import verdicts as V

    _stderr().print(f"[red]error:[/red] nothing was tested ({why}); exit {V.EXIT_NOTHING_TESTED} "
                    f"(pass --allow-empty to accept an empty run){after}", highlight=False)
