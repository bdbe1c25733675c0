"""Compile one Triton kernel variant for a target arch without a GPU and measure its resources:
registers / VGPRs, spills, shared memory / LDS, occupancy (resource_limits), code size.

Each figure is of the variant compiled alone (`measure_alone`: a process of its own, an empty
Triton cache), by the sweep and by the CI test alike. Not several in one process: Triton
3.9's gfx942 code for a kernel depends on what the same process compiled before it (a dBias
variant has 75 or 76 VGPRs by that alone), and a cache hit returns whatever process made it.
"""
from __future__ import annotations

import functools
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from typing import Any, Mapping

from bundlegen.engines.triton import aot
from bundlegen.engines.triton.resource_limits import LIMITS, amd_occupancy, nvidia_occupancy


def compile_variant(arch: str, var: Mapping) -> Any:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from bundlegen.engines.triton import kernels
    from bundlegen.engines.triton.resources import added_off   # resources imports this module
    fn = getattr(kernels, var["kernel"])
    off = added_off(var["constexprs"])
    cons = {**{k: v for k, v in off.items() if k in fn.arg_names}, **var["constexprs"]}
    src = ASTSource(fn, *aot.specialise(fn, cons, var["io"]))
    return triton.compile(src, target=GPUTarget(*aot.TARGETS[arch]), options=dict(var["options"]))


@functools.lru_cache(maxsize=None)
def _tool(name: str) -> str:
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _cuobjdump(cubin: bytes, *args: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([_tool("cuobjdump"), *args, f.name], capture_output=True,
                              text=True, check=True).stdout


#: ELF section flag of machine code
_SHF_EXECINSTR = 0x4


def code_bytes(elf: bytes) -> int:
    """The bytes of machine code in a cubin or hsaco (64-bit little-endian ELF): the sizes of
    its executable sections. Not the file's length: its debug sections hold the kernel
    source's path, so a checkout in a longer folder makes a longer binary of the same code."""
    if elf[:6] != b"\x7fELF\x02\x01":
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    flags = (struct.unpack_from("<Q", elf, shoff + i * shentsize + 8)[0] for i in range(shnum))
    sizes = (struct.unpack_from("<Q", elf, shoff + i * shentsize + 32)[0] for i in range(shnum))
    return sum(size for flag, size in zip(flags, sizes) if flag & _SHF_EXECINSTR)


def _amd_notes(asm: str) -> dict:
    """The AMDGPU metadata notes of the (one) kernel in an AMDGCN assembly."""
    keys = {"vgpr_count": r"\.vgpr_count:\s+(\d+)", "agpr_count": r"\.agpr_count:\s+(\d+)",
            "sgpr_count": r"\.sgpr_count:\s+(\d+)", "vgpr_spill_count": r"\.vgpr_spill_count:\s+(\d+)",
            "sgpr_spill_count": r"\.sgpr_spill_count:\s+(\d+)", "scratch_bytes": r"; ScratchSize:\s+(\d+)",
            "compiler_occupancy": r"; Occupancy:\s+(\d+)"}
    out = {}
    for key, pattern in keys.items():
        found = re.findall(pattern, asm)
        if len(found) != 1:
            raise ValueError(f"AMDGCN note {key}: {len(found)} matches")
        out[key] = int(found[0])
    return out


def measure(arch: str, var: Mapping, kernel=None) -> dict:
    """The resource entry of a compiled variant on its arch."""
    kernel = kernel or compile_variant(arch, var)
    limits = LIMITS[arch]
    shared = int(kernel.metadata.shared)
    warps = int(kernel.metadata.num_warps)
    entry = {"shared_bytes": shared, "num_warps": warps}
    if limits.kind == "nvidia":
        cubin = kernel.asm["cubin"]
        fields = dict(w.split(":", 1) for line in _cuobjdump(cubin, "-res-usage").splitlines()
                      if "REG:" in line for w in line.split() if ":" in w)
        sass = _cuobjdump(cubin, "-sass")
        entry.update(registers=int(fields["REG"]), stack_bytes=int(fields["STACK"]),
                     local_bytes=int(fields["LOCAL"]),
                     spill_stores=len(re.findall(r"\bSTL(\.\w+)*\b", sass)),
                     spill_loads=len(re.findall(r"\bLDL(\.\w+)*\b", sass)),
                     code_bytes=code_bytes(cubin))
        entry["spill_bytes"] = entry["stack_bytes"] + entry["local_bytes"]
        entry["occupancy"] = nvidia_occupancy(limits, entry["registers"], shared, warps)
    else:
        notes = _amd_notes(kernel.asm["amdgcn"])
        entry.update(notes, code_bytes=code_bytes(kernel.asm["hsaco"]))
        entry["spill_bytes"] = notes["scratch_bytes"]
        entry["occupancy"] = amd_occupancy(limits, notes["vgpr_count"], notes["sgpr_count"],
                                           shared, warps)
    return entry


_MEASURE_ALONE = ("import json, sys; from bundlegen.engines.triton import resource_measure as M; "
                  "print(json.dumps(M.measure(sys.argv[1], json.load(sys.stdin))))")


def measure_alone(arch: str, var: Mapping) -> dict:
    """`measure`, in a process of its own with an empty Triton cache: the figures of the
    variant compiled alone (the module's docstring says why)."""
    with tempfile.TemporaryDirectory(prefix="bundlegen-triton-cache-") as cache:
        out = subprocess.run([sys.executable, "-c", _MEASURE_ALONE, arch], input=json.dumps(var),
                             env=aot.compile_env(cache), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"compiling {var['kernel']} for {arch} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
