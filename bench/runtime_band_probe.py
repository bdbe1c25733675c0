"""Probe: what would the mask band as run-time values cost the kernels, and what would it save
the compile? Today HAS_LEFT and HAS_RIGHT are constexprs: each band kind (none, left, right,
both) is its own compiled kernel. Passing an absent bound as one past every |j - i - shift|
(launch._bounds' `reach`) makes every band formula hold without the flags, so one kernel
would serve all four kinds, at the price of the band code (and the loops' masked-or-whole
branch) in the kernels of unbanded graphs too.

The probe writes a copy of the kernels with the band code always compiled (every `if HAS_*`
of the dK/dV, dQ and dBias kernels taken, `_keep` checking both bounds) and a copy of the
launcher passing `reach` for an absent bound, and runs them as a peer engine
(`<copy>.engine:RuntimeBandTritonEngine`) beside the engine's own:

    python bench/runtime_band_probe.py --count             # kernels to compile, both ways (CPU)
    python bench/runtime_band_probe.py --check             # the copy's gradients = the engine's
    python bench/runtime_band_probe.py --speed --rounds 5  # GPU: bench/engine_speed.py --quick
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

PACKAGE = "runtime_band_copy"
ENGINE = f"{PACKAGE}.engine:RuntimeBandTritonEngine"
TRITON_DIR = REPO_ROOT / "engines" / "triton"


def _edited(text: str, pattern: str, new: str, at_least: int = 1) -> str:
    out, n = re.subn(pattern, new, text, flags=re.M)
    if n < at_least:
        raise SystemExit(f"runtime_band_probe: {pattern!r} not found: the kernels changed")
    return out


def write_copy(root: Path) -> None:
    """The package PACKAGE under root: kernels.py, launch.py (edited copies) and engine.py."""
    kernels = (TRITON_DIR / "kernels.py").read_text()
    kernels = _edited(kernels, r"^(\s+)if HAS_(LEFT|RIGHT):(\s+#)", r"\1if True:\3", at_least=6)
    kernels = _edited(kernels, r"if HAS_LEFT or HAS_RIGHT:", "if True:")
    kernels = _edited(kernels, r"\bHAS_LEFT, HAS_RIGHT\)", "True, True)", at_least=3)
    launch = (TRITON_DIR / "launch.py").read_text()
    launch = _edited(launch, r"if a\.left_bound is not None else 0$", "if a.left_bound is not None else reach")
    launch = _edited(launch, r"if a\.right_bound is not None else 0$", "if a.right_bound is not None else reach")
    package = root / PACKAGE
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "kernels.py").write_text(kernels)
    (package / "launch.py").write_text(launch)
    (package / "engine.py").write_text(
        "from bundlegen.engines.triton.engine import TritonEngine\n\n\n"
        "class RuntimeBandTritonEngine(TritonEngine):\n"
        "    name = 'triton-runtime-band'\n"
        f"    launch_module = '{PACKAGE}.launch'\n"
        f"    kernels_module = '{PACKAGE}.kernels'\n")
    sys.path.insert(0, str(root))


def count() -> None:
    """Kernels Triton compiles for the four levels on sm90: as today, and with the band
    flags out of the dK/dV, dQ and dBias kernels' specialisation."""
    from bundlegen.engines.triton import warm
    keys, _ = warm.twin_keys(warm.level_graphs(["quick", "pr", "nightly", "full"]), "sm90")
    launches = list(warm.twin_launches(keys, "sm90").values())
    banded = ("bwd_dkdv", "bwd_dq", "bwd_dbias")
    flagless = [(n, a, {k: v for k, v in kw.items()
                        if n not in banded or k not in ("HAS_LEFT", "HAS_RIGHT")})
                for n, a, kw in launches]
    print(f"four levels on sm90: {len(launches)} launches; {len(warm.compile_groups(launches))} "
          f"kernels with the band flags, {len(warm.compile_groups(flagless))} without")


def check() -> int:
    """The copy's gradients against the engine's, on the CPU interpreter, over every band
    kind, both diagonal alignments and ragged tails."""
    import torch

    from bundlegen.engines.registry import engine_class
    from bundlegen.engines.triton.engine import TritonEngine
    from bundlegen.graph import dense_graph
    from bench.engine_speed import empty_as

    ours, copy = TritonEngine("cpu"), engine_class(ENGINE)("cpu")
    worst = 0.0
    for left, right in ((None, None), (None, 0), (24, None), (24, 3)):
        for alignment in ("TOP_LEFT", "BOTTOM_RIGHT"):
            graph = dense_graph(B=1, H_q=2, H_k=1, H_v=1, S_q=70, S_kv=90, D_qk=32, D_v=32,
                                dtype="fp16", left=left, right=right, alignment=alignment)
            torch.manual_seed(0)
            inputs = {p: empty_as(spec, "cpu") for p, spec in graph.tensors.items()}
            for t in inputs.values():   # any O and LSE do: both engines get the same
                t.copy_(torch.randn(t.shape))
            inputs["stats"].abs_().add_(2.0)
            grads = []
            for engine in (ours, copy):
                tensors = {p: t.clone() for p, t in inputs.items()}
                engine.run(graph, tensors)
                grads.append({p: tensors[p].float() for p in ("dq", "dk", "dv")})
            diff = max(float((grads[0][p] - grads[1][p]).abs().max()) for p in grads[0])
            worst = max(worst, diff)
            print(f"left {left} right {right} {alignment}: max |copy - engine| {diff:.1e}")
    return 0 if worst == 0.0 else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", action="store_true")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--speed", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    write_copy(Path(tempfile.mkdtemp(prefix="runtime-band-")))
    status = 0
    if args.count:
        count()
    if args.check:
        status |= check()
    if args.speed:
        from bench import engine_speed
        status |= engine_speed.main(["--quick", "--rounds", str(args.rounds), "--peers",
                                     "torch-cudnn", ENGINE, *(["--out", args.out] if args.out else [])])
    return status


if __name__ == "__main__":
    raise SystemExit(main())
