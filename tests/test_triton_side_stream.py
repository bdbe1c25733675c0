"""launch.run on a GPU: the dQ kernel (and a second dK/dV pass) on a side stream beside the
first dK/dV pass, ordered after the preprocess kernel and before everything the current
stream does next. No GPU here: the streams are stand-ins that log each wait and switch,
and the kernel launches are stand-ins that log where they ran."""
from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from bundlegen.engines.triton import launch


class _Stream:
    def __init__(self, name: str, log: list):
        self.name, self.log, self.device = name, log, torch.device("cuda", 0)

    def wait_stream(self, other: "_Stream") -> None:
        self.log.append(f"{self.name} waits for {other.name}")


@pytest.fixture
def streams(monkeypatch):
    """(log, main, side): torch.cuda's current stream is `main`, `torch.cuda.stream(s)` makes
    `s` current; every launch stand-in logs the stream it ran on."""
    log: list[str] = []
    main, side = _Stream("main", log), _Stream("side", log)
    current = [main]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[-1])

    @contextmanager
    def on(stream):
        current.append(stream)
        try:
            yield
        finally:
            current.pop()

    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(launch, "side_stream", lambda device: side)

    def kernel(name):
        return lambda L, *args, **kwargs: log.append(f"{name}{kwargs.get('only') or ''} on {current[-1].name}")

    for name in ("preprocess", "dkdv", "dq", "dbias", "dsinks"):
        monkeypatch.setattr(launch, f"run_{name}", kernel(name))
    return log, main, side


def _launch(passes: int, atomic: bool = False):
    graph = SimpleNamespace(H_k=2, H_v=2 if passes == 1 else 1)
    return SimpleNamespace(graph=graph, cfg=SimpleNamespace(split_dkdv=False),
                           delta=SimpleNamespace(device=torch.device("cuda", 0)),
                           dq_scratch=object() if atomic else None)


def test_the_dq_kernel_runs_beside_the_one_dkdv_pass(streams):
    log, _, _ = streams
    launch.run(_launch(passes=1))
    assert log == ["preprocess on main", "side waits for main", "dkdv on main", "dq on side",
                   "main waits for side", "dbias on main", "dsinks on main"]


def test_with_two_dkdv_passes_the_dv_pass_and_dq_run_beside_the_dk_pass(streams):
    log, _, _ = streams
    launch.run(_launch(passes=2))
    assert log == ["preprocess on main", "side waits for main", "dkdvdk on main", "dkdvdv on side",
                   "dq on side", "main waits for side", "dbias on main", "dsinks on main"]


@pytest.mark.parametrize("atomic, overlap", [(True, True), (False, False)])
def test_atomic_dq_and_overlap_off_keep_one_stream(streams, atomic, overlap):
    log, _, _ = streams
    launch.run(_launch(passes=1, atomic=atomic), overlap=overlap)
    assert log == ["preprocess on main", "dkdv on main", "dq on main", "dbias on main", "dsinks on main"]


def test_off_the_gpu_there_is_no_side_stream():
    assert launch.side_stream(torch.device("cpu")) is None
