"""A real GPU fault under `--mps`, on the local GPU: does a fault in one worker cost only its
own case?

Under MPS a fatal fault in one client (here a device-side assert: an index out of range)
ends the work of every client of that GPU, and the server does not say whose it was. The
run holds back every case that crashed beside other workers and runs it again with one
worker alone (harness.executor.rerun_alone). This script writes a bundle of small cases, one
of which faults, and runs it with N workers sharing the GPU, without and with --mps,
side by side; it prints each run's verdicts and exits 1 unless, in both, the faulting case
is the only one that is not a pass.

    python bench/mps_fault_check.py --workers 4 --cases 48
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests import harness_support as S  # noqa: E402

FAULT_S_Q = S.BAD_S_Q


class FaultsOnTheGpu(S.TorchMathEngine):
    """torch-math that, on S_q 5, indexes a GPU tensor out of range (a device-side assert,
    fatal for its CUDA context) after a short wait, so that its neighbours are mid-case."""
    name = "faults-on-the-gpu"

    def run(self, graph, tensors):
        import torch

        if graph.S_q == FAULT_S_Q:
            time.sleep(0.2)
            x = torch.zeros(4, device=self.device)
            x[torch.tensor([1 << 20], device=self.device)] = 1.0
            torch.cuda.synchronize(self.device)
        time.sleep(0.05)
        super().run(graph, tensors)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--cases", type=int, default=48)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("mps_fault_check: no CUDA device here; it faults a GPU on purpose", file=sys.stderr)
        return 2
    from bundlegen.harness.results import read_results, read_run_times
    from bundlegen.harness.level import run_level

    faulty = S.case_of(1, S_q=FAULT_S_Q)
    cases = [S.case_of(n) for n in range(10, 10 + args.cases - 1)]
    cases.insert(len(cases) // 3, faulty)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        S.write_bundle(root / "bundles", "quick", "fault", cases)
        for mps in (False, True):
            out = root / f"out-{'mps' if mps else 'plain'}"
            start = time.perf_counter()
            run_level("quick", "bench.mps_fault_check:FaultsOnTheGpu",
                      device=args.device, workers_per_device=args.workers, bundles=root / "bundles",
                      out=out, config=S.LOOSE, repeat=1, timeout_s=120, mps=mps, server=False)
            elapsed = time.perf_counter() - start
            got = {r["case_id"]: r for r in read_results(out / "results.jsonl")}
            times = read_run_times(out)
            counts = collections.Counter(r["verdict"] for r in got.values())
            others = [r for cid, r in got.items() if cid != faulty.id and r["verdict"] != "pass"]
            right = (len(got) == len(cases) and got[faulty.id]["verdict"] == "crashed" and not others)
            ok &= right
            print(f"{'--mps' if mps else 'no mps'}: {args.workers} workers, {len(cases)} cases, "
                  f"{elapsed:.1f} s: {dict(sorted(counts.items()))}; faulting case "
                  f"{got[faulty.id]['verdict']}; others not passing {len(others)}; re-run alone "
                  f"{times.mps_reruns}; {'as it should be' if right else 'WRONG'}", flush=True)
            print(f"  faulting case: {' '.join(str(got[faulty.id]['detail']).split())[:240]}")
            for r in others[:5]:
                print(f"  other: {r['case_id']} {r['verdict']} {' '.join(str(r['detail']).split())[:200]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
