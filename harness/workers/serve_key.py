"""What makes a served worker's results valid (`bundlegen serve`): the engine spec, the
devices, the workers per device, the code the worker runs and the environment it reads.
A run uses a server only when its own key is the same, so a code change, another Triton
mode or another device list never reuses a stale worker: the key's digest names the
server's socket, and the server compares the whole key again when a run says hello."""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from bundlegen.engines.registry import BUILTIN, ENTRY_POINT_GROUP
from bundlegen.workspace import find_workspace

# importlib.metadata is imported only where a key is made: every run imports this module
# (may_be_served), and most runs find no server, so they never pay for it.

#: the packages whose code a worker runs (and the harness around it)
CODE_PACKAGES = ("bundlegen", "bundlegen.plans", "bundlegen.generator", "bundlegen.harness",
                 "bundlegen.claims", "bundlegen.mutants", "bundlegen.engines")
#: environment variables a worker's results may depend on: these prefixes, and these names
ENV_PREFIXES = ("TRITON_", "TORCH", "PYTORCH_", "CUDA_", "CUBLAS_", "CUDNN_", "NCCL_", "NVIDIA_",
                "BUNDLEGEN_", "OMP_", "MKL_", "KMP_")
ENV_NAMES = ("PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD")
#: a Unix socket path longer than this does not bind (108 bytes on Linux, less elsewhere)
MAX_SOCKET_PATH = 100
SERVE_DIR = ".bundlegen"


@dataclass(frozen=True)
class ServeKey:
    engine: str                    # --engine as given
    devices: tuple[str, ...]
    workers_per_device: int
    code: str                      # sha256 of bundlegen's code and the engine's package
    env: tuple[tuple[str, str], ...]
    python: str                    # the interpreter, and the versions of torch and triton
    workspace: str                 # the workspace (or folder) the engine is resolved from
    mps: bool = False              # the workers are clients of the server's own MPS server (--mps)

    @property
    def digest(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def difference(self, other: "ServeKey") -> str | None:
        """The first field that differs, as a phrase; None when the keys are the same."""
        for name in ("engine", "devices", "workers_per_device", "mps", "code", "env", "python", "workspace"):
            if getattr(self, name) != getattr(other, name):
                return f"its {name.replace('_', ' ')} differs"
        return None


def serve_key(engine: str, devices: list[str] | tuple[str, ...], workers_per_device: int,
              mps: bool = False) -> ServeKey:
    where = _where()
    return ServeKey(engine=engine, devices=tuple(devices), workers_per_device=workers_per_device,
                    code=code_digest(engine, where), env=relevant_env(),
                    python=_python(), workspace=str(where), mps=mps)


def relevant_env() -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in os.environ.items()
                        if k.startswith(ENV_PREFIXES) or k in ENV_NAMES))


def code_digest(engine: str, where: Path) -> str:
    """sha256 over every .py file of bundlegen's packages and of the engine's top-level
    package (when it lives outside bundlegen), by path and content."""
    h = hashlib.sha256()
    folders = [loc for name in CODE_PACKAGES
               for loc in (importlib.util.find_spec(name).submodule_search_locations or ())]
    folders += engine_package_folders(engine, where)
    for folder in dict.fromkeys(str(Path(f).resolve()) for f in folders):
        for path in sorted(Path(folder).rglob("*.py")):
            h.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def engine_package_folders(engine: str, where: Path) -> list[str]:
    """The folders of the engine's top-level package (or its module file) when the engine
    is `package.module:Class` or an entry point outside bundlegen; [] for a built-in one."""
    module = engine.partition(":")[0] if ":" in engine else _entry_point_module(engine)
    if not module:
        return []
    top = module.split(".")[0]
    if top == "bundlegen":
        return []
    # where the worker will find it: sys.path, then the folder and workspace (engines.registry)
    spec = importlib.machinery.PathFinder.find_spec(top, [*sys.path, str(Path.cwd()), str(where)])
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)
    return [str(Path(spec.origin).parent)] if spec.origin else []   # a lone module: its folder


def _entry_point_module(name: str) -> str | None:
    from importlib import metadata   # only with a key to make: see the top of this module

    if name in BUILTIN:
        return None
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.module
    return None


def _python() -> str:
    from importlib import metadata   # only with a key to make: see the top of this module

    parts = [sys.executable, sys.version.split()[0]]
    for dist in ("torch", "triton"):
        try:
            parts.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    return "; ".join(parts)


def _where() -> Path:
    workspace = find_workspace()
    return workspace.root if workspace is not None else Path.cwd().resolve()


def serve_dir(where: Path | None = None) -> Path:
    """Where servers keep their sockets: <workspace>/.bundlegen (outside a workspace, this
    folder's); a per-user temporary folder when that path is too long for a socket."""
    where = _where() if where is None else where
    # resolved here, once: no part of the path used afterwards may be a link (workers.serve_trust)
    folder = Path(os.path.realpath(where)) / SERVE_DIR
    if len(str(folder)) + 60 <= MAX_SOCKET_PATH:
        return folder
    tag = hashlib.sha256(str(where).encode()).hexdigest()[:12]
    return Path(os.path.realpath(tempfile.gettempdir())) / f"bundlegen-{os.getuid()}" / tag


def socket_path(key: ServeKey) -> Path:
    return serve_dir(Path(key.workspace)) / f"serve-{_label(key.engine)}-{key.digest}.sock"


def may_be_served(engine: str) -> bool:
    """Whether a server of `engine` may be here: a socket of its name in serve_dir. When
    there is none, a run need not make its key (serve_key hashes all of bundlegen's code,
    which would delay the start of the run's own workers)."""
    folder = serve_dir(_where())
    return folder.is_dir() and any(folder.glob(f"serve-{_label(engine)}-*.sock"))


def _label(engine: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", engine.rsplit(":", 1)[-1].lower()).strip("-")[:24] or "engine"
