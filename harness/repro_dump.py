"""`bundlegen repro --dump DIR`: a case's inputs, the engine's outputs and the float64
reference as .pt files, and `reproduce.py`, which needs only torch: it recomputes the
reference with autograd in float64 from the inputs, checks the dumped reference against
it, and exits 1 with the worst elements when the dumped outputs are outside the bound."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from bundlegen.graph import canonical_json
from bundlegen.harness.materialize import logical_inputs
from bundlegen.harness.repro import Repro

FILES = ("inputs.pt", "outputs.pt", "reference.pt", "case.json", "reproduce.py")


def dump(repro: Repro, folder: Path | str) -> list[Path]:
    """Write FILES into `folder` (made if missing); the paths written."""
    if repro.captured is None:
        raise ValueError(f"case {repro.case.id}: the engine did not run it ({repro.outcome.verdict}), "
                         "so there are no outputs to dump")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    m, tol = repro.captured.materialized, repro.captured.tolerance
    inputs = logical_inputs(m)
    graph = repro.case.graph
    torch.save({p: inputs[p] for p in graph.input_ports}, folder / "inputs.pt")
    torch.save({p: repro.captured.outputs[p].contiguous() for p in graph.output_ports}, folder / "outputs.pt")
    ref = m.reference
    honest = m.io_reference
    torch.save({**{p: ref.gradient(p).cpu() for p in graph.output_ports},
                **{f"mag_{p}": ref.magnitude(p).cpu() for p in graph.output_ports},
                **({f"honest_{p}": honest.gradient(p).cpu() for p in graph.output_ports} if honest else {})},
               folder / "reference.pt")
    a = repro.case.graph.attributes
    meta = {"case": repro.case.to_json(), "engine": repro.engine, "device": repro.device,
            "verdict": repro.outcome.verdict, "detail": repro.outcome.detail,
            "tolerance": tol.to_json(),
            "attributes": a.to_json()}
    (folder / "case.json").write_text(canonical_json(meta), encoding="utf-8")
    (folder / "reproduce.py").write_text(SCRIPT, encoding="utf-8")
    return [folder / name for name in FILES]


SCRIPT = '''\
"""Reproduce a bundlegen case with plain torch (written by `bundlegen repro --dump`).

python reproduce.py   exit 1: the dumped engine outputs are outside the tolerance, or a
                      (batch, head) slice errs more than k x the dumped io-precision
                      reference plus the floor (failure reproduced); exit 0: they are
                      inside; exit 3: the dumped reference disagrees with this script's own.
"""
import json
import math
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
meta = json.loads((HERE / "case.json").read_text())
inputs = torch.load(HERE / "inputs.pt")
outputs = torch.load(HERE / "outputs.pt")
reference = torch.load(HERE / "reference.pt")
attrs, tol = meta["attributes"], meta["tolerance"]


def keep_mask(s_q, s_kv):
    """cuDNN mask semantics: (i, j) kept iff j' - i <= right and i - j' < left."""
    i = torch.arange(s_q).view(-1, 1)
    j = torch.arange(s_kv).view(1, -1)
    if attrs["diagonal_alignment"] == "BOTTOM_RIGHT":
        j = j - (s_kv - s_q)
    keep = torch.ones(s_q, s_kv, dtype=torch.bool)
    if attrs["right_bound"] is not None:
        keep &= (j - i) <= attrs["right_bound"]
    if attrs["left_bound"] is not None:
        keep &= (i - j) < attrs["left_bound"]
    return keep


def sdpa_backward(q, k, v, do, bias=None, sinks=None):
    """dQ, dK, dV (and dBias over the bias's full dims, dSinks) of sum(O * dO) in float64,
    with the softcap, bias and sinks of docs/CONTRACTS.md; a row with no kept key (and no
    sink) has O = 0."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    extra = {n: t.detach().double().requires_grad_() for n, t in (("bias", bias), ("sinks", sinks))
             if t is not None}
    h_q = q.shape[1]
    k_all = k.repeat_interleave(h_q // k.shape[1], dim=1)
    v_all = v.repeat_interleave(h_q // v.shape[1], dim=1)
    scores = (q @ k_all.transpose(-1, -2)) * attrs["attn_scale"]
    if attrs.get("softcap") is not None:
        scores = attrs["softcap"] * torch.tanh(scores / attrs["softcap"])
    if "bias" in extra:
        scores = scores + extra["bias"]
    keep = keep_mask(q.shape[2], k.shape[2])
    scores = scores.masked_fill(~keep, -math.inf)
    top = scores.amax(-1, keepdim=True)
    sink = extra["sinks"].view(1, -1, 1, 1) if "sinks" in extra else None
    if sink is not None:
        top = torch.maximum(top, sink.expand_as(top))
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top)).detach()
    p = torch.exp(scores - top)
    total = p.sum(-1, keepdim=True)
    if sink is not None:
        total = total + torch.exp(sink - top)
    p = p / torch.where(total > 0, total, torch.ones_like(total))
    (p @ v_all * do.double()).sum().backward()
    grads = {"dq": q.grad, "dk": k.grad, "dv": v.grad}
    if "bias" in extra and "dbias" in reference:
        want = reference["dbias"].shape
        axes = [a for a in range(4) if want[a] == 1 and extra["bias"].shape[a] > 1]
        grads["dbias"] = extra["bias"].grad.sum(axes, keepdim=True) if axes else extra["bias"].grad
    if "sinks" in extra and "dsinks" in reference:
        grads["dsinks"] = extra["sinks"].grad
    return grads


mine = sdpa_backward(inputs["q"], inputs["k"], inputs["v"], inputs["do"], inputs.get("bias"),
                     inputs.get("sinks"))
for port, grad in mine.items():
    scale = reference["mag_" + port].max().item() or 1.0
    gap = (grad - reference[port]).abs().max().item() if grad.numel() else 0.0
    if not gap <= 1e-9 * scale + 1e-12:
        print(f"{port}: this script's reference differs from the dumped one by {gap:.3g}")
        sys.exit(3)

g = meta["case"]["graph"]["tensors"]
print(f"case {meta['case']['id']} on {meta['engine']} ({meta['device']}): harness verdict {meta['verdict']}")
print("  q " + str(g["q"]["dims"]) + ", k " + str(g["k"]["dims"]) + ", v " + str(g["v"]["dims"])
      + f", {g['q']['dtype']}, attributes {attrs}")
worst, wrong = [], 0
for port in outputs:
    got, ref = outputs[port].double(), reference[port]
    bound = reference["mag_" + port] * tol["rtol"] + tol["atol"]
    err = (got - ref).abs()
    bad = ~(err <= bound)
    wrong += int(bad.sum())
    excess = torch.where(torch.isfinite(err), err / bound, torch.full_like(err, math.inf))
    for flat in torch.topk(excess.flatten().nan_to_num(nan=math.inf), min(3, excess.numel())).indices.tolist():
        index = tuple(int(x) for x in torch.unravel_index(torch.tensor(flat), err.shape))
        worst.append((excess[index].item(), port, index, got[index].item(), ref[index].item(), bound[index].item()))
for excess, port, index, got, ref, bound in sorted(worst, key=lambda w: -w[0])[:5]:
    print(f"  {port}{list(index)} got {got:.6g} reference {ref:.6g} bound {bound:.3g} ({excess:.3g}x)")
if wrong:
    print(f"reproduced: {wrong} element(s) outside rtol={tol['rtol']:g} atol={tol['atol']:g}")
    sys.exit(1)
unlike = []
for port in outputs:
    if "honest_" + port not in reference or tol.get("k") is None:
        continue
    got, ref, honest = outputs[port].double(), reference[port], reference["honest_" + port].double()
    lead = 2 if got.dim() == 4 and port != "dsinks" else 0
    shape = got.shape[:lead]
    for index in (torch.cartesian_prod(*[torch.arange(n) for n in shape]).view(-1, lead).tolist() if lead else [()]):
        g, r, h = got[tuple(index)], ref[tuple(index)], honest[tuple(index)]
        if not r.norm() > 0:
            continue
        for measure, e, o, floor in (("relative RMS error", (g - r).norm() / r.norm(), (h - r).norm() / r.norm(), tol["floor"]),
                                     ("max |error|", (g - r).abs().max(), (h - r).abs().max(), tol["floor"] * r.abs().max())):
            if e > tol["k"] * o + floor:
                unlike.append(f"{port}{list(index)}: {measure} {float(e):.3g} against the io-precision "
                              f"reference's {float(o):.3g} (k {tol['k']:g}, floor {tol['floor']:g})")
if unlike:
    print("reproduced: the statistical judge fails " + "; ".join(unlike[:5]))
    sys.exit(1)
print("not reproduced: every element is inside the tolerance and every slice inside the statistical judge")
'''
