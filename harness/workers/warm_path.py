"""The harness's own first-use costs on a GPU, paid in a worker's idle time.

A fresh GPU worker's first case costs several times a later one's: cuBLAS's start for the
float64 oracle, and the kernels torch loads on their first use for the checks
(bench/first_case.py measures it). A worker pays them once, in a thread started as soon as torch is imported (beside the engine's own imports,
its build and prepare), on tiny cases of each I/O dtype run through the harness's real case
path (`case.execute_case`: materialize with the oracle, the checks, the determinism
re-run), with an engine that writes zeros and a tolerance that takes any finite error, so every check runs
to the end. The worker's first case waits for the thread, but its prepare (and a joining
worker's wait for the first one's) does not.

GPU workers only; anything that goes wrong here is met again, and charged, by a real case.
BUNDLEGEN_WARM_PATH=0 turns it off (to compare the two: bench/first_case.py
--no-warm-path).
"""
from __future__ import annotations

import math
import threading

from bundlegen.graph import Case, DataSpec, dense_graph
from bundlegen.harness.case import execute_case
from bundlegen.harness.config import Tolerance
from bundlegen.harness.workers import switches

# torch is imported inside the functions that use it: the harness's own process imports this
# module (through workers.worker) and never needs torch.

#: the environment variable that turns the warm-up off ("0")
SWITCH = "BUNDLEGEN_WARM_PATH"
#: the dtypes warmed: each loads conversion and arithmetic kernels of its own
DTYPES = ("fp16", "bf16", "fp32")


class ZeroEngine:
    """Writes zeros into the outputs: the case path without an engine's kernels (an empty
    Triton cache would have it compile them here, beside prepare)."""
    name = "harness-warm-up"
    deterministic = True

    def __init__(self, device):
        import torch
        self.device = torch.device(device)

    def run(self, graph, tensors) -> None:
        for port in graph.output_ports:
            tensors[port].zero_()


def warm_cases():
    """One tiny case per dtype in DTYPES, as the harness builds cases."""
    return [Case(id=f"warm-up-{dtype}", purpose="claim", items=(),
                 graph=dense_graph(B=1, H_q=2, S_q=32, D_qk=32, dtype=dtype), data=DataSpec(seed=0))
            for dtype in DTYPES]


def warm(device: str) -> list[str]:
    """The case path once per warm case on `device`: the verdicts (each `pass` when every
    check ran to the end), up to the first that raised; never raises."""
    finite_errors = Tolerance(rtol=0.0, atol=math.inf, source="harness warm-up")
    engine = ZeroEngine(device)
    verdicts = []
    for case in warm_cases():
        try:
            verdicts.append(execute_case(case, engine, finite_errors, runs=2).verdict)
        except Exception:  # noqa: BLE001 - a real case meets it again and records it
            break
    return verdicts


def start(device: str) -> threading.Thread | None:
    """warm(device) in a daemon thread, for a GPU worker (None: another device, or off).
    torch and the case path's modules are imported here, in the caller's thread, so that the
    worker's main thread and this one never import the same modules side by side."""
    if not device.startswith("cuda") or switches.turned_off(SWITCH):
        return None
    import torch  # noqa: F401
    from bundlegen.harness import checks, materialize, oracle  # noqa: F401
    thread = threading.Thread(target=warm, args=(device,), name="bundlegen-warm-path", daemon=True)
    thread.start()
    return thread
