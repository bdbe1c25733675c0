"""One prepared device call: the Triton engine's backward against torch-cudnn, torch-flash and
FlexAttention's compiled backward (same score_mod) over the headline shapes, and candidate
block configurations of the Triton kernels, in one process, within a wall-clock budget.

Made for scarce device minutes: everything that can be decided without a GPU is decided
before (`--resources` compiles each candidate for sm90 on the CPU and prints its registers,
spills and shared memory; CANDIDATES keeps the ones that do not spill where the table's
config does not), and the call itself

* compiles the Triton candidates and the FlexAttention graphs first, in `--jobs` processes
  side by side (into the shared Triton and Inductor caches), then times everything in this
  process, the most wanted rows first (PLAN order);
* writes its JSON (`--out`, default $OUT/speed_batch.json) after every measurement, so a
  call cut short returns what it measured; `--resume FILE` skips what FILE already has;
* stops itself before `--budget-s` (default 500) seconds: no new step starts past
  budget - `--margin-s`, and an alarm ends the process at the budget with the JSON written;
* prints each row's ratios (triton / peer: above 1 is faster) and its profile
  (bench/kernel_profile.py: each launch's time, registers, spills, shared memory, CTAs per
  SM and TFLOP/s or GB/s, and the `bound` line; JSON `profiles`), and at the end the best
  candidate per kernel and case against the table's config and each row's bound and best
  configuration (JSON `best`, the table's own included).

    python bench/speed_batch.py --device cuda --budget-s 500          # the device call
    python bench/speed_batch.py --cases d128-bias --candidates 'previous*'   # the table against what it replaced
    python bench/speed_batch.py --list                                 # the plan, no GPU
    python bench/speed_batch.py --resources [--jobs 2]                 # CPU: sm90 resources
    python bench/speed_batch.py --device cpu --budget-s 120            # smoke test (interpreter)

Times: triton.testing.do_bench medians (ms) of the backward alone; the torch peers' aten op
alone (bench/engine_speed.py's basis), FlexAttention's autograd backward of one compiled
forward (retain_graph), the Triton engine's launch (preprocess, dK/dV, dQ, dBias) on a
prepared Launch. Each case's engines are timed in two rounds in turns (triton first, then
last) and each cell is the median of its rounds. FLOPs as docs/PERFORMANCE.md's (2.5 x 4 B
H_q S_q S_kv D, halved for causal); ragged rows count each sequence's own S_q_b S_kv_b.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import signal
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.tune_triton import describe, with_tiles  # noqa: E402
from bench import kernel_profile as KP  # noqa: E402
from bundlegen.engines.triton.configs import BlockConfig, config_for  # noqa: E402

ARCH = "sm90"
PEERS = ("torch-cudnn", "torch-flash", "flex")
SOFTCAP = 30.0
DROPOUT_P = 0.1
#: a ragged batch of about 16k tokens with mixed lengths (FlashAttention varlen's use)
RAGGED_LENGTHS = (512, 3072, 1024, 2048, 256, 4096, 1536, 768, 2560, 384)


# ----------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    """One row: a shape, a mask and at most one score modifier."""
    name: str
    D: int = 128
    causal: bool = False
    H_kv: int = 16
    #: none | bias | bias-dbias | bias-bcast-dbias | alibi | softcap | drop-port | drop-drawn
    mod: str = "none"
    ragged: bool = False
    B: int = 4
    H_q: int = 16
    S: int = 4096

    @property
    def flops(self) -> float:
        if self.ragged:
            pairs = sum(n * (n + 1) / 2 if self.causal else n * n for n in RAGGED_LENGTHS)
            return 2.5 * 4 * self.H_q * pairs * self.D
        full = 2.5 * 4 * self.B * self.H_q * self.S * self.S * self.D
        return full / 2 if self.causal else full


def _rows() -> list[Case]:
    """The rows in the order they are timed (the most wanted first)."""
    rows = [Case("d128-full"), Case("d128-causal", causal=True)]
    rows += [Case(f"d128-{m}", mod=m) for m in ("bias", "bias-dbias", "bias-bcast-dbias", "alibi", "softcap")]
    rows += [Case("d64-full", D=64), Case("d64-causal", D=64, causal=True),
             Case("d128-gqa-full", H_kv=2), Case("d128-gqa-causal", H_kv=2, causal=True),
             Case("d64-gqa-full", D=64, H_kv=2)]
    rows += [Case(f"ragged-d{d}-{'causal' if c else 'full'}", D=d, causal=c, ragged=True, B=len(RAGGED_LENGTHS))
             for d in (128, 64) for c in (False, True)]
    rows += [Case(f"d{d}-{m}", D=d, mod=m) for d in (64, 128) for m in ("drop-port", "drop-drawn")]
    rows += [Case(f"d{d}-causal-{m}", D=d, causal=True, mod=m) for d in (64, 128) for m in ("drop-port", "drop-drawn")]
    for d in (192, 256):
        rows += [Case(f"d{d}-full", D=d)] + [Case(f"d{d}-{m}", D=d, mod=m) for m in ("drop-port", "drop-drawn")]
    rows += [Case(f"d128-causal-{m}", causal=True, mod=m) for m in ("bias", "alibi", "softcap")]
    rows += [Case(f"d64-{m}", D=64, mod=m) for m in ("bias", "bias-dbias", "alibi", "softcap")]
    return rows


CASES = {c.name: c for c in _rows()}


# ----------------------------------------------------------------------------- candidates
def bare(cfg: BlockConfig) -> BlockConfig:
    """cfg without the configs a launch may switch to (banded, atomic dQ, pointer loads, the
    score modifiers' and dropout's: BlockConfig.switches): what a candidate changes."""
    return replace(cfg, banded=None, pointer_loads=None, atomic_dq=None, modifiers=None, dropout=None,
                   drawn_dropout=None)


@dataclass(frozen=True)
class Candidate:
    """A block configuration to time on some cases, as a change of the table's config (its
    own tiles, not those of the score modifiers' or dropout's config it switches to): the
    dK/dV kernel's or the dQ kernel's (M, N, warps, stages), flags; tiles None: that config
    unchanged (the one modifier and dropout launches ran before they had configs of their
    own, BlockConfig.modifiers / dropout / drawn_dropout)."""
    label: str
    kernel: str                       # dkdv | dq | dbias
    tiles: tuple[int, ...] | None     # dbias: (M, N, warps)
    dp_first: bool | None = None      # None: the table's
    split: bool = False               # dK and dV in two passes (BlockConfig.split_dkdv)
    #: kernel "backward": the table's config (its modifiers' included) with dBias stored by the
    #: dK pass (BlockConfig.fused_dbias), timed whole against the table's whole backward
    fused_dbias: bool = False
    tma: bool | None = None           # None: the table's
    #: the dV-only pass's (M, N, warps, stages) (BlockConfig.dv_pass); None: the table's
    dv_pass: tuple[int, int, int, int] | None = None
    cases: tuple[str, ...] = ()

    def config(self, table: BlockConfig) -> BlockConfig:
        if self.fused_dbias:   # on the config the launch switches to (BlockConfig.switches)
            return replace(table, fused_dbias=True, **({"modifiers": replace(table.modifiers, fused_dbias=True)}
                                                       if table.modifiers is not None else {}))
        base = bare(table)
        if self.kernel == "dbias":   # (M, N, warps): the dBias kernel alone (launch.dbias_tiles)
            return replace(base, dbias_tiles=self.tiles)
        cfg = base if self.tiles is None else (
            with_tiles(base, dkdv=self.tiles) if self.kernel == "dkdv" else with_tiles(base, dq=self.tiles))
        if self.dp_first is not None:
            cfg = replace(cfg, dp_first=self.dp_first)
        if self.tma is not None:
            cfg = replace(cfg, tma=self.tma)
        if self.dv_pass is not None:
            cfg = replace(cfg, dv_pass=self.dv_pass)
        return replace(cfg, split_dkdv=self.split or cfg.split_dkdv)


PLAIN_128 = ("d128-full", "d128-causal")
MODS_128 = ("d128-bias", "d128-bias-dbias", "d128-alibi", "d128-softcap")
DBIAS_128 = ("d128-bias-dbias",)
DROP = ("d64-drop-port", "d64-drop-drawn", "d128-drop-port", "d128-drop-drawn")
DROP_BANDED = ("d64-causal-drop-port", "d64-causal-drop-drawn", "d128-causal-drop-port", "d128-causal-drop-drawn")
WIDE_DROP = ("d192-drop-port", "d192-drop-drawn", "d256-drop-port", "d256-drop-drawn")
#: the label prefix of the candidates that are the config a launch ran before (tiles None)
PREVIOUS = "previous"

#: Chosen on the CPU (`--resources`: sm90 registers / spills / shared memory, the docstring
#: of each group says what was kept and why); the table's own config is always timed too.
CANDIDATES = (
    # D 128 plain: the dK/dV tiles around the table's 64 x 128 (8 warps, 3 stages, TMA, dP
    # first), the dQ kernel's around 128 x 64 (8 warps, 3 stages); split dK / dV passes
    Candidate("dkdv 64x128 w8 s2", "dkdv", (64, 128, 8, 2), cases=PLAIN_128),
    Candidate("dkdv 64x128 w8 s4", "dkdv", (64, 128, 8, 4), cases=PLAIN_128),
    Candidate("dkdv 64x64 w4 s3 dpf", "dkdv", (64, 64, 4, 3), dp_first=True, cases=PLAIN_128),
    Candidate("dkdv 64x128 w8 s3 no-dpf", "dkdv", (64, 128, 8, 3), dp_first=False, cases=PLAIN_128),
    Candidate("dkdv 128x128 w8 s2", "dkdv", (128, 128, 8, 2), cases=PLAIN_128),
    Candidate("dkdv 64x128 w8 s3 split", "dkdv", (64, 128, 8, 3), split=True, dp_first=False, cases=PLAIN_128),
    Candidate("dkdv 32x128 w4 s3", "dkdv", (32, 128, 4, 3), cases=PLAIN_128),
    Candidate("dkdv 64x128 w8 s3 no-tma", "dkdv", (64, 128, 8, 3), tma=False, cases=PLAIN_128),
    Candidate("dq 128x64 w8 s2", "dq", (128, 64, 8, 2), cases=PLAIN_128),
    Candidate("dq 128x128 w8 s2", "dq", (128, 128, 8, 2), cases=PLAIN_128),
    Candidate("dq 64x128 w4 s3", "dq", (64, 128, 4, 3), cases=PLAIN_128),
    Candidate("dq 128x32 w8 s4", "dq", (128, 32, 8, 4), cases=PLAIN_128),
    Candidate("dq 64x64 w4 s4", "dq", (64, 64, 4, 4), cases=PLAIN_128),
    # D 128 with score modifiers: the table runs the plain tiles (64 x 128, 8 warps) with
    # the bias / softcap / ALiBi tiles on top. sm90 spills (`--resources --only d128-bias-dbias`,
    # the bias read in vectors): the table's dK/dV 192 bytes, dQ 0; dK/dV 32 x 64 (4 warps,
    # 3 stages) 0, 64 x 64 and 64 x 128 (2 stages) 192; every dQ candidate 0. Left out:
    # dK/dV 32 x 128 (4 warps, 3 stages), 1168
    # the tiles modifier launches ran before sm90's D 128 tier had a modifiers config (32 x 64
    # dK/dV on 4 warps: the table timed against them); dQ is unchanged
    Candidate(f"{PREVIOUS} mods dkdv", "dkdv", None, cases=MODS_128),
    Candidate("mods dkdv 64x64 w4 s3", "dkdv", (64, 64, 4, 3), cases=MODS_128),
    Candidate("mods dkdv 32x64 w4 s3", "dkdv", (32, 64, 4, 3), cases=MODS_128),
    Candidate("mods dkdv 64x128 w8 s2", "dkdv", (64, 128, 8, 2), cases=MODS_128),
    Candidate("mods dq 64x64 w4 s1", "dq", (64, 64, 4, 1), cases=MODS_128),
    Candidate("mods dq 128x32 w8 s1", "dq", (128, 32, 8, 1), cases=MODS_128),
    # the dBias kernel (a pass of its own recomputing S and dP per dBias tile, reloading Q, K,
    # dO and V per tile): the table's 32 x 32 tiles on 4 warps (151 registers, 4 KB shared)
    # read those operands for each 32 x 32 output tile; larger tiles read them fewer times.
    # sm90 (`--resources --only d128-bias-dbias --candidates 'dbias*'`): 64 x 64 on 4 warps 255
    # registers, on 8 warps 218; 128 x 64 and 64 x 128 on 8 warps 255 / 254; none spills (one
    # stage: 8-16 KB shared). Left out: 128 x 128 on 8 warps, 632 bytes spilled
    # ALiBi slopes: the table's dK/dV (32 x 64, 4 warps) spills 120 bytes with them (255
    # registers); sm90 (`--resources --only d128-alibi --candidates 'alibi*'`): 32 x 32 on 4
    # warps 242 registers, 16 x 64 250, neither spills
    Candidate("alibi dkdv 32x32 w4 s3", "dkdv", (32, 32, 4, 3), cases=("d128-alibi",)),
    Candidate("alibi dkdv 16x64 w4 s3", "dkdv", (16, 64, 4, 3), cases=("d128-alibi",)),
    # dBias stored by the dK pass as it forms dS (no second pass): the whole backward. sm90
    # (`--resources --only d128-bias-dbias --candidates 'fused*'`): its dK/dV kernel on the
    # modifiers' 32 x 64 tiles (4 warps) 255 registers, 208 bytes spilled (without: 251, none)
    Candidate("fused dbias", "backward", None, fused_dbias=True, cases=DBIAS_128),
    Candidate("dbias 64x64 w4", "dbias", (64, 64, 4), cases=DBIAS_128),
    Candidate("dbias 64x64 w8", "dbias", (64, 64, 8), cases=DBIAS_128),
    Candidate("dbias 128x64 w8", "dbias", (128, 64, 8), cases=DBIAS_128),
    Candidate("dbias 64x128 w8", "dbias", (64, 128, 8), cases=DBIAS_128),
    # dropout (declined on sm90 at D 64 / 128: the table's tiles spill). sm90, D 128
    # (`--resources --only d128-drop`, the mask port's tiles read in vectors), spill bytes
    # port / drawn: the table's dK/dV 392 / 896, dQ 0 / 240. Kept: dK/dV 32 x 32 (4 warps, 3
    # stages; drawn 0), 16 x 64 (drawn 8), 32 x 64 (8 / 232); dQ 128 x 32 (8 warps, 1 stage;
    # 0 / 0). Left out, spilling as much as the table or more: dK/dV 64 x 64 (2 stages: 384 /
    # 888), 32 x 128 (2 stages: 1424 / 1744); dQ 64 x 64 (1 stage: drawn 304). D 64 (drawn):
    # the table's dK/dV 816, dQ 0; dK/dV 32 x 32, 16 x 64 and 32 x 64 0; dQ 128 x 32 0
    # The table's dropout configs now (sm90 dropout / drawn_dropout, D 64 and 128) against
    # the tiles they ran before (spilling; `previous`), and tiles around them. Zero-spill
    # in the aligned dense variants (`--resources --only drop`): D 128 dK/dV 32 x 64 on 8 warps
    # with the mask port (the table's; drawn 96 bytes), 16 x 64 and 32 x 32 on 8 warps drawn
    # (16 x 64 is the table's); D 64 32 x 64 on 4 warps (the table's); the dQ kernel's 64 x 32
    # on 4 warps with the mask port at D 128 (the table's: 128 x 64 on 8 warps spilled 536-792
    # bytes reading the mask element by element), 128 x 32 on 8 warps drawn (the table's)
    Candidate(f"{PREVIOUS} drop dkdv", "dkdv", None, cases=DROP + DROP_BANDED + WIDE_DROP),
    Candidate(f"{PREVIOUS} drop dq", "dq", None, cases=DROP + DROP_BANDED + WIDE_DROP),
    Candidate("drop dkdv 32x64 w8 s3", "dkdv", (32, 64, 8, 3), cases=DROP),
    Candidate("drop dkdv 16x64 w8 s3", "dkdv", (16, 64, 8, 3), cases=DROP),
    Candidate("drop dkdv 32x32 w8 s3", "dkdv", (32, 32, 8, 3), cases=DROP),
    Candidate("drop dkdv 32x32 w4 s3", "dkdv", (32, 32, 4, 3), cases=DROP),
    Candidate("drop dkdv 16x64 w4 s3", "dkdv", (16, 64, 4, 3), cases=DROP),
    Candidate("drop dkdv 32x64 w4 s3", "dkdv", (32, 64, 4, 3), cases=DROP),
    Candidate("drop dq 128x32 w8 s1", "dq", (128, 32, 8, 1), cases=DROP),
    Candidate("drop dq 64x32 w4 s1", "dq", (64, 32, 4, 1), cases=DROP),
    # dropout at D 192 and 256 (WIDE_DROP; declined on sm90 before: the tiers' tiles spilled
    # 344-640 bytes at D 192, 16-624 at D 256, `previous`). sm90 (`--resources --only drop`,
    # the aligned dense variants): split dK / dV passes on 16 x 128 tiles (8 warps), dV 64 x 64
    # (8 warps), dQ 128 x 16 spill nothing (the table's first choice, now its drawn config at
    # D 192), nor do these: D 192 the tier's own 32 x 128 tiles split (the one-pass kernel
    # spills 112-672 on every tile tried), drawn 16 x 64 (8 warps) with dV 64 x 64; D 256 with
    # the mask port 32 x 64 on 4 warps with dV 64 x 64 (adopted); dQ 64 x 32 on 4 warps with
    # the mask port (D 192: 0, D 256: 16; adopted). D 256 drawn spills 48 on 16 x 64 (8 warps;
    # the table's 16 x 32 on 4 warps none): timed to see what the spill costs
    Candidate("wide drop dk 32x128 w8 s2 split", "dkdv", (32, 128, 8, 2), split=True,
              cases=("d192-drop-port",)),
    Candidate("wide drop dk 16x64 w8 s2 split dv 64x64", "dkdv", (16, 64, 8, 2), split=True,
              dv_pass=(64, 64, 8, 2), cases=("d192-drop-drawn", "d256-drop-drawn")),
    Candidate("wide drop dk 32x64 w4 s2 split dv 64x64", "dkdv", (32, 64, 4, 2), split=True,
              dv_pass=(64, 64, 8, 2), cases=("d256-drop-port",)),
    Candidate("wide drop dq 64x32 w4 s1", "dq", (64, 32, 4, 1), cases=("d192-drop-port", "d256-drop-port")),
    # D 64 plain: around the table's 32 x 128 (4 warps, 4 stages) and 64 x 64 dQ
    Candidate("d64 dkdv 64x128 w8 s3", "dkdv", (64, 128, 8, 3), cases=("d64-full", "d64-causal")),
    Candidate("d64 dkdv 64x64 w4 s4", "dkdv", (64, 64, 4, 4), cases=("d64-full", "d64-causal")),
    Candidate("d64 dq 128x64 w8 s3", "dq", (128, 64, 8, 3), cases=("d64-full", "d64-causal")),
    Candidate("d64 dq 128x64 w4 s3", "dq", (128, 64, 4, 3), cases=("d64-full", "d64-causal")),
)


# ----------------------------------------------------------------------------- graphs, tensors
def graph_for(case: Case):
    """The case's graph (bf16, BHSD or THD, bottom-right diagonal)."""
    from bundlegen.graph_shapes import dense_graph, ragged_graph, with_modifiers
    right = 0 if case.causal else None
    if case.ragged:
        cu = [0]
        for n in RAGGED_LENGTHS:
            cu.append(cu[-1] + n)
        return ragged_graph(tuple(cu), H_q=case.H_q, H_k=case.H_kv, D_qk=case.D, dtype="bf16",
                            alignment="BOTTOM_RIGHT", right=right)
    g = dense_graph(B=case.B, H_q=case.H_q, H_k=case.H_kv, S_q=case.S, D_qk=case.D, dtype="bf16",
                    alignment="BOTTOM_RIGHT", right=right)
    kw = {"bias": dict(bias="full"), "bias-dbias": dict(bias="full", dbias=True),
          "bias-bcast-dbias": dict(bias="both", dbias=True), "alibi": dict(alibi_slopes="head"),
          "softcap": dict(softcap=SOFTCAP), "drop-port": dict(dropout=DROPOUT_P),
          "drop-drawn": dict(dropout=DROPOUT_P, dropout_mask=None), "none": {}}[case.mod]
    return with_modifiers(g, **kw) if kw else g


def tensors_for(case: Case, graph, device):
    """Random inputs (O random, LSE log(S_kv) + 2: every P finite; the speed does not depend
    on them), zeroed outputs, the modifiers' ports and a ragged batch's offsets."""
    import torch

    from bench.engine_speed import empty_as
    torch.manual_seed(0)
    t = {p: empty_as(spec, device) for p, spec in graph.tensors.items()}
    for p, x in t.items():
        if p == "stats":
            x.fill_(math.log(graph.S_kv) + 2.0)
        elif p == "alibi_slopes":
            x.copy_(torch.tensor([2.0 ** (-8 * (h + 1) / graph.H_q) for h in range(graph.H_q)]))
        elif p == "dropout_mask":
            x.copy_((torch.rand(x.shape, device=device) >= DROPOUT_P).to(x.dtype))
        elif p in ("dq", "dk", "dv", "dbias"):
            x.zero_()
        else:
            x.copy_(torch.randn(x.shape, device=device) * (0.5 if p == "bias" else 1.0))
    if graph.ragged is not None:
        cu = [0]
        for n in RAGGED_LENGTHS:
            cu.append(cu[-1] + n)
        for name in ("cu_seqlens_q", "cu_seqlens_kv"):
            t[name] = torch.tensor(cu, dtype=torch.int32, device=device)
    return t


def table_config(case: Case, graph) -> BlockConfig:
    """The config the engine runs for the case (TritonEngine.config; never atomic dQ)."""
    from bundlegen.engines.triton.engine import banded
    return config_for(ARCH, graph.D_qk, graph.D_v, banded(graph))


# ----------------------------------------------------------------------------- triton timing
def triton_stages(graph, tensors, cfg: BlockConfig):
    """(prepared Launch, {stage: fn}) of the Triton kernels: the whole backward and each of its
    kernels (dk/dv, dq, dbias where the graph has dBias)."""
    from bundlegen.engines.triton import launch as L
    prepared = L.prepare(graph.as_launched(), tensors, cfg)
    stages = {"backward": lambda: L.run(prepared), "dkdv": lambda: L.run_dkdv(prepared),
              "dq": lambda: L.run_dq(prepared)}
    if "dbias" in graph.tensors:
        stages["dbias"] = lambda: L.run_dbias(prepared)
    return prepared, stages


def _outputs(tensors) -> dict:
    return {p: tensors[p].float().clone() for p in ("dq", "dk", "dv", "dbias") if p in tensors}


def rel_diff(ours: dict, ref: dict) -> float:
    """max over the outputs of max |a - b| / max |b| (a candidate against the table config)."""
    out = 0.0
    for p, b in ref.items():
        scale = float(b.abs().max()) or 1.0
        out = max(out, float((ours[p] - b).abs().max()) / scale)
    return out


# ----------------------------------------------------------------------------- peers
def flex_backward(case: Case, graph, device) -> Callable[[], object]:
    """FlexAttention (torch.compile'd) forward once with the case's modification as a
    score_mod (a causal mask as a block mask), and a function running its backward."""
    import torch
    import torch._dynamo
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    dt = torch.bfloat16
    B, H, S, D = case.B, case.H_q, case.S, case.D
    torch.manual_seed(0)
    q = torch.randn(B, H, S, D, device=device, dtype=dt, requires_grad=True)
    k = torch.randn(B, case.H_kv, S, D, device=device, dtype=dt, requires_grad=True)
    v = torch.randn(B, case.H_kv, S, D, device=device, dtype=dt, requires_grad=True)
    extra, score_mod = [], None
    if case.mod.startswith("bias"):
        shape = (S, S) if case.mod == "bias-bcast-dbias" else (B, H, S, S)
        bias = (torch.randn(shape, device=device, dtype=dt) * 0.5).requires_grad_(case.mod.endswith("dbias"))
        if bias.requires_grad:
            extra.append(bias)
        if bias.dim() == 2:
            def score_mod(score, b, h, i, j):
                return score + bias[i, j]
        else:
            def score_mod(score, b, h, i, j):
                return score + bias[b, h, i, j]
    elif case.mod == "alibi":
        slopes = torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)], device=device)

        def score_mod(score, b, h, i, j):
            return score - slopes[h] * (i - j).abs()
    elif case.mod == "softcap":
        def score_mod(score, b, h, i, j):
            return SOFTCAP * torch.tanh(score / SOFTCAP)
    block_mask = None
    if case.causal:
        block_mask = create_block_mask(lambda b, h, i, j: j <= i, None, None, S, S, device=device)
    for limit in ("cache_size_limit", "recompile_limit"):   # one compile per row: none falls back
        if hasattr(torch._dynamo.config, limit):               # to eager flex (the [S, S] math)
            setattr(torch._dynamo.config, limit, 256)
    flex = torch.compile(flex_attention, dynamic=False)
    out = flex(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=case.H_kv != H)
    do = torch.randn_like(out)
    inputs = (q, k, v, *extra)
    return lambda: torch.autograd.grad(out, inputs, do, retain_graph=True)


def peer_op(engine, graph, tensors) -> Callable[[], object] | str:
    """A torch peer's aten backward op alone, with the arguments its adapter built from one
    run (bench/engine_speed.py's basis), or why there is none (its decline, an error)."""
    from bench.engine_speed import captured_op_call, short_error
    try:
        reason = engine.is_applicable(graph)
        if reason:
            return f"declined: {reason}"
        captured = captured_op_call(engine, graph, tensors)
    except Exception as exc:  # noqa: BLE001 - recorded in the row
        return short_error(exc)
    if captured is None:
        return lambda: engine.run(graph, tensors)
    call, op, values = captured
    return lambda: call(op, values)


def flex_serves(case: Case) -> str | None:
    if case.ragged:
        return "ragged batch (flex compared on padded rows only)"
    if case.mod.startswith("drop"):
        return "dropout has no score_mod"
    return None


# ----------------------------------------------------------------------------- the record
class Record:
    """The JSON written after every measurement (tmp file + rename: never half-written)."""

    def __init__(self, path: Path, env: dict, settings: dict, resumed: dict | None):
        self.path = path
        self.data = resumed or {"rows": {}, "candidates": {}, "notes": []}
        for section in ("profiles", "best"):
            self.data.setdefault(section, {})
        self.data.update(environment=env, settings=settings)

    def done(self, section: str, key: str) -> bool:
        return key in self.data[section]

    def put(self, section: str, key: str, value) -> None:
        self.data[section][key] = value
        self.flush()

    def note(self, text: str) -> None:
        print(text, flush=True)
        self.data["notes"].append(text)
        self.flush()

    def flush(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.path)


class Budget:
    """The call's wall-clock budget, counted from the start of main (imports included)."""

    def __init__(self, seconds: float, margin: float, start: float):
        self.start, self.seconds, self.margin = start, seconds, margin

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed

    def allows(self, need: float = 0.0) -> bool:
        return self.left() > self.margin + need


# ----------------------------------------------------------------------------- precompile
def _warm_job(job: tuple) -> str:
    """Compile one thing in a worker process (into the shared caches): (device, "triton",
    case, candidate label or "") or (device, "flex", case, ""). A Triton job runs the case at
    B 1 and one K/V head (the same kernel variants: batch and heads are run-time values)."""
    device, kind, case = job[0], job[1], job[2]
    label = job[3]
    import torch
    device = torch.device(device)
    try:
        if kind == "flex":
            flex_backward(case, graph_for(case), device)()
        else:
            small = case if case.ragged else replace(case, B=1, H_q=case.H_q // case.H_kv, H_kv=1)
            graph = graph_for(small)
            tensors = tensors_for(small, graph, device)
            cfg = table_config(small, graph)
            if label:
                cfg = next(c for c in CANDIDATES if c.label == label).config(cfg)
            _, stages = triton_stages(graph, tensors, cfg)
            stages["backward"]()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return "ok"
    except Exception as exc:  # noqa: BLE001 - reported, the timing step skips it
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


#: processes of the precompile that compile FlexAttention graphs: each holds its row's
#: full-size inputs (a [4, 16, 4096, 4096] bias and its gradient), so not all at once
FLEX_JOBS = 6


def precompile(cases: list[Case], jobs: int, budget: Budget, record: Record, device) -> dict:
    """Compile every Triton candidate and FlexAttention graph of `cases` in spawned processes
    (`jobs` in all, at most FLEX_JOBS of them for FlexAttention), at most half the budget.
    (kind, case name, label) -> "ok" or its error."""
    import multiprocessing as mp
    work = []
    for case in cases:
        work.append(("triton", case.name, ""))
        work += [("triton", case.name, c.label) for c in CANDIDATES if case.name in c.cases]
        if flex_serves(case) is None and device.type == "cuda":
            work.append(("flex", case.name, ""))
    flex_jobs = min(FLEX_JOBS, jobs - 1) if any(kind == "flex" for kind, _, _ in work) else 0
    ctx = mp.get_context("spawn")
    pools = {"triton": ProcessPoolExecutor(jobs - flex_jobs, mp_context=ctx)}
    if flex_jobs > 0:
        pools["flex"] = ProcessPoolExecutor(flex_jobs, mp_context=ctx)
    futures = {pools[kind].submit(_warm_job, (str(device), kind, CASES[name], label)): (kind, name, label)
               for kind, name, label in work}
    done, pending = wait(futures, timeout=max(0.0, budget.left() * 0.5 - budget.margin))
    results: dict = {}
    for f in done:
        results[futures[f]] = f.result() if f.exception() is None else repr(f.exception())
    for f in pending:
        f.cancel()
    for pool in pools.values():
        for proc in list(getattr(pool, "_processes", {}).values()):   # stop compiles still running
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
    failed = {"/".join(j): r for j, r in results.items() if r != "ok"}
    record.note(f"precompiled {len(results)} of {len(work)} jobs in {jobs} processes "
                f"({budget.elapsed:.0f} s); {len(failed)} failed, {len(pending)} left to compile on use")
    record.data["precompile_failures"] = failed
    record.flush()
    return results


# ----------------------------------------------------------------------------- measuring
def make_timer(device, warmup_ms: int, rep_ms: int) -> Callable[[Callable], float]:
    if device.type == "cuda":
        from bench.engine_speed import cuda_timer
        return cuda_timer(warmup_ms, rep_ms)
    from bench.engine_speed import cpu_timer
    return cpu_timer(1)


def time_row(case: Case, engines: dict, timer, device, record: Record, budget: Budget) -> None:
    """The table config's backward (and its stages) against each peer, two rounds in turns."""
    import torch

    graph = graph_for(case)
    tensors = tensors_for(case, graph, device)
    row = {"case": asdict(case), "tflop": case.flops / 1e12, "cells": {}, "stages_ms": {}}
    cfg = table_config(case, graph)
    prepared, stages = triton_stages(graph, tensors, cfg)
    row["table_config"] = asdict(prepared.cfg)   # the one the launch runs (BlockConfig.switches)
    calls: dict[str, Callable] = {"triton": stages["backward"]}
    for name in PEERS:
        if name == "flex":
            reason = flex_serves(case)
            if reason is None and device.type == "cuda":
                try:
                    calls["flex"] = flex_backward(case, graph, device)
                except Exception as exc:  # noqa: BLE001 - recorded in the row
                    row["cells"]["flex"] = {"note": f"error: {type(exc).__name__}: {str(exc)[:200]}"}
            else:
                row["cells"]["flex"] = {"note": reason or "flex: cuda only"}
            continue
        engine = engines.get(name)
        if engine is None or isinstance(engine, Exception):
            row["cells"][name] = {"note": f"engine unavailable: {engine!r}"[:200]}
            continue
        op = peer_op(engine, graph.as_launched(), tensors)
        if isinstance(op, str):
            row["cells"][name] = {"note": op}
        else:
            calls[name] = op
    rounds: dict[str, list[float]] = {n: [] for n in calls}
    order = list(calls)
    for turn in (order, order[1:] + order[:1]):
        for name in turn:
            try:
                calls[name]()   # first call: compiles what the precompile did not
                if device.type == "cuda":
                    torch.cuda.synchronize()
                rounds[name].append(timer(calls[name]))
            except Exception as exc:  # noqa: BLE001 - recorded, the row goes on
                row["cells"].setdefault(name, {})["note"] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
    for name, times in rounds.items():
        if times:
            row["cells"].setdefault(name, {}).update(ms=statistics.median(times), rounds=times)
    for stage in ("dkdv", "dq", "dbias"):
        if stage in stages and budget.allows():
            try:
                row["stages_ms"][stage] = timer(stages[stage])
            except Exception as exc:  # noqa: BLE001
                row["stages_ms"][stage] = f"error: {type(exc).__name__}: {str(exc)[:160]}"
    row["ratios"] = ratios(row)
    record.put("rows", case.name, row)
    print(row_line(case, row), flush=True)
    if budget.allows():
        profile_row(case, prepared, device, record)


def work_of(case: Case) -> "KP.Work":
    """The row's work for its profile (kernel_profile.Work): its visible pairs from its FLOP
    count (2.5 x 4 x pairs x D), its query rows, its bias elements."""
    rows = sum(RAGGED_LENGTHS) if case.ragged else case.B * case.S
    bias = {"bias": case.B * case.H_q * case.S ** 2, "bias-dbias": case.B * case.H_q * case.S ** 2,
            "bias-bcast-dbias": case.S ** 2}.get(case.mod, 0)
    return KP.Work(pairs=case.flops / (10 * case.D), D_qk=case.D, D_v=case.D, q_elems=rows * case.H_q,
                   bias_elems=bias)


def profile_row(case: Case, prepared, device, record: Record) -> None:
    """The row's table config, launch by launch (kernel_profile): written as soon as measured."""
    try:
        launches = KP.profile_launch(prepared, work_of(case), device, ARCH)
        prof = KP.profile_record(launches, record.data["environment"].get("gpu", ""))
    except Exception as exc:  # noqa: BLE001 - recorded, the batch goes on
        prof = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    record.put("profiles", case.name, prof)
    print(profile_line(case.name, prof), flush=True)


def profile_line(name: str, prof: dict) -> str:
    if "error" in prof:
        return f"  profile {name}: {prof['error']}"
    split = ", ".join(f"{p['kernel']} {p['ms']:.3f} ms" + (f" {p['registers']} reg {p['ctas_per_sm']} CTA/SM"
                                                           if p.get("registers") is not None else "")
                      for p in prof["launches"])
    return f"  profile {name}: {split}\n    bound: {prof['bound']}"


def ratios(row: dict) -> dict:
    """triton / peer as speed (peer ms / triton ms): above 1 is triton faster."""
    ours = row["cells"].get("triton", {}).get("ms")
    out = {}
    for peer, cell in row["cells"].items():
        if peer != "triton" and ours and cell.get("ms"):
            out[peer] = round(cell["ms"] / ours, 3)
    return out


def row_line(case: Case, row: dict) -> str:
    def cell(name):
        c = row["cells"].get(name, {})
        if c.get("ms"):
            return f"{name} {row['tflop'] / c['ms'] * 1e3:5.0f} TF/s ({c['ms']:.3f} ms)"
        return f"{name} - ({c.get('note', '')[:60]})"
    parts = [cell(n) for n in ("triton", *PEERS)]
    ratio = "  ".join(f"/{p} {r:.2f}" for p, r in row.get("ratios", {}).items())
    return f"{case.name:26s} " + " | ".join(parts) + f"   triton{ratio and ' ' + ratio}"


def time_candidates(case: Case, timer, device, record: Record, budget: Budget, failed: set) -> None:
    """Each candidate of the case: its kernel alone against the table config's, and its
    outputs against the table's (a candidate that breaks the kernel shows here)."""
    import torch
    graph = graph_for(case)
    tensors = tensors_for(case, graph, device)
    table = table_config(case, graph)
    prepared, base = triton_stages(graph, tensors, table)
    base["backward"]()
    ref = _outputs(tensors)
    table_ms = {k: timer(base[k]) for k in ("dkdv", "dq", "dbias", "backward") if k in base}
    record.put("candidates", f"{case.name}/table", {"config": asdict(prepared.cfg), "ms": table_ms,
                                                    "describe": {k: describe(prepared.cfg, k) for k in table_ms}})
    for cand in (c for c in CANDIDATES if case.name in c.cases):
        key = f"{case.name}/{cand.label}"
        if record.done("candidates", key) or not budget.allows():
            continue
        if ("triton", case.name, cand.label) in failed:
            record.put("candidates", key, {"error": "precompile failed"})
            continue
        cfg = cand.config(table)
        try:
            for p in ("dq", "dk", "dv", "dbias"):
                if p in tensors:
                    tensors[p].zero_()
            _, stages = triton_stages(graph, tensors, cfg)
            stages["backward"]()
            if device.type == "cuda":
                torch.cuda.synchronize()
            diff = rel_diff(_outputs(tensors), ref)
            ms = timer(stages[cand.kernel])
            entry = {"config": asdict(cfg), "kernel": cand.kernel, "ms": ms,
                     "table_ms": table_ms[cand.kernel], "speedup": round(table_ms[cand.kernel] / ms, 3),
                     "max_rel_diff": diff, "describe": describe(cfg, cand.kernel)}
        except Exception as exc:  # noqa: BLE001 - recorded
            entry = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"}
        record.put("candidates", key, entry)
        if "ms" in entry:
            print(f"  {key:50s} {entry['ms']:.3f} ms ({entry['speedup']:.2f}x the table's "
                  f"{entry['table_ms']:.3f}); max rel diff {entry['max_rel_diff']:.1e}", flush=True)
        else:
            print(f"  {key:50s} {entry['error']}", flush=True)


def wanted(cand: Candidate, globs: tuple[str, ...] | None) -> bool:
    """The candidate's label matches one of `globs` (--candidates; None: every candidate)."""
    return globs is None or any(fnmatch.fnmatchcase(cand.label, g) for g in globs)


def summary(record: Record) -> list[str]:
    """Per case and kernel: the table's config against the one it replaced (the PREVIOUS
    candidates: above 1 the table is faster), and the best candidate against the table's."""
    lines = []
    for key, e in sorted(record.data["candidates"].items()):
        case, label = key.split("/", 1)
        if label.startswith(PREVIOUS) and "ms" in e:
            lines.append(f"table for {case} {e['kernel']}: {e['table_ms']:.3f} ms against {e['ms']:.3f} ms "
                         f"before ({e['ms'] / e['table_ms']:.2f}x; max rel diff {e['max_rel_diff']:.1e})")
    for (case, kernel), (label, e) in sorted(best_candidates(record).items()):
        lines.append(f"best {kernel} for {case}: {label} {e['ms']:.3f} ms, {e['speedup']:.2f}x the table's "
                     f"{e['table_ms']:.3f} ms (max rel diff {e['max_rel_diff']:.1e})")
    for case, prof in record.data["profiles"].items():
        best = record.data["best"].get(case, {})
        picked = "; ".join(f"{k} {b['label']} {b['describe']} {b['ms']:.3f} ms" for k, b in sorted(best.items()))
        lines.append(f"row {case}: bound: {prof.get('bound', prof.get('error'))}"
                     + (f" | best: {picked}" if picked else ""))
    return lines


def best_candidates(record: Record) -> dict:
    """(case, kernel) -> (label, entry) of the fastest candidate measured (the table's config
    not among them)."""
    best: dict = {}
    for key, e in record.data["candidates"].items():
        case, label = key.split("/", 1)
        if label == "table" or "ms" not in e:
            continue
        k = (case, e["kernel"])
        if k not in best or e["ms"] < best[k][1]["ms"]:
            best[k] = (label, e)
    return best


def best_config(record: Record, case: str) -> dict:
    """Per kernel of the row, the fastest configuration tried, the table's included: its
    label ("table" where no candidate beat it), ms and tiles (the row's `best` in the JSON)."""
    table = record.data["candidates"].get(f"{case}/table")
    if table is None:
        return {}
    out = {}
    for kernel, ms in table["ms"].items():
        out[kernel] = {"label": "table", "ms": ms, "describe": table["describe"][kernel]}
    for (c, kernel), (label, e) in best_candidates(record).items():
        if c == case and kernel in out and e["ms"] < out[kernel]["ms"]:
            out[kernel] = {"label": label, "ms": e["ms"], "describe": e["describe"],
                           "speedup": e["speedup"]}
    return out


# ----------------------------------------------------------------------------- CPU: resources
def candidate_variants(case: Case, cfg: BlockConfig) -> dict:
    """label -> variant of the kernels a launch of the case with `cfg` compiles (resources.py's
    recorder on meta tensors: what a launch would compile)."""
    from bundlegen.engines.triton import configs, launch
    from bundlegen.engines.triton import resources as R
    graph = graph_for(case)
    L = launch.prepare(graph.as_launched(), launch.meta_tensors(graph), cfg)
    rec = R._Recorder(L.kernels)
    rec.tier = configs.ARCHS[ARCH].tier_of(configs.tier_key(graph.D_qk, graph.D_v))
    launch.run(replace(L, kernels=rec))
    return {name: var for name, var in R.sweep_variants(ARCH, rec.choices).items()
            if not name.startswith(("preprocess", "dsinks"))}


#: variant label prefixes (resources.label) of the kernels a candidate of each kind changes
CHANGED_KERNELS = {"dkdv": ("dkdv", "dk", "dv"), "dq": ("dq",), "dbias": ("dbias",),
                   "backward": ("dkdv", "dk", "dv", "dq", "dbias")}


def kernel_family(label: str) -> str:
    """The kernel a variant label (resources.label) names, without its split-pass and
    two-chunk suffixes: dk-shared-kv/d256/... and dk/d256/... are both dk."""
    return label.split("/")[0].split("-")[0]


def drop_lines(rows: list[tuple[str, str, str, dict]], kinds: dict[str, str]) -> list[str]:
    """The candidates to drop before the device call, from (case, label, variant, resources)
    rows: a kernel the candidate changes that fails to compile for sm90, fails the project's
    resource check (resources.check: spills past the known ones, shared memory, occupancy)
    or spills more than the table's same kernel. `kinds`: label -> Candidate.kernel."""
    from bundlegen.engines.triton import resources as R
    table = {(c, n.split("/")[0]): e.get("spill_bytes") for c, label, n, e in rows if label == "table"}
    out = []
    for case, label, name, e in rows:
        if label == "table" or kernel_family(name) not in CHANGED_KERNELS[kinds[label]]:
            continue
        base = table.get((case, name.split("/")[0]))
        why = ("does not compile: " + e["error"][-80:] if "error" in e
               else "; ".join(R.check(ARCH, name, e)) or (
                   f"spills {e['spill_bytes']} bytes, the table's {base}" if base is not None
                   and e["spill_bytes"] > base else ""))
        if why:
            out.append(f"drop {case} / {label}: {name} {why}")
    return out


def resources(jobs: int, only: str | None, cases: list[Case]) -> int:
    """Compile the table config and every candidate of each case for sm90 on the CPU and
    print registers, spills and shared memory per kernel (the evidence CANDIDATES rests on),
    then the candidates to drop (drop_lines)."""
    from concurrent.futures import ThreadPoolExecutor

    from bundlegen.engines.triton import resources as R
    work = []
    for case in cases:
        if only and only not in case.name:
            continue
        table = table_config(case, graph_for(case))
        cands = [("table", table)] + [(c.label, c.config(table)) for c in CANDIDATES if case.name in c.cases]
        for label, cfg in cands:
            for name, var in candidate_variants(case, cfg).items():
                if label != "table" and kernel_family(name) not in ("dkdv", "dk", "dv", "dq", "dbias"):
                    continue
                work.append((case.name, label, name, var))
    seen: dict = {}
    unique = []
    for job in work:   # one compile per distinct variant
        key = json.dumps(job[3], sort_keys=True, default=str)
        if key not in seen:
            seen[key] = None
            unique.append(key)
    print(f"{len(work)} (case, config, kernel) rows, {len(unique)} distinct sm90 variants, {jobs} jobs", flush=True)

    def one(key):
        try:
            e = R.measure_alone(ARCH, json.loads(key))
            return key, e
        except Exception as exc:  # noqa: BLE001
            return key, {"error": str(exc)[-300:]}
    with ThreadPoolExecutor(jobs) as pool:
        for key, e in pool.map(one, unique):
            seen[key] = e
    for case, label, name, var in work:
        e = seen[json.dumps(var, sort_keys=True, default=str)]
        if "error" in e:
            print(f"{case:22s} {label:28s} {name:50s} ERROR {e['error'][-120:]}")
        else:
            print(f"{case:22s} {label:28s} {name:50s} reg {e['registers']:3d} spill {e['spill_bytes']:5d} "
                  f"smem {e['shared_bytes']:6d}", flush=True)
    rows = [(case, label, name, seen[json.dumps(var, sort_keys=True, default=str)]) for case, label, name, var in work]
    drops = drop_lines(rows, {c.label: c.kernel for c in CANDIDATES})
    print("\n".join(drops) if drops else "no candidate to drop", flush=True)
    return 0


# ----------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (the device call) or cpu (smoke test)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON written after every measurement (default $OUT/speed_batch.json, "
                             "else out/speed_batch.json)")
    parser.add_argument("--budget-s", type=float, default=500.0,
                        help="wall-clock seconds the whole call may take (it ends itself then)")
    parser.add_argument("--margin-s", type=float, default=15.0,
                        help="no new step starts with fewer seconds than this left")
    parser.add_argument("--jobs", type=int, default=None,
                        help="compile processes (0: compile on use; default 12 on cuda, 0 on cpu, "
                             "2 with --resources)")
    parser.add_argument("--cases", nargs="+", default=None, help=f"rows to run (default all: {' '.join(CASES)})")
    parser.add_argument("--no-candidates", action="store_true", help="the rows only")
    parser.add_argument("--candidates", nargs="+", default=None, metavar="GLOB",
                        help="only the candidates whose label matches one of these globs "
                             f"(e.g. '{PREVIOUS}*' 'drop*'; default every one)")
    parser.add_argument("--resume", type=Path, default=None, help="a JSON of an earlier call: skip what it has")
    parser.add_argument("--warmup-ms", type=int, default=10)
    parser.add_argument("--rep-ms", type=int, default=40)
    parser.add_argument("--list", action="store_true", help="print the plan and exit")
    parser.add_argument("--resources", action="store_true",
                        help="CPU: compile the table config and the candidates for sm90, print registers/spills")
    parser.add_argument("--only", default=None, help="--resources: cases whose name contains this")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.cases or ()) - set(CASES))
    if unknown:
        parser.error(f"--cases: unknown {', '.join(unknown)} (known: {' '.join(CASES)})")
    unmatched = [g for g in args.candidates or () if not any(wanted(c, (g,)) for c in CANDIDATES)]
    if unmatched:
        parser.error(f"--candidates: {', '.join(unmatched)} match no candidate's label")
    if args.budget_s <= args.margin_s:
        parser.error(f"--budget-s {args.budget_s:g} must exceed --margin-s {args.margin_s:g}")
    return args


def plan_lines(cases: list[Case]) -> list[str]:
    out = []
    for case in cases:
        cands = [c.label for c in CANDIDATES if case.name in c.cases]
        peers = [p for p in PEERS if p != "flex" or flex_serves(case) is None]
        out.append(f"{case.name:26s} vs {', '.join(peers):36s} candidates: {len(cands)}"
                   + (f" ({', '.join(cands)})" if cands else ""))
    return out


def main(argv=None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    cases = [CASES[n] for n in args.cases] if args.cases else list(CASES.values())
    global CANDIDATES
    CANDIDATES = tuple(c for c in CANDIDATES if wanted(c, args.candidates and tuple(args.candidates)))
    if args.list:
        print("\n".join(plan_lines(cases)))
        return 0
    if args.resources:
        os.environ.pop("TRITON_INTERPRET", None)
        return resources(max(1, 2 if args.jobs is None else args.jobs), args.only, cases)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from bench.engine_speed import build_engines, environment
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("speed_batch: no CUDA device here (use --device cpu for a smoke test)", file=sys.stderr)
        return 2
    if device.type == "cpu":   # tiny shapes: the code paths, not the speed
        global RAGGED_LENGTHS
        RAGGED_LENGTHS = (16, 40, 24)
        cases = [replace(c, B=len(RAGGED_LENGTHS) if c.ragged else 1, H_q=2, H_kv=1 if c.H_kv != c.H_q else 2,
                         S=64, D=min(c.D, 64)) for c in cases]
        CASES.update({c.name: c for c in cases})
    out = args.out or Path(os.environ.get("OUT") or REPO_ROOT / "out") / "speed_batch.json"
    budget = Budget(args.budget_s, args.margin_s, started)
    resumed = json.loads(args.resume.read_text()) if args.resume else None
    record = Record(out, environment(device), {k: str(v) for k, v in vars(args).items()}, resumed)

    def out_of_time(signum, frame):
        record.note(f"budget of {args.budget_s:g} s reached: stopped (JSON has what was measured)")
        os._exit(0)
    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(max(1, int(budget.left())))

    record.note(f"speed_batch: {len(cases)} rows on {record.data['environment'].get('gpu', device)}, "
                f"budget {args.budget_s:g} s")
    failed: set = set()
    jobs = args.jobs if args.jobs is not None else (12 if device.type == "cuda" else 0)
    if jobs > 0:
        results = precompile(cases, jobs, budget, record, device)
        failed = {job for job, r in results.items() if r != "ok"}
    engines = build_engines([p for p in PEERS if p != "flex"], device)
    timer = make_timer(device, args.warmup_ms, args.rep_ms)
    for case in cases:
        if not budget.allows():
            record.note(f"budget: stopped before row {case.name} ({budget.elapsed:.0f} s)")
            break
        if not record.done("rows", case.name):
            try:
                time_row(case, engines, timer, device, record, budget)
            except Exception as exc:  # noqa: BLE001 - recorded, the batch goes on
                record.put("rows", case.name, {"error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        if not args.no_candidates and any(case.name in c.cases for c in CANDIDATES) and budget.allows():
            try:
                time_candidates(case, timer, device, record, budget, failed)
            except Exception as exc:  # noqa: BLE001
                record.note(f"{case.name} candidates: {type(exc).__name__}: {str(exc)[:300]}")
            if record.done("candidates", f"{case.name}/table"):
                record.put("best", case.name, best_config(record, case.name))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    signal.alarm(0)
    for line in summary(record):
        record.note(line)
    record.note(f"done in {budget.elapsed:.0f} s; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
