"""A GPU worker's CUDA context opened while it imports torch.

A fresh GPU worker spends most of its start importing torch and then in CUDA's start
(cuInit and the device's primary context; bench/worker_start.py times both). The second
needs nothing from the first: a thread calls the driver through ctypes, which lets go
of the interpreter lock for the call, so both go on at once. torch, reaching the device
later, retains the primary context that is already there, and so does every library that
shares it (Triton, cuBLAS): the worker still runs everything in the one context it would
have had.

Only where the device is a CUDA GPU and libcuda loads; anything that goes wrong here is
left for torch to meet and report as it would have. BUNDLEGEN_EARLY_CONTEXT=0 opts out (to
compare the two: bench/worker_start.py --no-early-context).
"""
from __future__ import annotations

import ctypes
import threading

from bundlegen.harness.workers import switches

#: the environment variable that turns the early context off ("0")
SWITCH = "BUNDLEGEN_EARLY_CONTEXT"


def device_ordinal(device: str) -> int | None:
    """The CUDA ordinal a worker for `device` uses ('cuda' is 0, 'cuda:N' is N), None for
    any other device."""
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return None
    return int(index) if index.isdigit() else 0


def open_in_background(device: str) -> threading.Thread | None:
    """Start opening `device`'s primary CUDA context in a daemon thread (None: not a CUDA
    device, or turned off). Nothing waits for the thread: torch's own start meets the
    context, finished or still being made, through the driver's lock."""
    ordinal = device_ordinal(device)
    if ordinal is None or switches.turned_off(SWITCH):
        return None
    thread = threading.Thread(target=_retain_primary_context, args=(ordinal,),
                              name="bundlegen-cuda-context", daemon=True)
    thread.start()
    return thread


def _retain_primary_context(ordinal: int) -> bool:
    """cuInit, then retain the device's primary context (kept for the process's life, as
    torch keeps it); False where any step fails."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    handle, context = ctypes.c_int(), ctypes.c_void_p()
    return (cuda.cuInit(0) == 0
            and cuda.cuDeviceGet(ctypes.byref(handle), ordinal) == 0
            and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), handle) == 0)
