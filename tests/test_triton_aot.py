"""The kernels compile for the archs this project configures but cannot run (no GPU needed:
Triton targets them ahead of time), and the compiled dK/dV kernel, the one with the most
shared memory, fits each arch's budget at the two largest head-dim tiers, dense and ragged. sm90 runs on the
H200; `python -m bundlegen.engines.triton.aot` checks every kernel, arch and tier (a few minutes)."""
import json
import os
import subprocess
import sys

import pytest

from bundlegen.engines.triton import configs
from bundlegen.engines.triton.aot import compile_env

CASES = [("sm120", 128), ("sm120", 256), ("gfx942", 128), ("gfx942", 256)]


def _compile_in_subprocess(arch: str, d: int, only=("dkdv", "dkdv-ragged"),
                           expr: str = "aot.compile_all({arch!r}, {d}, {d}, only={only!r})") -> dict:
    """Triton is imported in one mode per process, and the engine tests import it under the
    interpreter: compiling for a GPU target needs a process of its own."""
    env = compile_env()
    code = ("import json; from bundlegen.engines.triton import aot; "
            f"print(json.dumps({expr.format(arch=arch, d=d, only=tuple(only))}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch,d", CASES, ids=[f"{a}-d{d}" for a, d in CASES])
def test_compiles_within_shared_memory(arch, d):
    shared = _compile_in_subprocess(arch, d)
    assert set(shared) == {"dkdv", "dkdv-ragged"}
    for label in shared:
        assert 0 < shared[label] <= configs.ARCHS[arch].smem_bytes, shared


def test_dense_variants_take_no_ragged_arguments():
    """A dense launch passes None for the offsets and token counts: Triton makes them
    constexprs, so the dense dQ kernel has the 7 tensor pointers it had before RAGGED and
    the ragged one 2 more (the cu_seqlens)."""
    expr = ("{{k: aot.kernel_signature('sm90', {d}, k) for k in {only!r}}}")
    sigs = _compile_in_subprocess("sm90", 64, ("dq", "dq-ragged"), expr)
    assert sigs["dq"].count("!tt.ptr") == 7, sigs["dq"]
    assert sigs["dq-ragged"].count("!tt.ptr<i32>") == 2, sigs["dq-ragged"]
    assert sigs["dq-ragged"].count("!tt.ptr") == 9


TWO_CHUNK_MISUSE = {"one head dim in two chunks": dict(BLOCK_DV2=0),
                    "a first chunk other than 128 columns": dict(BLOCK_DQK=256),
                    "two chunks without masks (EVEN)": dict(EVEN=True)}
_MISUSE = """
import json, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from bundlegen.engines.triton import aot, kernels, resources
variants = resources.load_report()["archs"]["sm90"]["variants"]
out = {{}}
for kernel in ("dq", "dkdv"):
    var = variants[kernel + "-2c/d192/vec8/narrow/dense"]
    fn = getattr(kernels, var["kernel"])
    try:
        triton.compile(ASTSource(fn, *aot.specialise(fn, dict(var["constexprs"], **{change!r}),
                                                        "bf16")),
                       target=GPUTarget(*aot.TARGETS["sm90"]), options=dict(var["options"]))
        out[kernel] = "compiled"
    except Exception as e:
        out[kernel] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
"""


@pytest.mark.parametrize("misuse", list(TWO_CHUNK_MISUSE))
def test_two_chunk_kernels_refuse_a_broken_invariant_at_compile_time(misuse):
    """The two-chunk branch of the dK/dV and dQ kernels (kernels.py, "Two chunks") relies on
    both head dims in two chunks, a whole 128-column first chunk and masked loads: a launch
    breaking one is refused when it compiles (tl.static_assert), not run with wrong tiles."""
    code = _MISUSE.format(change=TWO_CHUNK_MISUSE[misuse])
    out = subprocess.run([sys.executable, "-c", code], env=compile_env(), capture_output=True,
                         text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-3000:]
    for kernel, result in json.loads(out.stdout.strip().splitlines()[-1]).items():
        assert "two chunks: both head dims" in result, (kernel, result[-500:])
