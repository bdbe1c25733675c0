"""One prepared device call for the Triton engine's sm90 score-modifier and dropout configs
(configs.py: BlockConfig.modifiers, dropout, drawn_dropout), in two budgeted steps, each
writing under --out as it goes, so a call cut short keeps what it did:

1. correctness: `bundlegen run --level pr` (quick included) on the Triton engine, restricted
   with -k to every case with dropout or a score modifier (the cases these configs can
   change) and the regression and risk groups (a sample of the others); results.jsonl under
   OUT/levels, the log in OUT/levels.log;
2. speed: bench/speed_batch.py over the headline rows (D 128 and D 64, full and causal), the
   D 128 modifier rows and the dropout rows, each against torch-cudnn, torch-flash and
   FlexAttention's compiled backward in one process, and the configs these rows ran before
   (the `previous` candidates) and the dropout tiles around the table's; JSON in
   OUT/speed_batch.json, the log in OUT/speed_batch.log.

OUT/device_check.json records each step's command, exit status and seconds (written after
each step). Exit status: 0 when both steps ran and exited 0, else 1.

    python bench/device_check.py                       # the device call (about 8 minutes at most)
    python bench/device_check.py --dry-run             # the selection and the commands, nothing run
    python bench/device_check.py --device cpu --max-cases 2 --levels-s 300 --speed-s 200   # CPU smoke
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

LEVEL = "pr"
#: groups run whole beside the changed cases: a sample of the others (every kind of graph
#: a past defect or a named risk needed)
SAMPLE_GROUPS = ("regressions", "risks")
#: speed_batch rows: the headline shapes, the D 128 modifier rows (BlockConfig.modifiers) and
#: the dropout rows (dropout, drawn_dropout; banded too)
SPEED_CASES = ("d128-full", "d128-causal", "d64-full", "d64-causal", "d128-bias", "d128-bias-dbias",
               "d128-alibi", "d128-softcap", "d128-drop-port", "d128-drop-drawn", "d64-drop-port",
               "d64-drop-drawn", "d128-causal-drop-port", "d128-causal-drop-drawn",
               "d64-causal-drop-port", "d64-causal-drop-drawn")
SPEED_CANDIDATES = ("previous*", "drop *", "mods dkdv 32x64*", "mods dq 64x64*")


def changed(case) -> bool:
    """A case whose launch the score-modifier and dropout configs can change."""
    return bool(case.graph.attributes.dropout_probability or case.graph.modifiers)


def selection_terms(cases) -> list[str]:
    """-k terms (joined with `or`) selecting every changed case and the SAMPLE_GROUPS' cases,
    and no other: items that match no other case, the ones covering the most changed cases
    first, then the ids of changed cases no such item covers (a -k of hundreds of ids takes
    minutes to match)."""
    from bundlegen.harness.selection import term_matches
    want = [c for c in cases if changed(c)]
    unwanted = [c for c in cases if not changed(c) and not any(term_matches(c, g) for g in SAMPLE_GROUPS)]
    # items that match (as a substring or a glob, as -k matches them) no unwanted case
    exclusive = sorted(i for i in {i for c in want for i in c.items}
                       if not any(term_matches(c, i) for c in unwanted))
    terms: list[str] = []
    left = list(want)
    while left:
        best = max(exclusive, key=lambda i: sum(i in c.items for c in left), default=None)
        if best is None or not any(best in c.items for c in left):
            break
        terms.append(best)
        left = [c for c in left if best not in c.items]
    terms += sorted(c.id for c in left)
    return terms + list(SAMPLE_GROUPS)


def selected_cases(cases, terms: list[str]) -> list:
    from bundlegen.harness.selection import selection
    pred = selection(" or ".join(terms))
    return [c for c in cases if pred(c)]


def levels_command(args, terms: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "bundlegen", "run", "--level", LEVEL, "--engine", "triton",
           "--device", args.device, "--workers-per-device", str(args.workers), "-k", " or ".join(terms),
           "--out", str(args.out / "levels"), "--timeout", str(args.case_timeout_s), "-q"]
    return cmd + (["--mps"] if args.mps else [])


def speed_command(args) -> list[str]:
    cases = list(SPEED_CASES)
    if args.device == "cpu":   # the interpreter: one row of each kind of change
        cases = ["d128-bias", "d64-drop-drawn"]
    return [sys.executable, str(REPO_ROOT / "bench" / "speed_batch.py"), "--device", args.device,
            "--budget-s", str(args.speed_s), "--out", str(args.out / "speed_batch.json"),
            "--cases", *cases, "--candidates", *SPEED_CANDIDATES]


def run_step(name: str, cmd: list[str], limit_s: float, log: Path, record: dict, out: Path) -> int:
    """Run cmd (its own process group, output to log) for at most limit_s seconds; record its
    exit status and seconds in OUT/device_check.json. 124: stopped at the limit."""
    started = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = 124
    record["steps"][name] = {"command": cmd, "exit": rc, "seconds": round(time.monotonic() - started, 1),
                             "log": str(log)}
    write_record(record, out)
    print(f"{name}: exit {rc} in {record['steps'][name]['seconds']} s (log {log})", flush=True)
    return rc


def write_record(record: dict, out: Path) -> None:
    path = out / "device_check.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (the device call) or cpu (smoke test)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default $OUT, else out/device_check)")
    parser.add_argument("--levels-s", type=float, default=230.0, help="seconds the levels step may take")
    parser.add_argument("--speed-s", type=float, default=240.0, help="seconds the speed step may take")
    parser.add_argument("--workers", type=int, default=4, help="--workers-per-device of the levels step")
    parser.add_argument("--mps", action="store_true", help="the levels step's workers through MPS")
    parser.add_argument("--case-timeout-s", type=int, default=120)
    parser.add_argument("--max-cases", type=int, default=None,
                        help="select at most this many changed cases (a CPU smoke test)")
    parser.add_argument("--skip", choices=("levels", "speed"), action="append", default=[],
                        help="leave a step out")
    parser.add_argument("--dry-run", action="store_true", help="print the selection and commands only")
    args = parser.parse_args(argv)
    if args.device not in ("cuda", "cpu") and not args.device.startswith("cuda:"):
        parser.error(f"--device {args.device!r}: expected cuda, cuda:N or cpu")
    for name in ("levels_s", "speed_s"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.max_cases is not None and args.max_cases < 1:
        parser.error("--max-cases must be 1 or more")
    args.out = (args.out or Path(os.environ.get("OUT") or REPO_ROOT / "out" / "device_check")).resolve()
    return args


def plan(args) -> tuple[list[str], int, int]:
    """(-k terms, changed cases selected, cases selected) of the levels step."""
    from bundlegen.harness.bundles import load_level
    cases = load_level(REPO_ROOT / "bundles", LEVEL).cases
    if args.max_cases is not None:   # the first changed cases by id, nothing else
        terms = sorted(c.id for c in cases if changed(c))[:args.max_cases]
    else:
        terms = selection_terms(cases)
    picked = selected_cases(cases, terms)
    return terms, sum(changed(c) for c in picked), len(picked)


def main(argv=None) -> int:
    args = parse_args(argv)
    terms, n_changed, n_picked = plan(args)
    steps = {"levels": (levels_command(args, terms), args.levels_s),
             "speed": (speed_command(args), args.speed_s)}
    steps = {k: v for k, v in steps.items() if k not in args.skip}
    print(f"levels step: {n_picked} cases of {LEVEL} (quick included), {n_changed} with dropout or a score "
          f"modifier; -k has {len(terms)} terms", flush=True)
    if args.dry_run:
        for name, (cmd, limit) in steps.items():
            shown = [a if len(a) < 200 else a[:200] + f"... ({len(a)} chars)" for a in cmd]
            print(f"{name} (at most {limit:g} s): {' '.join(shown)}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"device": args.device, "selected_cases": n_picked, "changed_cases": n_changed, "terms": terms,
              "steps": {}}
    write_record(record, args.out)
    rcs = [run_step(name, cmd, limit, args.out / f"{name if name != 'speed' else 'speed_batch'}.log", record,
                    args.out) for name, (cmd, limit) in steps.items()]
    return 0 if rcs and all(rc == 0 for rc in rcs) else 1


if __name__ == "__main__":
    sys.exit(main())
