"""harness/workers/gpu_early.py: which worker opens its CUDA context beside import torch (the gain
itself is measured on a GPU: bench/worker_start.py --no-early-context)."""
from bundlegen.harness.workers import gpu_early


def test_the_ordinal_follows_the_worker_device():
    assert gpu_early.device_ordinal("cuda") == 0
    assert gpu_early.device_ordinal("cuda:3") == 3
    for other in ("cpu", "mps", "xpu:1"):
        assert gpu_early.device_ordinal(other) is None


def test_no_thread_for_other_devices_or_when_switched_off(monkeypatch):
    assert gpu_early.open_in_background("cpu") is None
    monkeypatch.setenv(gpu_early.SWITCH, "0")
    assert gpu_early.open_in_background("cuda:0") is None


def test_a_cuda_worker_gets_the_thread_and_it_ends(monkeypatch):
    """Where libcuda is missing (or finds no GPU) the thread gives up quietly: torch meets
    the same and reports it as it would have."""
    monkeypatch.delenv(gpu_early.SWITCH, raising=False)
    thread = gpu_early.open_in_background("cuda:0")
    assert thread is not None and thread.daemon
    thread.join(60)
    assert not thread.is_alive()
