"""`bundlegen serve`: start warm workers for later `bundlegen run`s (workers.serve), or stop
this workspace's servers."""
from __future__ import annotations

import argparse

from bundlegen.harness.workers import pycache

# the rest is imported in main, after the bytecode prefix is set (workers.pycache), and so
# that `bundlegen --help` (which imports every command module) stays light


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", default=None, help="engine name or package.module:Class (as `run` gets it)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available, else cpu)")
    parser.add_argument("--devices", default=None, metavar="LIST", help="several devices, as `run --devices`")
    parser.add_argument("--workers-per-device", type=int, default=1, metavar="N",
                        help="worker processes per device, as `run --workers-per-device` (default 1)")
    parser.add_argument("--mps", action="store_true",
                        help="the GPU workers are clients of a private CUDA MPS server, as `run --mps`")
    parser.add_argument("--idle-timeout", type=float, default=None, metavar="S",
                        help="exit after S seconds without a run (default 900)")
    parser.add_argument("--stop", action="store_true",
                        help="stop every server of this workspace (each after the run it is serving)")


def main(args: argparse.Namespace) -> int:
    # bytecode kept as a worker keeps it (workers.pycache), before the harness is imported
    pycache.keep_bytecode_in_this_process()
    from rich.console import Console

    from bundlegen.engines.registry import EngineNotFound, registered_name
    from bundlegen.harness import verdicts as V
    from bundlegen.harness.workers.devices import DEVICE_RE, DeviceUnavailable, default_device, resolve_devices
    from bundlegen.harness.workers.mps import MpsError
    from bundlegen.harness.workers.serve import DEFAULT_IDLE_TIMEOUT_S, Server, ServeError
    from bundlegen.harness.workers.serve_client import stop_servers
    from bundlegen.harness.workers.serve_key import serve_dir, serve_key
    from bundlegen.harness.workers.worker import WorkerStartError

    err = Console(stderr=True, soft_wrap=True)
    if args.stop:
        stopped = stop_servers()
        for info in stopped:
            print(f"stopping bundlegen serve pid {info['pid']} ({info['socket']})"
                  + (" after the run it is serving" if info["busy"] else ""), flush=True)
        if not stopped:
            print(f"no bundlegen serve answers in {serve_dir()}")
        return V.EXIT_OK
    try:
        if args.engine is None:
            raise ValueError("--engine is required (or --stop)")
        registered_name(args.engine)
        if args.device is not None and args.devices is not None:
            raise ValueError("give --device or --devices, not both")
        if args.device is not None and not DEVICE_RE.fullmatch(args.device):
            raise ValueError(f"--device {args.device}: expected cpu, cuda or cuda:N")
        if args.workers_per_device < 1:
            raise ValueError(f"--workers-per-device {args.workers_per_device}: expected 1 or more")
        devices = resolve_devices(args.devices) if args.devices else [args.device or default_device()]
        idle = DEFAULT_IDLE_TIMEOUT_S if args.idle_timeout is None else args.idle_timeout
        if idle <= 0:
            raise ValueError(f"--idle-timeout {args.idle_timeout}: expected seconds above 0")
        server = Server(serve_key(args.engine, devices, args.workers_per_device, mps=args.mps), idle)
        server.start_workers()
    except (EngineNotFound, WorkerStartError, DeviceUnavailable, ValueError, MpsError) as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        return V.EXIT_USAGE
    try:
        try:
            server.listen()
            print(f"bundlegen serve: {len(server.runners)} worker(s) of {args.engine} on "
                  f"{','.join(devices)} ready; listening on {server.path} (pid {server.info()['pid']}, "
                  f"exits after {idle:g} s idle or on bundlegen serve --stop)", flush=True)
            server.serve_forever()
        except ServeError as exc:
            err.print(f"[red]error:[/red] {exc}", highlight=False)
            return V.EXIT_USAGE
        except KeyboardInterrupt:
            pass
    finally:
        server.close()
    print(f"bundlegen serve: stopped after {server.runs} run(s)", flush=True)
    return V.EXIT_OK
