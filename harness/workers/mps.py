"""A private CUDA MPS server for one run's (or one `bundlegen serve`'s) GPU workers (`--mps`).

Without MPS the GPU time-slices between the worker processes' contexts, so workers past
about four per GPU add no throughput: each case launches a few hundred small kernels and the
context switches between them are the bottleneck. Under MPS the workers' kernels share one
context and run side by side. The control daemon here is private: its pipe and log folders
are a fresh temporary folder handed to the workers alone (CUDA_MPS_PIPE_DIRECTORY,
CUDA_MPS_LOG_DIRECTORY), so no other process on the host becomes its client, and it is told
to quit when the workers have been told to stop (it stops once they have exited).

One cost: a fatal GPU fault in one client ends the work of every client of that GPU, and
the server does not say whose fault it was. The harness therefore runs each case that
crashed beside others again with one worker alone and records that result
(`level.run_level`, with `executor.rerun_alone`).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
#: seconds the control program gets to start the daemon, or to stop it once the workers are gone
CONTROL_TIMEOUT_S = 30.0
#: where CUDA finds an MPS server: this variable's folder, else the default one
PIPE_VARIABLE = "CUDA_MPS_PIPE_DIRECTORY"
DEFAULT_PIPE = Path("/tmp/nvidia-mps")


class MpsError(RuntimeError):
    """The MPS control daemon could not be started."""


@dataclass(frozen=True)
class MpsDaemon:
    control: str      # the control program's path
    root: Path        # the private folder: pipe/ and log/

    @property
    def env(self) -> dict[str, str]:
        """What a worker needs in its environment to be a client of this daemon's server."""
        return {PIPE_VARIABLE: str(self.root / "pipe"),
                "CUDA_MPS_LOG_DIRECTORY": str(self.root / "log")}

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of the daemon's and its server's logs (for an error message)."""
        text = []
        for name in ("control.log", "server.log"):
            path = self.root / "log" / name
            if path.exists():
                text += [f"{name}: {line}" for line in path.read_text(errors="replace").splitlines()[-lines:]]
        return "\n".join(text)

    def stop(self, wait: bool = True) -> None:
        """Ask the daemon to quit (it stops its server once the clients are gone), then
        remove the private folder. The quit returns only when every client has exited
        (bench/worker_exit.py times it);
        `wait` False leaves both steps to a process in a session of its own, which outlives
        this one, and returns at once."""
        try:
            stopper = subprocess.Popen(
                [sys.executable, "-c", _STOP_SCRIPT, self.control, str(self.root), str(CONTROL_TIMEOUT_S)],
                env={**os.environ, **self.env}, start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        if wait:
            stopper.wait()


#: MpsDaemon.stop's two steps, run by a Python of their own: control program, folder, timeout
_STOP_SCRIPT = """
import shutil, subprocess, sys
control, root, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
try:
    subprocess.run([control], input="quit\\n", text=True, capture_output=True, timeout=timeout)
except (OSError, subprocess.TimeoutExpired):
    pass
shutil.rmtree(root, ignore_errors=True)
"""


def mps_devices_problem(devices: list[str] | tuple[str, ...]) -> str | None:
    """Why --mps cannot serve these worker devices, else None."""
    others = [d for d in devices if not d.startswith("cuda")]
    if others:
        return f"--mps: MPS shares a GPU between processes; {', '.join(dict.fromkeys(others))} is not a GPU"
    return None


def may_be_client(env: dict[str, str]) -> bool:
    """Whether a process with this environment may be a client of an MPS server: it names a
    server's pipe folder (a run's --mps), or the host's default one exists (a server for the
    whole host)."""
    return PIPE_VARIABLE in env or (DEFAULT_PIPE / "control").exists()


def start_mps(devices: list[str] | tuple[str, ...]) -> MpsDaemon:
    """Start a private MPS control daemon for workers on `devices`; ValueError for devices
    that are not GPUs, MpsError when the daemon cannot be started."""
    problem = mps_devices_problem(devices)
    if problem:
        raise ValueError(problem)
    control = shutil.which(CONTROL)
    if control is None:
        raise MpsError(f"--mps: {CONTROL} is not on PATH (it comes with the NVIDIA driver)")
    root = Path(tempfile.mkdtemp(prefix="bundlegen-mps-"))
    daemon = MpsDaemon(control=control, root=root)
    for folder in ("pipe", "log"):
        (root / folder).mkdir()
    try:
        done = subprocess.run([control, "-d"], text=True, capture_output=True,
                              env={**os.environ, **daemon.env}, timeout=CONTROL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        shutil.rmtree(root, ignore_errors=True)
        raise MpsError(f"--mps: {CONTROL} -d did not start: {exc}") from None
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout or "").split()) or daemon.log_tail()
        shutil.rmtree(root, ignore_errors=True)
        raise MpsError(f"--mps: {CONTROL} -d exited {done.returncode}: {said or 'it said nothing'}")
    return daemon
