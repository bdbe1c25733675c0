"""Probe: how fast can a Triton SDPA backward go on an H200 if dQ is accumulated with atomics?

Our `triton` engine computes the backward deterministically in two kernels: a K-stationary
dK/dV kernel (QK^T, dO V^T, P^T dO, dS^T Q) and a separate Q-stationary dQ kernel that
recomputes QK^T and dO V^T before dS K: 7 matrix multiplies per (Q block, K block) pair.
Here one K-stationary kernel also forms dQ_partial = dS K and adds it into an fp32 workspace
with atomics: 5 multiplies (2/7 less tensor-core work), at the price of a non-deterministic dQ
(the summation order over K blocks varies run to run) and the atomic traffic. The question:
does that reach >= 0.75x cuDNN at B4 H16 S4096 D128 bf16, where the engine is at 0.60x?

dQ flavours: "ptr" = tl.atomic_add on a [BLOCK_M, D] tile of pointers (relaxed, red.global);
"tma" = a host-side TMA TensorDescriptor over dq_acc as [B*H*S, D] and desc.atomic_add
(TMA reduce, sm90+). Timing covers the whole backward: Delta preprocess, zeroing dq_acc,
the fused kernel and the dq_acc -> dQ conversion. FLOPs = 2.5 x 4 B H S S D (halved causal).

    python bench/atomic_dq_probe.py --check           # CPU, TRITON_INTERPRET=1, vs float64
    python bench/atomic_dq_probe.py --device cuda     # H200 (default there): config grid vs
                                                      # torch-cudnn, torch-flash, `triton` engine
    python bench/atomic_dq_probe.py --device cpu      # smoke test of the timing code path
"""
from __future__ import annotations

import argparse, itertools, json, math, os, sys, time  # noqa: E401
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
# without a GPU the interpreter runs the kernels; it must be set before @triton.jit runs
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

try:  # host-side descriptors: triton >= 3.4 (3.6 and 3.9 both have them)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None
DESC_ATOMIC = hasattr(getattr(tl.core, "tensor_descriptor_base", object), "atomic_add")
LOG2E = 1.4426950408889634
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "h200" / "round8" / "atomic_dq_probe.json"


# ----------------------------------------------------------------------------- kernels
@triton.jit
def _delta_kernel(O, DO, DELTA, rows, HEAD_D: tl.constexpr, BLOCK: tl.constexpr):
    """Delta[r] = sum_d O[r, d] dO[r, d] (fp32), rows = B*H*S of packed BHSD."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = r < rows
    tile = r.to(tl.int64)[:, None] * HEAD_D + tl.arange(0, HEAD_D)[None, :]
    o = tl.load(O + tile, mask=ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + tile, mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(DELTA + r, tl.sum(o * do, axis=1), mask=ok)


@triton.jit
def _dq_convert_kernel(ACC, DQ, n, scale, BLOCK: tl.constexpr):
    """dQ = (dq_acc * scale) in the io dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    acc = tl.load(ACC + offs, mask=ok, other=0.0)
    tl.store(DQ + offs, (acc * scale).to(DQ.dtype.element_ty), mask=ok)


@triton.jit
def _mm(a, b, UPCAST: tl.constexpr):
    """a @ b in fp32. UPCAST: the CPU interpreter's bf16 tl.dot multiplies bit patterns, so
    widen first there (bf16 products are exact in fp32: same math as the GPU)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _step(dk, dv, k, v, Q, DO, LSE, DELTA, DQ_ACC, dq_desc, base, row_base, m0, offs_n, offs_d,
          qk_scale2, HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, MASK: tl.constexpr,
          TMA: tl.constexpr, UPCAST: tl.constexpr):
    """One Q block [m0, m0 + BLOCK_M) against this program's K/V block: 5 matmuls."""
    offs_m = m0 + tl.arange(0, BLOCK_M)
    tile = base + offs_m[:, None] * HEAD_D + offs_d[None, :]            # [BLOCK_M, D]
    q = tl.load(Q + tile)
    do = tl.load(DO + tile)
    lse2 = tl.load(LSE + row_base + offs_m) * 1.4426950408889634        # ln -> log2
    delta = tl.load(DELTA + row_base + offs_m)
    # S^T = K Q^T [BLOCK_N, BLOCK_M];  P = exp(S*scale - lse) = exp2(S*scale*log2e - lse*log2e)
    pT = tl.math.exp2(_mm(k, tl.trans(q), UPCAST) * qk_scale2 - lse2[None, :])
    if MASK:  # diagonal block, top-left causal: query i sees key j iff j <= i
        pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
    dv += _mm(pT.to(do.dtype), do, UPCAST)                              # dV += P^T dO
    dpT = _mm(v, tl.trans(do), UPCAST)                                  # dP^T = V dO^T
    dsT = (pT * (dpT - delta[None, :])).to(q.dtype)                     # dS^T = P^T * (dP^T - Delta)
    dk += _mm(dsT, q, UPCAST)                                           # dK += dS^T Q (scaled at end)
    dq = _mm(tl.trans(dsT), k, UPCAST)                                  # dQ_part = dS K, fp32
    if TMA:
        dq_desc.atomic_add([row_base + m0, 0], dq)                      # TMA reduce-add
    else:
        tl.atomic_add(DQ_ACC + tile, dq, sem="relaxed")
    return dk, dv


@triton.jit
def fused_bwd_atomic_dq(Q, K, V, DO, LSE, DELTA, DK, DV, DQ_ACC, dq_desc, S, qk_scale2, scale,
                        HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        CAUSAL: tl.constexpr, TMA: tl.constexpr, UPCAST: tl.constexpr = False):
    """Grid (S / BLOCK_N, B*H); packed BHSD; needs S % BLOCK_N == 0 == BLOCK_N % BLOCK_M."""
    n0 = tl.program_id(0) * BLOCK_N
    row_base = tl.program_id(1) * S                     # first row of (b, h) in [B*H*S, D]
    base = row_base.to(tl.int64) * HEAD_D
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_D)
    kv_tile = base + offs_n[:, None] * HEAD_D + offs_d[None, :]
    k = tl.load(K + kv_tile)
    v = tl.load(V + kv_tile)
    dk = tl.zeros([BLOCK_N, HEAD_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_D], dtype=tl.float32)
    start = 0
    if CAUSAL:
        # Q blocks below n0 see none of these keys (skipped); those in [n0, n0 + BLOCK_N)
        # straddle the diagonal (masked); all later ones see every key (unmasked loop)
        for m0 in range(n0, n0 + BLOCK_N, BLOCK_M):
            dk, dv = _step(dk, dv, k, v, Q, DO, LSE, DELTA, DQ_ACC, dq_desc, base, row_base, m0,
                           offs_n, offs_d, qk_scale2, HEAD_D, BLOCK_M, True, TMA, UPCAST)
        start = n0 + BLOCK_N
    for m0 in range(start, S, BLOCK_M):
        dk, dv = _step(dk, dv, k, v, Q, DO, LSE, DELTA, DQ_ACC, dq_desc, base, row_base, m0,
                       offs_n, offs_d, qk_scale2, HEAD_D, BLOCK_M, False, TMA, UPCAST)
    tl.store(DK + kv_tile, (dk * scale).to(DK.dtype.element_ty))       # dK = scale dS^T Q
    tl.store(DV + kv_tile, dv.to(DV.dtype.element_ty))


def probe_backward(q, k, v, o, do, lse, scale, causal, cfg, flavour="ptr"):
    """dq, dk, dv of softmax(scale Q K^T) V for packed BHSD q/k/v/o/do (bf16 or fp16, D 64
    or 128, S_q == S_kv) and natural-log LSE [B, H, S] fp32. cfg = (BLOCK_M, BLOCK_N,
    num_warps, num_stages); flavour "ptr" or "tma" (how dQ is accumulated)."""
    block_m, block_n, warps, stages = cfg
    B, H, S, D = q.shape
    assert all(t.is_contiguous() and t.shape == q.shape for t in (k, v, o, do)), "packed BHSD MHA"
    assert D in (64, 128) and S % block_n == 0 and block_n % block_m == 0, (D, S, cfg)
    rows = B * H * S
    lse = lse.reshape(B, H, S).float().contiguous()
    delta = torch.empty((B, H, S), dtype=torch.float32, device=q.device)
    _delta_kernel[(triton.cdiv(rows, 64),)](o, do, delta, rows, HEAD_D=D, BLOCK=64)
    dq_acc = torch.zeros((B, H, S, D), dtype=torch.float32, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    if flavour == "tma":
        if TensorDescriptor is None or not DESC_ATOMIC:
            raise RuntimeError("this triton has no host TensorDescriptor / descriptor atomic_add")
        dq_desc = TensorDescriptor(dq_acc.view(rows, D), [rows, D], [D, 1], [block_m, D])
    elif flavour == "ptr":
        dq_desc = dq_acc            # unused (the TMA branch is compiled out)
    else:
        raise ValueError(f"unknown flavour {flavour!r}")
    fused_bwd_atomic_dq[(S // block_n, B * H)](
        q, k, v, do, lse, delta, dk, dv, dq_acc, dq_desc, S, scale * LOG2E, scale,
        HEAD_D=D, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal), TMA=flavour == "tma",
        UPCAST=INTERPRET and q.dtype == torch.bfloat16, num_warps=warps, num_stages=stages)
    dq = torch.empty_like(q)
    _dq_convert_kernel[(triton.cdiv(dq.numel(), 1024),)](dq_acc, dq, dq.numel(), scale, BLOCK=1024)
    return dq, dk, dv


# ----------------------------------------------------------------------------- --check
def _interpreter_descriptor_reduce():
    """The interpreter (3.6, 3.9) lacks descriptor atomic_add: emulate it as load + add + store
    (programs run one after another there), so the TMA flavour's indexing is checked."""
    from triton.runtime import interpreter as interp
    if hasattr(interp.InterpreterBuilder, "create_descriptor_reduce"):
        return "native"

    def create_descriptor_reduce(self, kind, desc, value, indices):
        assert "ADD" in str(kind), kind
        ptrs, mask = desc.materialize_pointers(indices)   # mask: a handle (3.9) or an array (3.6)
        ptrs, mask = ptrs.data, mask.data if isinstance(mask, interp.TensorHandle) else mask
        old = interp._interpreter.load(ptrs, mask, interp.np.zeros_like(value.data), value.data.dtype)
        return interp._interpreter.store(ptrs, old + value.data, mask)
    interp.InterpreterBuilder.create_descriptor_reduce = create_descriptor_reduce
    return "emulated (load+add+store shim)"


def reference(q, k, v, do, scale, causal, dtype):
    """O, LSE and the gradients by autograd in `dtype` (float64: the reference)."""
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    lse = torch.logsumexp(s.double(), dim=-1)
    o = torch.softmax(s, dim=-1) @ v
    o.backward(do.to(dtype))
    return o.detach(), lse, q.grad, k.grad, v.grad


def norm_err(a, b):
    """max |a - b| / max |b| (0 for identical)."""
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def check() -> int:
    """Tiny shapes against float64 autograd: on the CPU interpreter, or compiled on a GPU."""
    device = "cpu" if INTERPRET else "cuda"
    tma_mode = _interpreter_descriptor_reduce() if INTERPRET else f"native={DESC_ATOMIC}"
    print(f"check on {device}: TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')}, triton "
          f"{triton.__version__}, descriptor atomic_add: {tma_mode}")
    tol = {torch.bfloat16: 2e-2, torch.float16: 4e-3}
    failures = 0
    for D, causal, dtype, flavour, cfg in itertools.product(
            (64, 128), (False, True), (torch.float16, torch.bfloat16), ("ptr", "tma"),
            ((32, 64, 4, 2), (64, 128, 8, 3))):
        torch.manual_seed(D + causal)
        q, k, v, do = (torch.randn(1, 2, 128, D).to(dtype) for _ in range(4))
        scale = 1 / math.sqrt(D)
        o, lse, *grads = reference(q, k, v, do, scale, causal, torch.float64)
        _, _, *low = reference(q, k, v, do, scale, causal, dtype)  # torch's own low-precision math
        args = (t.to(device) for t in (q, k, v, o.to(dtype), do, lse.float()))
        ours = [t.cpu() for t in probe_backward(*args, scale, causal, cfg, flavour)]
        errs = [norm_err(a, b) for a, b in zip(ours, grads)]
        torch_errs = [norm_err(a, b) for a, b in zip(low, grads)]
        # negative control: dQ without its scale must fail the same test
        assert norm_err(ours[0] / scale, grads[0]) > tol[dtype], "check cannot fail"
        ok = max(errs) <= tol[dtype]
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} D{D:<3d} {'causal ' if causal else 'full   '} "
              f"{str(dtype)[6:]:8s} {flavour:3s} cfg {cfg}: max|err|/max|ref| dq {errs[0]:.1e} "
              f"dk {errs[1]:.1e} dv {errs[2]:.1e} (torch {str(dtype)[6:]} math: "
              f"{max(torch_errs):.1e}; tol {tol[dtype]:.0e})", flush=True)
    print("check:", "PASSED" if not failures else f"{failures} FAILED")
    return 1 if failures else 0


# ----------------------------------------------------------------------------- --device cuda
#: (BLOCK_M, BLOCK_N, num_warps, num_stages), likeliest first (the time budget may cut the tail)
CONFIGS = [(64, 128, 8, 2), (32, 128, 4, 3), (64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 4, 3),
           (32, 64, 4, 3), (32, 128, 4, 2), (64, 64, 8, 3), (32, 128, 8, 2), (64, 128, 4, 2),
           (64, 64, 4, 2), (32, 64, 4, 2), (64, 128, 4, 3), (64, 64, 8, 2), (32, 64, 8, 3),
           (32, 64, 8, 2)]


def row_name(flavour, cfg) -> str:
    return f"{flavour} m{cfg[0]} n{cfg[1]} w{cfg[2]} s{cfg[3]}"


def time_probe(shape, inputs, ref, cfg, flavour, timer, device, base_ms) -> dict:
    """One config: max rel diff vs the engine's gradients, then the whole backward timed."""
    from bench import engine_speed as es
    rec = {"flavour": flavour, "cfg": list(cfg), "name": row_name(flavour, cfg)}
    try:
        out = probe_backward(*inputs, cfg, flavour)
        es.synchronize(device)
        if ref is not None:
            rec["max_rel_diff_vs_triton"] = es.max_rel_diff(dict(zip(("dq", "dk", "dv"), out)), ref)
        del out
        ms = timer(lambda: probe_backward(*inputs, cfg, flavour))
        rec |= {"ms": ms, "tflops": es.tflops(shape, ms)}
        rec |= {f"x_{n}": b / ms if b else None for n, b in base_ms.items()}
    except Exception as exc:  # noqa: BLE001 - out of resources, compile errors: recorded
        rec["error"] = es.short_error(exc)
    return rec


def print_shape(label, res) -> None:
    from bench import engine_speed as es
    print(f"\n{label}   (FLOPs = 2.5 x 4 B H S^2 D{', halved' if 'non' not in label else ''}; "
          "rel diff = max|a-b|/max|triton engine|)")
    print(f"{'config':22s}{'ms':>8s}{'TFLOP/s':>9s}{'x cudnn':>9s}{'x engine':>9s}{'rel diff':>10s}")
    for n, p in res["peers"].items():
        print(f"{n:22s}{es.fmt(p['ms'], '.3f'):>8s}{es.fmt(p['tflops']):>9s}{es.fmt(p['x_cudnn'], '.2f'):>9s}"
              f"{es.fmt(p['x_engine'], '.2f'):>9s}{es.fmt(p['max_rel_diff_vs_triton'], '.1e'):>10s}  {p['note'][:70]}")
    for r in sorted(res["rows"], key=lambda r: r.get("ms", math.inf)):
        if "ms" in r:
            print(f"{r['name']:22s}{r['ms']:8.3f}{r['tflops']:9.0f}{es.fmt(r['x_cudnn'], '.2f'):>9s}"
                  f"{es.fmt(r['x_engine'], '.2f'):>9s}{es.fmt(r.get('max_rel_diff_vs_triton'), '.1e'):>10s}")
        else:
            print(f"{r['name']:22s}  {r['error'][:110]}")
    for f, b in res["best"].items():
        print(f"best {f}: " + (f"{b['name']}: {b['tflops']:.0f} TFLOP/s = {es.fmt(b['x_cudnn'], '.2f')}x cuDNN,"
                               f" {es.fmt(b['x_engine'], '.2f')}x engine" if b else "none (correct and timed)"))


def bench(args) -> int:
    from bench import engine_speed as es

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    timer = es.cuda_timer(args.warmup_ms, args.rep_ms) if cuda else es.cpu_timer(1)
    engines = es.build_engines([es.TRITON, "torch-cudnn", "torch-flash"], device)
    env = es.environment(device) | {"interpreter": INTERPRET, "descriptor_atomic_add": DESC_ATOMIC,
                                     "tma_flavour": "host TensorDescriptor" if TensorDescriptor else None}
    print(f"atomic_dq_probe on {env.get('gpu', device)}: torch {env['torch']}, triton {env['triton']}, "
          f"descriptor atomic_add {DESC_ATOMIC}", flush=True)
    # the H200 target shape; on cpu (a smoke test of this code path) a tiny one and 2 configs
    shapes = [es.Shape(4, 16, 16, 4096, 128, "bf16", c) if cuda else es.Shape(1, 2, 2, 128, 64, "bf16", c)
              for c in (False, True)]
    configs = args.configs or (CONFIGS if cuda else CONFIGS[:2])
    started, result = time.perf_counter(), {"environment": env, "settings": vars(args) | {"out": str(args.out)},
                                            "shapes": {}}
    for i, shape in enumerate(shapes):
        deadline = started + args.budget_s * (i + 1) / len(shapes)
        row = es.measure_shape(shape, engines, timer, device)     # the engine and the torch peers
        base_ms = {"cudnn": row.cells["torch-cudnn"].ms, "engine": row.cells[es.TRITON].ms}
        peers = {n: {"ms": c.ms, "tflops": es.tflops(shape, c.ms), "note": c.note,
                     "max_rel_diff_vs_triton": c.max_rel_diff} |
                    {f"x_{k}": b / c.ms if b and c.ms else None for k, b in base_ms.items()}
                 for n, c in row.cells.items()}
        graph = es.graph_of(shape)
        t = es.make_tensors(graph, device)
        ref = None
        if not isinstance(engines[es.TRITON], Exception):
            engines[es.TRITON].run(graph, t)
            ref = es.outputs_of(t)
        inputs = (t["q"], t["k"], t["v"], t["o"], t["do"], t["stats"], graph.attributes.attn_scale, shape.causal)
        rows = []
        for cfg, flavour in itertools.product(configs, args.flavours):
            if time.perf_counter() > deadline:
                rows.append({"flavour": flavour, "cfg": list(cfg), "name": row_name(flavour, cfg),
                             "error": "skipped: time budget (--budget-s)"})
                continue
            rows.append(rec := time_probe(shape, inputs, ref, cfg, flavour, timer, device, base_ms))
            print(f"  {shape.label}: {rec['name']}: " + (f"{rec['ms']:.3f} ms {rec['tflops']:.0f} TFLOP/s"
                  if "ms" in rec else rec["error"]), flush=True)
        good = [r for r in rows if "ms" in r and (r.get("max_rel_diff_vs_triton") or 0) <= 0.05]
        best = {f: min((r for r in good if r["flavour"] == f), key=lambda r: r["ms"], default=None)
                for f in args.flavours}
        result["shapes"][shape.label] = {"shape": vars(shape) | {"flops": shape.flops},
                                         "peers": peers, "rows": rows, "best": best}
        result["elapsed_s"] = round(time.perf_counter() - started, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")   # after each shape
        del t, ref
        if cuda:
            torch.cuda.empty_cache()
    for label, res in result["shapes"].items():
        print_shape(label, res)
    print(f"\n{time.perf_counter() - started:.0f} s; wrote {args.out}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="interpreter correctness check (default without a GPU)")
    p.add_argument("--device", default=None, help="cuda: the timing grid; cpu: a smoke test of its code path")
    p.add_argument("--out", type=Path, default=None, help=f"JSON (default {DEFAULT_OUT.relative_to(REPO_ROOT)})")
    p.add_argument("--configs", nargs="+", default=None, metavar="M,N,WARPS,STAGES",
                   type=lambda text: tuple(int(x) for x in text.split(",")),
                   help="configs to time instead of the built-in grid, e.g. 64,128,8,3")
    p.add_argument("--flavours", nargs="+", default=["ptr", "tma"], choices=["ptr", "tma"])
    p.add_argument("--budget-s", type=float, default=140, help="time budget of the probe grid, both shapes")
    p.add_argument("--warmup-ms", type=int, default=20)
    p.add_argument("--rep-ms", type=int, default=60)
    args = p.parse_args(argv)
    if args.check or args.device is None and not torch.cuda.is_available():
        return check()
    args.device = args.device or "cuda"
    if args.device == "cuda" and not torch.cuda.is_available():
        print("atomic_dq_probe: no CUDA device; run --check (or --device cpu)", file=sys.stderr)
        return 2
    if args.device == "cpu":
        _interpreter_descriptor_reduce()
    args.out = args.out or (DEFAULT_OUT if args.device == "cuda" else REPO_ROOT / "out" / "atomic_dq_probe_cpu.json")
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
