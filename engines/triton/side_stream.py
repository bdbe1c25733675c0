"""One side CUDA stream per GPU, and running two groups of launches at once on it and the
current stream: the dQ kernel beside the dK/dV passes (launch.run)."""
from __future__ import annotations

from typing import Callable

import torch


_SIDE_STREAMS: dict = {}


def side_stream(device: torch.device) -> "torch.cuda.Stream | None":
    """The side stream of a GPU (one per device and process); None off the GPU."""
    if device.type != "cuda":
        return None
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


def beside(side: "torch.cuda.Stream", here: Callable[[], object],
           there: Callable[[], object]) -> None:
    """`here`'s launches on the current stream and `there`'s on `side`, both after the work
    queued so far; the current stream's later work waits for both. The dQ kernel and the
    dK/dV passes read the same inputs and Delta and write different outputs, so they may run
    at once: the programs of one fill the SMs the other's last wave leaves idle. The Delta
    scratch was allocated on the current stream, whose later work waits for `side`, so the
    allocator cannot hand it out again while `side` still reads it."""
    main = torch.cuda.current_stream(side.device)
    side.wait_stream(main)
    here()
    with torch.cuda.stream(side):
        there()
    main.wait_stream(side)
