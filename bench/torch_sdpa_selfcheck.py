"""Self-check of torch-flash, torch-efficient and torch-cudnn on a real GPU, in one call.

    python bench/torch_sdpa_selfcheck.py [--device cuda:0] [--only NAME]

For a handful of graphs (layouts, masks, GQA, head dims, odd strides) the harness lays out
the declared strided tensors (bundlegen.harness.selfcheck: canary-guarded storages, O and
Stats from the float64 oracle forward), runs every engine that accepts the graph and
prints, per engine, the decision, the error against the float64 oracle backward (max |err|
and the normalised error of CONTRACTS' tolerance rule with a loose dtype rtol; > 1 is
suspect), and whether anything was written outside the declared views or into an input.
It also prints what PyTorch's
own dispatcher (`torch.backends.cuda.can_use_*_attention`) says of the same q, k, v, and
the LSE / O layouts each real forward returns, so the adapter's assumptions are checked.

Exit status 0 unless an accepted case crashed, wrote outside its views, modified an input
or was suspect.
"""
from __future__ import annotations

import argparse
import sys
import traceback
from dataclasses import dataclass

import torch

from bundlegen.graph import LAYOUT_ORDERS, Graph, dense_graph, packed_strides
from bundlegen.reasons import code_of
from bundlegen.engines.registry import engine_class
from bundlegen.engines.torch_sdpa_common import write_gradients
from bundlegen.harness import selfcheck
from bundlegen.harness.config import Tolerance
from bundlegen.harness.materialize import Materialized

ENGINES = ("torch-flash", "torch-efficient", "torch-cudnn")
DISPATCHER = {"torch-flash": "can_use_flash_attention",
              "torch-efficient": "can_use_efficient_attention",
              "torch-cudnn": "can_use_cudnn_attention"}
#: loose relative tolerances (4 units of roundoff of the io dtype) for the printout only
RTOL = {"fp16": 2.0 ** -9, "bf16": 2.0 ** -6, "fp32": 1e-5}
ATOL = 1e-5
#: declines that cannot fault the GPU (no misaligned access): run them anyway by default
TRY_DECLINED = ("alignment-not-served", "head-dim-too-large", "seq-len-not-served")
SEED = 1234


# ----------------------------------------------------------------------------- graphs
def padded_rows(H: int, S: int, D: int, extra: int) -> tuple[int, ...]:
    """BHSD strides whose rows are D + extra elements apart."""
    row = D + extra
    return (H * S * row, S * row, row, 1)


def bshd(dims: tuple[int, ...]) -> tuple[int, ...]:
    return packed_strides(dims, LAYOUT_ORDERS["bshd"])


def graph(**sizes) -> Graph:
    """dense_graph with this check's default sizes: B 2, H 4, S 128, D 64, fp16."""
    return dense_graph(**{"B": 2, "H_q": 4, "H_k": 4, "H_v": 4, "S_q": 128, "S_kv": 128,
                          "D_qk": 64, "D_v": 64, "dtype": "fp16", **sizes})


@dataclass(frozen=True)
class SelfCase:
    label: str
    graph: Graph
    note: str = ""


def cases() -> list[SelfCase]:
    g = graph
    return [
        SelfCase("bhsd-fp16", g()),
        SelfCase("bshd-bf16-tails", g(dtype="bf16", layout="bshd", S_q=100, S_kv=161)),
        SelfCase("causal-square", g(right=0)),
        SelfCase("causal-TL-sq<skv", g(S_q=64, S_kv=160, right=0)),
        SelfCase("causal-BR-sq<skv", g(S_q=64, S_kv=160, right=0, alignment="BOTTOM_RIGHT")),
        SelfCase("causal-BR-sq>skv", g(S_q=160, S_kv=64, right=0, alignment="BOTTOM_RIGHT"),
                 "rows with no key: LSE -inf"),
        SelfCase("causal-TL-sq>skv", g(S_q=160, S_kv=64, right=0)),
        SelfCase("window", g(right=0, left=32)),
        SelfCase("gqa-bf16", g(dtype="bf16", H_q=8, H_k=2, H_v=2)),
        SelfCase("mqa", g(H_q=8, H_k=1, H_v=1, layout="bshd")),
        SelfCase("hv<hk", g(H_q=4, H_k=4, H_v=2)),
        SelfCase("d128-bf16", g(dtype="bf16", D_qk=128, D_v=128)),
        SelfCase("d256-bf16", g(dtype="bf16", D_qk=256, D_v=256, S_q=96, S_kv=96)),
        SelfCase("dqk192-dv128", g(dtype="bf16", D_qk=192, D_v=128)),
        SelfCase("dqk128-dv64", g(D_qk=128, D_v=64)),
        SelfCase("d72", g(D_qk=72, D_v=72)),
        SelfCase("d40", g(D_qk=40, D_v=40)),
        SelfCase("fp32", g(dtype="fp32", S_q=64, S_kv=96)),
        SelfCase("padded-rows-8", g(strides={p: padded_rows(4, 128, 64, 8) for p in ("q", "k", "v")})),
        SelfCase("odd-pitch-1", g(strides={p: padded_rows(4, 128, 64, 1) for p in ("q", "k", "v")})),
        SelfCase("offset-8", g(offsets={"q": 8, "k": 16, "v": 24, "do": 8})),
        SelfCase("broadcast-kv-batch", g(strides={"k": (0, 128 * 64, 64, 1), "v": (0, 128 * 64, 64, 1)})),
        SelfCase("broadcast-all-batch", g(strides={
            **{p: (0, 128 * 64, 64, 1) for p in ("q", "k", "v", "o", "do")}, "stats": (0, 128, 1, 1)})),
        SelfCase("stats-padded-head", g(strides={"stats": (4 * 136, 136, 1, 1)})),
        SelfCase("scale-0.5", g(scale=0.5, S_q=17, S_kv=33)),
        SelfCase("sq1-skv1", g(S_q=1, S_kv=1)),
        SelfCase("sq1-skv77", g(S_q=1, S_kv=77)),
        # cuDNN caches its graph by q, k, v dims and strides only: same q/k/v, new dO strides.
        SelfCase("do-like-o", g(S_q=96, S_kv=96)),
        SelfCase("do-bshd-same-qkv", g(S_q=96, S_kv=96, strides={"do": bshd((2, 4, 96, 64))}),
                 "after do-like-o: a stale cuDNN graph would misread dO"),
        SelfCase("do-bshd-fresh-key", g(S_q=95, S_kv=96, strides={"do": bshd((2, 4, 95, 64))}),
                 "control: new cache key"),
    ]


# ----------------------------------------------------------------------------- dispatcher
def dispatcher_says(name: str, g: Graph, m: Materialized) -> str:
    a = g.attributes
    if a.left_bound is not None or a.right_bound not in (None, 0):
        return "n/a (mask needs attn_mask)"
    try:
        qkv = [m.tensors[p].detach().requires_grad_() for p in ("q", "k", "v")]
        is_causal = a.right_bound == 0
        gqa = g.H_k != g.H_q or g.H_v != g.H_q
        try:
            params = torch.backends.cuda.SDPAParams(*qkv, None, 0.0, is_causal, gqa)
        except TypeError:
            params = torch.backends.cuda.SDPAParams(*qkv, None, 0.0, is_causal)
        return "yes" if getattr(torch.backends.cuda, DISPATCHER[name])(params, False) else "no"
    except Exception as exc:  # noqa: BLE001
        return f"? ({type(exc).__name__})"


def forward_layouts(device: torch.device) -> None:
    """What each real forward returns, to check the O / LSE forms the adapter presents."""
    q = torch.randn(2, 4, 70, 64, dtype=torch.float16, device=device)
    k = torch.randn(2, 4, 50, 64, dtype=torch.float16, device=device)
    calls = {
        "flash": lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, k, k, 0.0, False),
        "efficient": lambda: torch.ops.aten._scaled_dot_product_efficient_attention(q, k, k, None, True),
        "cudnn": lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, k, None, True),
    }
    for name, call in calls.items():
        try:
            out = call()
            o, lse = out[0], out[1]
            print(f"  {name:9s} forward: O strides {tuple(o.stride())}, LSE shape "
                  f"{tuple(lse.shape)} strides {tuple(lse.stride())}")
        except Exception as exc:  # noqa: BLE001
            print(f"  {name:9s} forward: {type(exc).__name__}: {str(exc).splitlines()[0]}")


# ----------------------------------------------------------------------------- main
def check(name: str, engine, case: SelfCase, device: torch.device,
          try_declined: frozenset[str] = frozenset()) -> tuple[str, str]:
    """(status, text): ok / SUSPECT / CRASH for accepted cases; declined, or for a decline
    whose code is in `try_declined`, forced:ok / forced:wrong / forced:raised (informative:
    whether the decline is needed)."""
    g = case.graph
    m = selfcheck.prepare(g, SEED, device, label=case.label)
    disp = dispatcher_says(name, g, m)
    reason = engine.is_applicable(g)
    forced = reason is not None and code_of(reason) in try_declined
    if reason is not None and not forced:
        return "declined", f"{reason} | dispatcher: {disp}"
    try:
        if forced:   # past the guard in run(): only for declines that cannot fault the GPU
            write_gradients(m.tensors, *engine.backward(g, m.tensors))
        else:
            engine.run(g, m.tensors)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        status = "forced:raised" if forced else "CRASH"
        return status, f"{type(exc).__name__}: {first[:200]} | {reason or ''} | dispatcher: {disp}"
    finding = selfcheck.judge(m, Tolerance(RTOL[g.dtype], ATOL, "selfcheck"))
    parts = [f"{port} max|err| {e.max_abs_err:.2e} norm {e.normalized_error:.3f}"
             for port, e in finding.errors.items()]
    good = finding.worst_normalized_error <= 1.0 and finding.memory_intact
    status = ("forced:ok" if good else "forced:wrong") if forced else ("ok" if good else "SUSPECT")
    if finding.wrote_outside:
        parts.append(f"WROTE OUTSIDE {','.join(finding.wrote_outside)}")
    if finding.modified_inputs:
        parts.append(f"MODIFIED INPUTS {','.join(finding.modified_inputs)}")
    if forced:
        parts.append(f"declined as {reason}")
    return status, "; ".join(parts) + f" | dispatcher: {disp}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--only", choices=ENGINES, action="append")
    ap.add_argument("--try-declined", default=",".join(TRY_DECLINED), metavar="CODES",
                    help="decline codes to run anyway, to see whether the decline is needed "
                         f"(default: {','.join(TRY_DECLINED)}; '' for none)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type != "cuda" or not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    props = torch.cuda.get_device_properties(device)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {cudnn}, "
          f"{props.name} sm{props.major}{props.minor}")
    forward_layouts(device)
    from bundlegen.engines.torch_sdpa_common import cudnn_lse_has_unit_dim
    print(f"  cudnn LSE presented as {'[B,H,S,1]' if cudnn_lse_has_unit_dim() else '[B,H,S]'} (meta kernel)")
    try_declined = frozenset(c for c in args.try_declined.split(",") if c)
    failing = 0
    for name in args.only or ENGINES:
        engine = engine_class(name)(device)
        print(f"\n== {name} ({engine.arch}) ==")
        for case in cases():
            try:
                status, text = check(name, engine, case, device, try_declined)
            except Exception:  # noqa: BLE001 - the harness side of the check broke
                status, text = "ERROR", traceback.format_exc(limit=2).strip().splitlines()[-1]
            failing += status in ("CRASH", "SUSPECT", "ERROR")
            note = f"  [{case.note}]" if case.note else ""
            print(f"  {case.label:20s} {status:8s} {text}{note}")
    print(f"\n{failing} crashed/suspect")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
