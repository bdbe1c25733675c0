"""The devices a run's workers use: what --device and --devices name, whether this machine
has them, and each worker's device and per-case timeout."""
from __future__ import annotations

import re
from typing import Sequence

from bundlegen.harness.case import device_type

#: what --device names (and each device of --devices)
DEVICE_RE = re.compile(r"cpu|mps|(cuda|xpu)(:\d+)?")

# torch is imported inside the functions that ask it: a run's parent process must not pay
# for its import before its workers are started.


class DeviceUnavailable(RuntimeError):
    """--device names a device this machine does not have."""


def check_device(device: str) -> None:
    """DeviceUnavailable (its message names the device, not the option) when this machine
    lacks `device`."""
    import torch

    kind = torch.device(device)
    if kind.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise DeviceUnavailable(f"{device}: no GPU is visible to torch "
                                    f"(torch {torch.__version__}); use cpu")
        if kind.index is not None and kind.index >= count:
            raise DeviceUnavailable(f"{device}: only {count} GPU(s) are visible")


def default_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_timeout(device: str) -> float:
    return 600.0 if device_type(device) == "cpu" else 300.0


def device_list(text: str) -> list[str] | None:
    """--devices as written: None for 'all', else the comma-separated devices (a device may
    repeat: 'cpu,cpu' runs two CPU workers); ValueError when malformed."""
    if text.strip() == "all":
        return None
    devices = [d.strip() for d in text.split(",")]
    if not all(DEVICE_RE.fullmatch(d) for d in devices):
        raise ValueError(f"--devices {text}: expected all, or devices such as cuda:0,cuda:1")
    return devices


def resolve_devices(text: str) -> list[str]:
    """--devices: the devices it names; 'all' is every visible CUDA device
    (DeviceUnavailable when there is none)."""
    devices = device_list(text)
    if devices is not None:
        return devices
    import torch
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise DeviceUnavailable(f"--devices all: no GPU is visible to torch (torch {torch.__version__})")
    return [f"cuda:{i}" for i in range(count)]


def worker_devices(devices: Sequence[str], per_device: int) -> list[str]:
    """One entry per worker process: each device `per_device` times, interleaved
    (cuda:0,cuda:1 x2 -> cuda:0,cuda:1,cuda:0,cuda:1), so the longest cases, handed out
    first, spread over the devices before they double up on one."""
    return [dev for _ in range(per_device) for dev in devices]
