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

`--speed-profile` runs two other steps instead, on one new Triton cache, within --total-s:
the four levels' prepare from that empty cache (bench/cold_start.py: OUT/cold_start.json),
then speed_batch over PROFILE_CASES, the rows whose targets were not met, each with its
launch-by-launch profile and bound (bench/kernel_profile.py) and the best configuration of
its candidates (OUT/speed_batch.json); a compact summary is printed at the end.

    python bench/device_check.py                       # the device call (about 8 minutes at most)
    python bench/device_check.py --dry-run             # the selection and the commands, nothing run
    python bench/device_check.py --device cpu --max-cases 2 --levels-s 300 --speed-s 200   # CPU smoke
    timeout 540 python bench/device_check.py --speed-profile   # cold start + profiled rows (about 9 minutes)
    python bench/device_check.py --speed-profile --dry-run     # its commands, rows and candidates
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
#: --speed-profile: the rows whose targets were not met on the last device call (triton /
#: torch-cudnn under 0.9 at the headline and under 0.85 in table 2; under FlexAttention with
#: a bias, dBias, ALiBi slopes; D 64 causal dropout with the mask port slower than the tiles
#: it replaced), each profiled launch by launch, with the candidates around its config
PROFILE_CASES = ("d128-full", "d128-causal", "d128-bias-dbias", "d128-bias", "d128-alibi",
                 "d64-causal-drop-port", "d64-full", "d64-causal", "d128-gqa-full", "d64-bias")
#: candidates of those rows left out, each decided on the CPU (`--speed-profile --dry-run
#: --resources`: sm90 registers and spills, speed_batch.drop_lines) or already known
PROFILE_DROPPED = {
    "dkdv 128x128 w8 s2": "424 bytes spilled on sm90, the table's dK/dV kernel none",
    "dkdv 32x128 w4 s3": "840 bytes spilled on sm90",
    "previous mods dkdv": "192 bytes spilled (600-712 with ALiBi slopes, the table's 120); timed "
                          "against the table by the call that chose it",
    "mods dkdv 64x64 w4 s3": "192 bytes spilled on sm90 (600 with ALiBi slopes)",
    "mods dkdv 64x128 w8 s2": "192 bytes spilled on sm90 (712 with ALiBi slopes)",
    "mods dkdv 32x64 w4 s3": "the modifiers' table tiles themselves",
}


def profile_candidates() -> list[str]:
    """The labels of every candidate of PROFILE_CASES but PROFILE_DROPPED (as --candidates
    globs: a label matches itself)."""
    from bench.speed_batch import CANDIDATES
    return [c.label for c in CANDIDATES if set(c.cases) & set(PROFILE_CASES) and c.label not in PROFILE_DROPPED]


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


def speed_command(args, budget_s: float | None = None) -> list[str]:
    cases, globs = (PROFILE_CASES, profile_candidates()) if args.speed_profile else (SPEED_CASES, SPEED_CANDIDATES)
    if args.device == "cpu":   # the interpreter: one row of each kind of change
        cases = ["d128-bias", "d64-drop-drawn"] if not args.speed_profile else ["d128-bias-dbias"]
    return [sys.executable, str(REPO_ROOT / "bench" / "speed_batch.py"), "--device", args.device,
            "--budget-s", f"{budget_s or args.speed_s:g}", "--out", str(args.out / "speed_batch.json"),
            "--cases", *cases, "--candidates", *globs]


def cold_command(args) -> list[str]:
    """The four levels' prepare from an empty Triton cache (bench/cold_start.py); the cache
    it fills (TRITON_CACHE_DIR of both steps) then serves the speed step."""
    return [sys.executable, str(REPO_ROOT / "bench" / "cold_start.py"), "--device", args.device,
            "--cache-dir", str(args.cache_dir), "--out", str(args.out / "cold_start.json")]


def run_step(name: str, cmd: list[str], limit_s: float, log: Path, record: dict, out: Path,
             env: dict | None = None) -> int:
    """Run cmd (its own process group, output to log, `env` added to this process's) for at
    most limit_s seconds; record its exit status and seconds in OUT/device_check.json. 124:
    stopped at the limit."""
    started = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                start_new_session=True, env={**os.environ, **(env or {})})
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
    parser.add_argument("--speed-profile", action="store_true",
                        help="instead of the two steps above: the four levels' prepare from an empty Triton "
                             "cache (bench/cold_start.py), then speed_batch over PROFILE_CASES with each row's "
                             "launch-by-launch profile, within --total-s")
    parser.add_argument("--total-s", type=float, default=520.0,
                        help="--speed-profile: seconds both steps may take together (the speed step gets "
                             "what the cold start leaves)")
    parser.add_argument("--cold-s", type=float, default=150.0, help="--speed-profile: seconds the cold start may take")
    parser.add_argument("--resources", action="store_true",
                        help="--speed-profile --dry-run: compile the rows' table configs and candidates for "
                             "sm90 on the CPU (speed_batch --resources: registers, spills, the candidates to drop)")
    args = parser.parse_args(argv)
    if args.device not in ("cuda", "cpu") and not args.device.startswith("cuda:"):
        parser.error(f"--device {args.device!r}: expected cuda, cuda:N or cpu")
    for name in ("levels_s", "speed_s", "total_s", "cold_s"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.max_cases is not None and args.max_cases < 1:
        parser.error("--max-cases must be 1 or more")
    if args.speed_profile and args.total_s <= args.cold_s + SPEED_FLOOR_S:
        parser.error(f"--total-s {args.total_s:g} leaves the speed step under {SPEED_FLOOR_S:g} s "
                     f"after --cold-s {args.cold_s:g}")
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


#: --speed-profile: the least the speed step is given, and the seconds it may run past its
#: budget (speed_batch ends itself at its budget; this bounds its exit)
SPEED_FLOOR_S = 60.0
SPEED_GRACE_S = 10.0


def speed_profile(args) -> int:
    """The cold start, then the speed batch with profiles in what is left of --total-s; both
    on one new Triton cache (outside --out: it is not a result). Exit 0 when both exit 0."""
    import tempfile
    started = time.monotonic()
    cache = None if args.dry_run else Path(tempfile.mkdtemp(prefix="bundlegen-device-check-triton-"))
    args.cache_dir = cache or "(a new empty folder)"
    print(f"cold (at most {args.cold_s:g} s): {' '.join(map(str, cold_command(args)))}", flush=True)
    least = args.total_s - args.cold_s - SPEED_GRACE_S   # its budget when the cold start takes all it may
    print(f"speed (what is left of {args.total_s:g} s; at least {least:g}): "
          f"{' '.join(speed_command(args, least))}", flush=True)
    if args.dry_run:   # the plan; with --resources also each candidate compiled for sm90 here
        listing = [*speed_command(args, least)[1:], "--resources" if args.resources else "--list"]
        return subprocess.run([sys.executable, *listing], cwd=REPO_ROOT).returncode
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"device": args.device, "mode": "speed-profile", "triton_cache": str(cache), "steps": {}}
    write_record(record, args.out)
    env = {"TRITON_CACHE_DIR": str(cache)}
    rcs = [run_step("cold", cold_command(args), args.cold_s, args.out / "cold_start.log", record, args.out, env)]
    left = args.total_s - (time.monotonic() - started) - SPEED_GRACE_S
    rcs.append(run_step("speed", speed_command(args, left), left + SPEED_GRACE_S, args.out / "speed_batch.log",
                        record, args.out, env))
    print("\n".join(profile_summary(args.out)), flush=True)
    return 0 if all(rc == 0 for rc in rcs) else 1


def profile_summary(out: Path) -> list[str]:
    """The compact end of a --speed-profile call: the cold start, then per row its ratios,
    its bound and its best configuration (from the steps' JSON, whatever they wrote)."""
    lines = []
    cold = _read(out / "cold_start.json")
    if cold:
        lines.append(f"cold start: {cold.get('total_s')} s (prepare {cold.get('prepare_s')} s, {cold.get('jobs')} "
                     f"processes; target {cold.get('target_s')} s met: {cold.get('met')})")
    speed = _read(out / "speed_batch.json") or {}
    for name, row in speed.get("rows", {}).items():
        ratio = " ".join(f"/{p} {r:.2f}" for p, r in row.get("ratios", {}).items())
        lines.append(f"{name}: {row.get('error') or ratio}")
        prof = speed.get("profiles", {}).get(name, {})
        if prof:
            split = ", ".join(f"{p['kernel']} {100 * (p['share'] or 0):.0f} %" for p in prof.get("launches", []))
            lines.append(f"  split: {split or prof.get('error')}; bound: {prof.get('bound')}")
        for kernel, b in sorted(speed.get("best", {}).get(name, {}).items()):
            lines.append(f"  best {kernel}: {b['label']} {b['describe']} {b['ms']:.3f} ms")
    return lines


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.speed_profile:
        return speed_profile(args)
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
