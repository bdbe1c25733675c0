"""One case's tensors in memory (DESIGN section 5 step 3, CONTRACTS "Harness pieces").

Every port gets its own 1-D storage: GUARD_ELEMS canary elements, then the declared
storage (elements 0 .. offset-1 are guard too), then GUARD_ELEMS more after the last
addressed element. Every element the declared view does not address (guards and the gaps
of padded or interleaved layouts) holds the canary before the engine runs; outputs are all
canary, so an element an engine never writes is a NaN in its output.

The canary is a quiet NaN with a payload no arithmetic produces, compared bitwise, so a
write of any value into a guard is caught, NaN included.

Inputs q, k, v, do are filled on the CPU (harness.distributions), O and Stats come from the
float64 oracle forward of those inputs (O rounded to the io dtype, Stats = LSE in fp32), all
written with their declared strides, then copied to the device. The oracle backward of the
same inputs is the reference, kept on the CPU in float64.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping

import torch

from bundlegen.graph import INPUT_PORTS, OUTPUT_PORTS, PORTS, Case, TensorSpec
from bundlegen.validate import frontend_reason
from harness import oracle
from harness.distributions import TORCH_DTYPES, generate_inputs, generated_shape

#: canary elements before the declared storage and after its last addressed element; a
#: multiple of 64 so the view keeps the alignment its declared offset gives it
GUARD_ELEMS = 512
#: canary bit patterns: quiet NaNs with a distinctive payload
CANARY_BITS = {"bf16": 0x7FDA, "fp16": 0x7E5A, "fp32": 0x7FDADADA}
BITS_DTYPES = {"bf16": torch.int16, "fp16": torch.int16, "fp32": torch.int32}
#: elements compared at once when scanning storages (bounds the temporaries)
SCAN_CHUNK = 1 << 26


class MaterializeError(ValueError):
    """The case cannot be laid out as declared; the message names the case and port."""


@dataclass(frozen=True, eq=False)
class Materialized:
    case: Case
    device: torch.device
    tensors: Mapping[str, torch.Tensor]      # port -> view with the declared dims and strides
    storages: Mapping[str, torch.Tensor]     # port -> 1-D storage including guards
    origins: Mapping[str, int]               # port -> storage index of declared element 0
    unaddressed: Mapping[str, torch.Tensor]  # port -> bool 1-D, True where the view never reads
    snapshots: Mapping[str, torch.Tensor]    # input port -> CPU copy of its whole storage
    reference: oracle.Backward               # float64, CPU
    forward: oracle.Forward                  # float64, CPU (exact O and LSE)
    oracle_s: float                          # seconds in the oracle (forward + backward)


# ----------------------------------------------------------------------------- layout
def storage_size(spec: TensorSpec) -> int:
    return GUARD_ELEMS + spec.storage_elements + GUARD_ELEMS


def view_of(storage: torch.Tensor, spec: TensorSpec, dims: tuple[int, ...] | None = None) -> torch.Tensor:
    """The declared view into a storage laid out by storage_size (optionally narrower dims)."""
    return storage.as_strided(dims or spec.dims, spec.strides, GUARD_ELEMS + spec.offset)


def canary_storage(spec: TensorSpec, device: torch.device | str) -> torch.Tensor:
    storage = torch.empty(storage_size(spec), dtype=TORCH_DTYPES[spec.dtype], device=device)
    fill_canary(storage, spec.dtype)
    return storage


def fill_canary(storage: torch.Tensor, dtype: str) -> None:
    storage.view(BITS_DTYPES[dtype]).fill_(CANARY_BITS[dtype])


def unaddressed_mask(spec: TensorSpec, device: torch.device | str) -> torch.Tensor:
    """True for every storage element the view does not address. A broadcast axis
    addresses only its index 0, so it is narrowed to size 1 (fill_ allows overlap)."""
    mask = torch.ones(storage_size(spec), dtype=torch.bool, device=device)
    view_of(mask, spec, generated_shape(spec.dims, spec.strides)).fill_(False)
    return mask


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def write_view(storage: torch.Tensor, spec: TensorSpec, values: torch.Tensor, *,
               case_id: str, port: str) -> None:
    """Write logical `values` through the declared strides and check they read back bitwise.
    Along a broadcast axis every value must agree: the storage holds only one of them."""
    for axis, (d, s) in enumerate(zip(spec.dims, spec.strides)):
        if s == 0 and d > 1:
            first = values.narrow(axis, 0, 1)
            if not torch.equal(_bits(values), _bits(first.expand_as(values))):
                raise MaterializeError(
                    f"case {case_id}: port {port} has stride 0 on axis {axis} (length {d}) "
                    f"but the values derived for it differ along that axis")
            values = first
    view_of(storage, spec, tuple(values.shape)).copy_(values)
    if not torch.equal(_bits(view_of(storage, spec)), _bits(values.expand(spec.dims))):
        raise MaterializeError(f"case {case_id}: port {port}: strides {spec.strides} make "
                               f"elements overlap, so the derived values cannot all be stored")


# ----------------------------------------------------------------------------- building
def default_oracle_device(device: torch.device) -> torch.device:
    return device if device.type == "cuda" else torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def materialize(case: Case, device: torch.device | str,
                oracle_device: torch.device | str | None = None, *,
                max_block_elems: int | None = None) -> Materialized:
    graph, device = case.graph, torch.device(device)
    reason = frontend_reason(graph)
    if reason is not None:
        raise MaterializeError(f"case {case.id}: the graph fails frontend validation ({reason})")
    odev = torch.device(oracle_device) if oracle_device is not None else default_oracle_device(device)
    specs = graph.tensors
    cpu = {port: canary_storage(specs[port], "cpu") for port in INPUT_PORTS}

    # q, k, v, do: drawn on the CPU, written through their strides; the logical values are
    # read back from storage, so the oracle sees exactly what an engine reads.
    for port, values in generate_inputs(graph, case.data.distribution, case.data.seed).items():
        spec = specs[port]
        view_of(cpu[port], spec, tuple(values.shape)).copy_(values)
    storages = {port: cpu[port].to(device, copy=True) for port in ("q", "k", "v", "do")}

    def oracle_view(port: str) -> torch.Tensor:
        source = storages[port] if odev == device else cpu[port].to(odev)
        return view_of(source, specs[port])

    start = time.perf_counter()
    q, k, v, do = (oracle_view(p) for p in ("q", "k", "v", "do"))
    fwd = oracle.forward(q, k, v, graph.attributes, max_block_elems=max_block_elems)
    _sync(odev)
    oracle_s = time.perf_counter() - start

    o_values = fwd.o.to(TORCH_DTYPES[specs["o"].dtype]).cpu()
    stats_values = fwd.lse.to(torch.float32).unsqueeze(-1).cpu()
    write_view(cpu["o"], specs["o"], o_values, case_id=case.id, port="o")
    write_view(cpu["stats"], specs["stats"], stats_values, case_id=case.id, port="stats")
    for port in ("o", "stats"):
        storages[port] = cpu[port].to(device, copy=True)

    start = time.perf_counter()
    bwd = oracle.backward(q, k, v, do, graph.attributes, fwd, max_block_elems=max_block_elems)
    _sync(odev)
    oracle_s += time.perf_counter() - start
    del q, k, v, do

    for port in OUTPUT_PORTS:
        storages[port] = canary_storage(specs[port], device)
    return Materialized(
        case=case, device=device,
        tensors={port: view_of(storages[port], specs[port]) for port in PORTS},
        storages=storages,
        origins={port: GUARD_ELEMS for port in PORTS},
        unaddressed={port: unaddressed_mask(specs[port], device) for port in PORTS},
        snapshots=cpu, reference=bwd.to("cpu"), forward=fwd.to("cpu"), oracle_s=oracle_s)


# ----------------------------------------------------------------------------- checks
def guard_violations(m: Materialized) -> list[str]:
    """Ports (inputs and outputs) with a non-canary bit pattern in an unaddressed element."""
    bad = []
    for port in PORTS:
        dtype = m.case.graph.tensors[port].dtype
        bits, mask = m.storages[port].view(BITS_DTYPES[dtype]), m.unaddressed[port]
        canary = CANARY_BITS[dtype]
        if any(bool(((bits[i:i + SCAN_CHUNK] != canary) & mask[i:i + SCAN_CHUNK]).any())
               for i in range(0, bits.numel(), SCAN_CHUNK)):
            bad.append(port)
    return bad


def modified_inputs(m: Materialized) -> list[str]:
    """Input ports whose storage (guards included) differs bitwise from its snapshot."""
    bad = []
    for port in INPUT_PORTS:
        now, before = _bits(m.storages[port]), _bits(m.snapshots[port])
        if any(not torch.equal(now[i:i + SCAN_CHUNK], before[i:i + SCAN_CHUNK].to(now.device))
               for i in range(0, now.numel(), SCAN_CHUNK)):
            bad.append(port)
    return bad


def nonfinite_outputs(m: Materialized) -> list[str]:
    """Output ports whose view holds a NaN or Inf (the oracle's gradients are always
    finite; an element the engine never wrote still holds the NaN canary)."""
    return [port for port in OUTPUT_PORTS if not bool(torch.isfinite(m.tensors[port]).all())]


def reset_outputs(m: Materialized) -> None:
    """Refill every output storage with the canary (before a repeated run)."""
    for port in OUTPUT_PORTS:
        fill_canary(m.storages[port], m.case.graph.tensors[port].dtype)


def logical_inputs(m: Materialized) -> dict[str, torch.Tensor]:
    """port -> the logical q, k, v, o, do, stats an engine reads: CPU copies in the declared
    dims (contiguous; broadcast axes materialised), safe to modify."""
    return {port: view_of(m.snapshots[port], m.case.graph.tensors[port]).clone()
            for port in INPUT_PORTS}
