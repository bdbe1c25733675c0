"""Does PyTorch's cuDNN attention serve ragged (varlen) batches? One experiment on a GPU:
run `_cudnn_attention_forward` and `_cudnn_attention_backward` with `cum_seq_q/k` on
token-major [T, H, D] inputs and compare O and dQ, dK, dV with a float64 per-sequence
reference; print what the op returned and the worst errors. Decides whether the
torch-cudnn engine may serve ragged graphs (it declines them while this fails).

    python bench/cudnn_varlen_check.py          # needs a CUDA GPU
"""
from __future__ import annotations

import sys

import torch


def reference(q, k, v, do, cq, ck, causal):
    """float64 O and dQ, dK, dV, one sequence at a time (autograd)."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    outs = []
    for b in range(len(cq) - 1):
        qs, ks, vs = q[cq[b]:cq[b + 1]].transpose(0, 1), k[ck[b]:ck[b + 1]].transpose(0, 1), v[ck[b]:ck[b + 1]].transpose(0, 1)
        s = qs @ ks.transpose(1, 2) / qs.shape[-1] ** 0.5
        if causal:   # bottom-right per sequence
            i = torch.arange(qs.shape[1], device=q.device)[:, None]
            j = torch.arange(ks.shape[1], device=q.device)[None, :]
            s = s.masked_fill(j - i > ks.shape[1] - qs.shape[1], float("-inf"))
        outs.append((torch.softmax(s, -1) @ vs).transpose(0, 1))
    o = torch.cat(outs)
    grads = torch.autograd.grad(o, (q, k, v), do.double())
    return o.detach(), grads


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name())
    torch.manual_seed(0)
    dev, dt, H, D = "cuda", torch.bfloat16, 2, 64
    worst = 0.0
    for lengths_q, lengths_k, causal in (((64, 64), (64, 64), False), ((37, 100, 5), (80, 100, 17), False),
                                         ((37, 100, 5), (80, 100, 17), True)):
        cq = [0]
        ck = [0]
        for a, b in zip(lengths_q, lengths_k):
            cq.append(cq[-1] + a)
            ck.append(ck[-1] + b)
        q = torch.randn(cq[-1], H, D, device=dev, dtype=dt)
        k = torch.randn(ck[-1], H, D, device=dev, dtype=dt)
        v = torch.randn(ck[-1], H, D, device=dev, dtype=dt)
        do = torch.randn(cq[-1], H, D, device=dev, dtype=dt)
        cuq = torch.tensor(cq, device=dev, dtype=torch.int32)
        cuk = torch.tensor(ck, device=dev, dtype=torch.int32)
        label = f"lengths q {lengths_q} kv {lengths_k} causal {causal}"
        step = "_cudnn_attention_forward"
        try:
            fwd = torch.ops.aten._cudnn_attention_forward(
                q, k, v, None, cuq, cuk, max(lengths_q), max(lengths_k), True, 0.0, causal)
            o, lse, seed, offset = fwd[0], fwd[1], fwd[6], fwd[7]
            print(f"{label}: forward gave o {tuple(o.shape)}, lse {tuple(lse.shape)}")
            step = "_cudnn_attention_backward"
            dq, dk, dv = torch.ops.aten._cudnn_attention_backward(
                do, q, k, v, o, lse, seed, offset, torch.empty(0, device=dev), cuq, cuk,
                max(lengths_q), max(lengths_k), 0.0, causal)
        except Exception as exc:   # the finding is what the op does
            print(f"{label}: {step} raised {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            worst = float("inf")
            continue
        ro, (rdq, rdk, rdv) = reference(q, k, v, do, cq, ck, causal)
        errs = {name: (got.double() - want).abs().max().item() / max(want.abs().max().item(), 1e-9)
                for name, got, want in (("o", o, ro), ("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv))}
        print(f"{label}: lse {tuple(lse.shape)}; relative max error " +
              ", ".join(f"{n} {e:.3g}" for n, e in errs.items()))
        worst = max(worst, *errs.values())
    verdict = "serves" if worst < 0.05 else "does not serve"
    print(f"cuDNN varlen {verdict} ragged batches here (worst relative error {worst:.3g})")
    return 0 if worst < 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
