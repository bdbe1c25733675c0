"""Ahead-of-time compilation of the kernels for the GPU archs, without a GPU.

Triton compiles for a named target on any host (its wheel carries ptxas and the AMD code
generator), so the archs this project cannot run (sm120, gfx942) are still checked to
compile with their configs, and every arch's shared memory is read from the compiled
kernel and compared with its budget:

    python -m bundlegen.engines.triton.aot [ARCH ...]        # default: sm90 sm120 gfx942

Each kernel is compiled twice: the dense variant and the ragged one (RAGGED, with its
cu_seqlens pointers and token counts; a dense launch passes None for those, so they are
constexprs there and the dense variant has none of them).
"""
from __future__ import annotations

import os
import sys

from bundlegen.engines.triton import configs

TARGETS = {"sm90": ("cuda", 90, 32), "sm120": ("cuda", 120, 32), "gfx942": ("hip", "gfx942", 64)}
_INTS = {"H_q", "H_grp", "G_k", "G_v", "S_q", "S_kv", "D_qk", "D_v", "shift", "left", "right",
         "T_q", "T_kv", "B", "B_sum", "H_sum", "H_db"}
_FLOATS = {"scale", "softcap", "drop_scale", "drop_p"}
_FP32_PTRS = {"LSE", "Delta", "SINKS", "DSINKS", "DQA", "ALIBI"}
_I32_PTRS = {"CU_Q", "CU_KV", "USED_Q", "USED_KV"}
_RAGGED_ARGS = ("CU_Q", "CU_KV", "T_q", "T_kv")   # None (constexpr) in a dense variant
#: no used lengths (padded varlen): a launch without seqused ports
NO_USED = dict(HAS_USED_Q=False, HAS_USED_KV=False, USED_Q=None, USED_KV=None)
#: None (constexpr) in a variant without score modifiers (HAS_BIAS and SOFTCAP off)
MODIFIER_ARGS = ("BIAS", "bias_off", "sbias_b", "sbias_h", "sbias_i", "sbias_j", "softcap",
                 "DROP", "drop_off", "sdrop_b", "sdrop_h", "sdrop_i", "sdrop_j", "drop_scale",
                 "drop_seed", "drop_offset", "drop_p", "ALIBI", "alibi_off", "salibi_b", "salibi_h")
#: the dK/dV kernel's atomic-dQ scratch arguments, None (constexprs) without atomic dQ
ATOMIC_DQ_ARGS = ("DQA", "sqa_b", "sqa_h", "sqa_s")
NO_ATOMIC_DQ = dict(ATOMIC_DQ=False, **{a: None for a in ATOMIC_DQ_ARGS})
#: the dK/dV kernel's dBias arguments (FUSED_DBIAS): None (constexprs) where it is off
FUSED_DBIAS_ARGS = ("DBS", "dbs_off", "sdbs_b", "sdbs_h", "sdbs_i", "sdbs_j")
#: TMA launches' tensor descriptors (None, constexprs, without TMA): kernel -> argument ->
#: the constexprs that are its block's rows and columns (launch.Launch.descriptors)
DESCRIPTOR_ARGS = {"bwd_dkdv": {"QD": ("BLOCK_M", "BLOCK_DQK"), "DOD": ("BLOCK_M", "BLOCK_DV")},
                   "bwd_dq": {"KD": ("BLOCK_N", "BLOCK_DQK"), "VD": ("BLOCK_N", "BLOCK_DV")}}


def compile_env(cache_dir=None) -> dict[str, str]:
    """The environment of a process that compiles for a GPU target: os.environ without
    TRITON_INTERPRET (Triton is imported in one mode per process); `cache_dir`: Triton's
    cache there (an empty folder: a compile, not a cache hit)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"   # silences Triton 3.9's notice (its default)
    if cache_dir is not None:
        env["TRITON_CACHE_DIR"] = str(cache_dir)
    return env


def no_tma(kernel: str) -> dict:
    """The constexprs of a kernel's launch without TMA descriptors."""
    return dict(TMA=False, **{a: None for a in DESCRIPTOR_ARGS[kernel]})


def specialise(fn, constexprs: dict, io: str) -> tuple[dict, dict, dict]:
    """Signature, constexprs and attributes as a launch specialises them: integers are
    never specialised (see kernels), pointers are storage bases, hence 16-byte aligned."""
    sig, attrs = {}, {}
    descriptors = DESCRIPTOR_ARGS.get(fn.__name__, {})
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in descriptors:
            rows, cols = (constexprs[c] for c in descriptors[name])
            sig[name] = f"tensordesc<{io}[1, 1, {rows}, {cols}]>"
        elif name in _FLOATS:
            sig[name] = "fp32"
        elif name[0].isupper() and name not in _INTS:
            sig[name] = ("*fp32" if name in _FP32_PTRS else "*i32" if name in _I32_PTRS
                         else f"*{io}")
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "i32"
    return sig, dict(constexprs), attrs


KERNELS = ("preprocess", "dq", "dkdv", "dk", "dv")
#: every kernel dense, and ragged (label suffix RAGGED_SUFFIX)
RAGGED_SUFFIX = "-ragged"
VARIANTS = KERNELS + tuple(k + RAGGED_SUFFIX for k in KERNELS)


def compile_all(arch: str, d_qk: int, d_v: int, io: str = "bf16",
                only: tuple[str, ...] = VARIANTS, registers: dict | None = None,
                vec: int = 8, compiled: dict | None = None) -> dict[str, int]:
    """Compile the kernel variants the launcher uses for (arch, D_qk, D_v) with the arch's
    table config (band mask on, the most code; vec=8 is the aligned-layout variant), dense
    and ragged (the per-sequence shift, chosen at run time, is compiled into every ragged
    variant).
    Returns shared memory bytes per variant; fills `registers` (NVIDIA only) with each
    variant's register and spill-stack usage, and `compiled` with the compiled kernels."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from bundlegen.engines.triton import kernels

    cfg = configs.config_for(arch, d_qk, d_v)
    target = GPUTarget(*TARGETS[arch])
    tiles = dict(BLOCK_DQK=configs.block_d(d_qk), BLOCK_DV=configs.block_d(d_v), BLOCK_DQK2=0,
                 BLOCK_DV2=0)
    masks = dict(HAS_LEFT=True, HAS_RIGHT=True, UPCAST=False, WIDE=False,
                 EVEN=False, VEC=vec, HAS_BIAS=False, SOFTCAP=False, HAS_DROPOUT=False, DRAWN_DROPOUT=False,
                 HAS_ALIBI=False, SCORE_VEC=1, **{a: None for a in MODIFIER_ARGS}, **NO_USED)
    variants = {
        "preprocess": (kernels.bwd_preprocess, dict(BLOCK_M=cfg.block_m2, WIDE=False, VEC=vec,
                                                    HAS_USED_Q=False, USED_Q=None,
                                                    BLOCK_DV=tiles["BLOCK_DV"])),
        "dq": (kernels.bwd_dq, dict(masks, **no_tma("bwd_dq"), BLOCK_M=cfg.block_m2,
                                    BLOCK_N=cfg.block_n2, **tiles)),
    }
    for label, dk, dv in (("dkdv", True, True), ("dk", True, False), ("dv", False, True)):
        if label == "dkdv" and cfg.split_dkdv:   # never launched: the dK and dV passes are
            continue                             # (resources.py compiles exactly what is)
        variants[label] = (kernels.bwd_dkdv, dict(masks, **NO_ATOMIC_DQ, **no_tma("bwd_dkdv"),
                                                  COMPUTE_DK=dk,
                                                  COMPUTE_DV=dv, KV_SHARED=dk and dv,
                                                  DP_FIRST=cfg.dp_first,
                                                  BLOCK_M=cfg.block_m1, BLOCK_N=cfg.block_n1,
                                                  **tiles))
    for label, (fn, cons) in list(variants.items()):
        ragged = dict(RAGGED=True)
        dense = {name: False for name in ragged}
        dense.update({a: None for a in _RAGGED_ARGS if a in fn.arg_names})
        variants[label] = (fn, dict(cons, **dense))
        variants[label + RAGGED_SUFFIX] = (fn, dict(cons, **ragged))
    shared = {}
    for label, (fn, cons) in variants.items():
        if label not in only:
            continue
        src = ASTSource(fn, *specialise(fn, cons, io))
        kernel = triton.compile(src, target=target,
                                options=cfg.launch_kwargs(
                                    dq=label.startswith(("dq", "preprocess"))))
        if compiled is not None:
            compiled[label] = kernel
        shared[label] = kernel.metadata.shared
        if registers is not None and "cubin" in kernel.asm:
            registers[label] = _cubin_usage(kernel.asm["cubin"])
    return shared


def kernel_signature(arch: str, d: int, label: str) -> str:
    """The `tt.func` line of a variant's TTIR: the arguments it is launched with."""
    compiled: dict = {}
    compile_all(arch, d, d, only=(label,), compiled=compiled)
    return next(line for line in compiled[label].asm["ttir"].splitlines() if "tt.func" in line)


def _cubin_usage(cubin: bytes) -> str:
    """'REG:n STACK:m' from Triton's bundled cuobjdump (STACK > 0 means register spills)."""
    import os
    import subprocess
    import tempfile

    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    fields = dict(w.split(":", 1) for line in out.splitlines() if "REG:" in line
                  for w in line.split() if ":" in w)
    return f"REG:{fields.get('REG', '?')} STACK:{fields.get('STACK', '?')}"


def main(argv: list[str]) -> int:
    archs = argv or list(TARGETS)
    worst = 0
    for arch in archs:
        budget = configs.ARCHS[arch].smem_bytes
        for d in (16, 32, 64, 128, 256):
            registers: dict = {}
            shared = compile_all(arch, d, d, registers=registers)
            ok = max(shared.values()) <= budget
            worst |= not ok
            print(f"{arch:7s} D={d:3d} {configs.config_for(arch, d, d)}\n  shared {shared} "
                  f"budget {budget} {'ok' if ok else 'OVER'}", flush=True)
            if registers:
                print(f"  registers {registers}", flush=True)
    return int(worst)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
