"""One case's tensors in memory (DESIGN section 5 step 3, CONTRACTS "Harness pieces").

Every port gets its own 1-D storage: GUARD_ELEMS canary elements, then the declared
storage (elements 0 .. offset-1 are guard too), then GUARD_ELEMS more after the last
addressed element. Every element the declared view does not address (guards and the gaps
of padded or interleaved layouts) holds the canary before the engine runs; outputs are all
canary, so an element an engine never writes is a NaN in its output.

The canary is a quiet NaN with a payload no arithmetic produces, compared bitwise, so a
write of any value into a guard is caught, NaN included; inputs and outputs have different
ones, so a NaN read from an input's guard and written into an output's guard is caught too.

Score-modifier ports (bias, sinks in; dbias, dsinks out) get storages, canaries and scans
like the others; bias and sinks values come from distributions.draw_modifiers.

Inputs q, k, v, do are filled on the CPU (bundlegen.harness.distributions), O and Stats come from the
float64 oracle forward of those inputs (O rounded to the io dtype, Stats = LSE in fp32), all
written with their declared strides, then copied to the device (from pinned memory when
large, on a GPU). The oracle backward of the same inputs is the reference; it stays on the oracle's
device (the GPU when the case runs on one), where the checks compare against it.

The checks read back as little as they can: each scan builds its per-port flags on the
device and reads them with one transfer; the input-modified check compares with a copy of
each input storage made on the device itself.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Mapping

import torch

from bundlegen.dtypes import TORCH_DTYPES
from bundlegen.graph import (MODIFIER_OUTPUT_PORTS, OFFSET_PORTS, OUTPUT_PORTS, Case, Graph,
                             TensorSpec)
from bundlegen.validate import GUARD_ELEMS, frontend_finding, good_sequences
from bundlegen.harness import oracle, oracle_ragged
from bundlegen.harness.checks import bit_pattern, read_flags
from bundlegen.harness.distributions import draw_inputs, draw_modifiers, generated_shape

#: every port that takes the output canary
_OUTPUTS = frozenset(OUTPUT_PORTS + MODIFIER_OUTPUT_PORTS)

#: canary bit patterns: quiet NaNs with a distinctive payload, one for input storages and
#: another for output storages. They differ because a NaN keeps its payload through
#: arithmetic: an engine that reads an input's guard and writes what it computed into an
#: output's guard would otherwise leave the output canary's own bits there, unseen.
CANARY_BITS = {"bf16": 0x7FDA, "fp16": 0x7E5A, "fp32": 0x7FDADADA}
OUTPUT_CANARY_BITS = {"bf16": 0x7FE5, "fp16": 0x7EA5, "fp32": 0x7FE5A5A5}
BITS_DTYPES = {"bf16": torch.int16, "fp16": torch.int16, "fp32": torch.int32}
#: elements compared at once when scanning storages (bounds the temporaries)
SCAN_CHUNK = 1 << 26
#: host storages of at least this many bytes are pinned when the case runs on a GPU, so
#: their copies to the device are fast and asynchronous (smaller ones gain nothing)
PIN_MIN_BYTES = 1 << 20
#: input storages of at least this many bytes are built on the GPU they run on (see
#: _first_storage)
DEVICE_BUILD_MIN_BYTES = 1 << 30


class MaterializeError(ValueError):
    """The case cannot be laid out as declared; the message names the case and port."""


@dataclass(frozen=True, eq=False)
class Materialized:
    case: Case
    device: torch.device
    tensors: Mapping[str, torch.Tensor]      # port -> view with the declared dims and strides
    storages: Mapping[str, torch.Tensor]     # port -> 1-D storage including guards
    origins: Mapping[str, int]               # port -> storage index of declared element 0
    unaddressed: Mapping[str, torch.Tensor]  # port -> bool 1-D, True where the view never reads (lazy)
    snapshots: Mapping[str, torch.Tensor]    # input port -> CPU copy of its whole storage
    baselines: Mapping[str, torch.Tensor]    # input port -> copy of its whole storage on `device`
    reference: oracle.Backward               # float64, on the oracle device
    forward: oracle.Forward                  # float64, on the oracle device (exact O and LSE)
    oracle_s: float                          # seconds in the oracle (forward + backward, synchronised)
    #: a ragged graph's judged rows: output port -> row indices (on the oracle device) of
    #: the sequences the outputs are compared on (all of them; a device probe's good ones)
    judged_rows: Mapping[str, torch.Tensor] | None = None
    #: a ragged graph's cu_seqlens tensors as handed to the engine, and their values
    offsets: Mapping[str, tuple[int, ...]] | None = None


# ----------------------------------------------------------------------------- layout
def storage_size(spec: TensorSpec) -> int:
    return GUARD_ELEMS + spec.storage_elements + GUARD_ELEMS


def view_of(storage: torch.Tensor, spec: TensorSpec, dims: tuple[int, ...] | None = None) -> torch.Tensor:
    """The declared view into a storage laid out by storage_size (optionally narrower dims)."""
    return storage.as_strided(dims or spec.dims, spec.strides, GUARD_ELEMS + spec.offset)


def canary_bits(dtype: str, output: bool) -> int:
    """The canary of an output storage (dq, dk, dv, dbias, dsinks) or of an input's."""
    return (OUTPUT_CANARY_BITS if output else CANARY_BITS)[dtype]


def canary_storage(spec: TensorSpec, device: torch.device | str, output: bool) -> torch.Tensor:
    storage = torch.empty(storage_size(spec), dtype=TORCH_DTYPES[spec.dtype], device=device)
    fill_canary(storage, spec.dtype, output)
    return storage


def fill_canary(storage: torch.Tensor, dtype: str, output: bool) -> None:
    storage.view(BITS_DTYPES[dtype]).fill_(canary_bits(dtype, output))


def unaddressed_mask(spec: TensorSpec, device: torch.device | str,
                     silent_rows: range | tuple[range, ...] = ()) -> torch.Tensor:
    """True for every storage element the view does not address. A broadcast axis
    addresses only its index 0, so it is narrowed to size 1 (fill_ allows overlap).
    `silent_rows`: ranges of the first axis (a ragged output's rows outside every
    sequence) counted as unaddressed too, unless another row shares their elements."""
    mask = torch.ones(storage_size(spec), dtype=torch.bool, device=device)
    view = view_of(mask, spec, generated_shape(spec.dims, spec.strides))
    view.fill_(False)
    silent = [r for r in (silent_rows if isinstance(silent_rows, tuple) else (silent_rows,)) if len(r)]
    if silent:
        for rows in silent:
            view[rows.start:rows.stop] = True
        keep = torch.ones(spec.dims[0], dtype=torch.bool)
        for rows in silent:
            keep[rows.start:rows.stop] = False
        view[keep.nonzero().flatten().to(device)] = False
    return mask


def addressed_span(spec: TensorSpec) -> tuple[int, int]:
    """[start, end): storage indices from the view's first to one past its last element."""
    return GUARD_ELEMS + spec.offset, GUARD_ELEMS + spec.storage_elements


def is_dense(spec: TensorSpec) -> bool:
    """The view addresses every element of its span (and each once): its axes that move
    (length > 1, stride not 0), ordered by stride, are packed. Then everything outside
    `addressed_span` is unaddressed and no mask is needed."""
    if any(d == 0 for d in spec.dims):
        return True
    step = 1
    for stride, dim in sorted((s, d) for d, s in zip(spec.dims, spec.strides) if d > 1 and s != 0):
        if stride != step:
            return False
        step *= dim
    return True


class _LazyMasks(Mapping):
    """port -> unaddressed_mask, built on first use (the guard scan needs one only for a
    layout with gaps, or a ragged output with silent rows)."""

    def __init__(self, specs: Mapping[str, TensorSpec], device: torch.device,
                 silent: Mapping[str, tuple[range, ...]] | None = None):
        self._specs, self._device, self._masks = specs, device, {}
        self.silent = dict(silent or {})

    def __getitem__(self, port: str) -> torch.Tensor:
        if port not in self._masks:
            self._masks[port] = unaddressed_mask(self._specs[port], self._device,
                                                 self.silent.get(port, ()))
        return self._masks[port]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)


def write_view(storage: torch.Tensor, spec: TensorSpec, values: torch.Tensor, *,
               case_id: str, port: str) -> None:
    """Write logical `values` through the declared strides and check they read back bitwise.
    Along a broadcast axis every value must agree: the storage holds only one of them."""
    values = values.to(storage.device)
    for axis, (d, s) in enumerate(zip(spec.dims, spec.strides)):
        if s == 0 and d > 1:
            first = values.narrow(axis, 0, 1)
            if not torch.equal(bit_pattern(values), bit_pattern(first.expand_as(values))):
                raise MaterializeError(
                    f"case {case_id}: port {port} has stride 0 on axis {axis} (length {d}) "
                    f"but the values derived for it differ along that axis")
            values = first
    view_of(storage, spec, tuple(values.shape)).copy_(values)
    if not torch.equal(bit_pattern(view_of(storage, spec)), bit_pattern(values.expand(spec.dims))):
        raise MaterializeError(f"case {case_id}: port {port}: strides {spec.strides} make "
                               f"elements overlap, so the derived values cannot all be stored")


# ----------------------------------------------------------------------------- building
def default_oracle_device(device: torch.device) -> torch.device:
    return device if device.type == "cuda" else torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _first_storage(spec: TensorSpec, device: torch.device, pin: bool) -> torch.Tensor:
    """Where an input's values are first written: a host storage (_host_storage), or for a
    storage of at least DEVICE_BUILD_MIN_BYTES on a GPU, one built on the device itself, so
    a sparse view over a span past 2^31 elements (the 64-bit-offset case) costs a device
    fill, not a host fill and copy of gigabytes."""
    size = storage_size(spec) * TORCH_DTYPES[spec.dtype].itemsize
    if device.type == "cuda" and size >= DEVICE_BUILD_MIN_BYTES:
        return canary_storage(spec, device, output=False)
    return _host_storage(spec, pin)


def _host_storage(spec: TensorSpec, pin: bool) -> torch.Tensor:
    """A CPU storage whose unaddressed elements hold the canary, pinned when `pin` and large
    enough to gain from it. A dense view's span is left unfilled: the caller writes every
    element of it (all of a port's values go through the view)."""
    dtype = TORCH_DTYPES[spec.dtype]
    size = storage_size(spec)
    pin = pin and size * dtype.itemsize >= PIN_MIN_BYTES
    storage = torch.empty(size, dtype=dtype, pin_memory=pin)
    if is_dense(spec):
        start, end = addressed_span(spec)
        fill_canary(storage[:start], spec.dtype, output=False)
        fill_canary(storage[end:], spec.dtype, output=False)
    else:
        fill_canary(storage, spec.dtype, output=False)
    return storage


def _copy_to(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of a host storage on `device` (asynchronous from pinned memory: the host
    storage is never written again)."""
    if host.device == device or device.type == "cpu":
        return host.clone()
    return host.to(device, non_blocking=host.is_pinned())


def materialize(case: Case, device: torch.device | str,
                oracle_device: torch.device | str | None = None, *,
                max_block_elems: int | None = None) -> Materialized:
    graph, device = case.graph, torch.device(device)
    finding = frontend_finding(graph, offsets_on_device=is_device_probe(case))
    if finding is not None:
        raise MaterializeError(f"case {case.id}: the graph fails frontend validation ({finding})")
    seqs = None if graph.ragged is None else oracle_ragged.sequences(graph, good_sequences(graph))
    odev = torch.device(oracle_device) if oracle_device is not None else default_oracle_device(device)
    specs = graph.tensors
    pin = device.type == "cuda" and torch.cuda.is_available()
    cpu = {port: _first_storage(specs[port], device, pin) for port in graph.input_ports}

    # q, k, v, do: drawn on the CPU, rounded to the io dtype as they are written through
    # their strides (generate_inputs' values); the logical values are read back from
    # storage, so the oracle sees exactly what an engine reads.
    for port, values in draw_inputs(graph, case.data.distribution, case.data.seed).items():
        spec = specs[port]
        view_of(cpu[port], spec, tuple(values.shape)).copy_(values.to(cpu[port].device))
    for port, values in draw_modifiers(graph, case.data.bias_values, case.data.seed).items():
        write_view(cpu[port], specs[port], values.to(TORCH_DTYPES[specs[port].dtype]),
                   case_id=case.id, port=port)
    drawn = ("q", "k", "v", "do") + tuple(p for p in ("bias", "sinks") if p in specs)
    storages = {port: _copy_to(cpu[port], device) for port in drawn}

    def oracle_view(port: str) -> torch.Tensor:
        source = storages[port] if odev == device else cpu[port].to(odev)
        return view_of(source, specs[port])

    q, k, v, do = (oracle_view(p) for p in ("q", "k", "v", "do"))
    mods = oracle.Modifiers(
        bias=oracle_view("bias") if "bias" in specs else None,
        sinks=oracle_view("sinks") if "sinks" in specs else None,
        dbias_dims=specs["dbias"].dims if "dbias" in specs else None, dsinks="dsinks" in specs)
    _sync(device)
    _sync(odev)
    start = time.perf_counter()
    if seqs is None:
        fwd = oracle.forward(q, k, v, graph.attributes, modifiers=mods, max_block_elems=max_block_elems)
    else:
        fwd = oracle_ragged.forward(q, k, v, graph.attributes, seqs, max_block_elems=max_block_elems)
    _sync(odev)
    oracle_s = time.perf_counter() - start

    o_values = fwd.o.to(TORCH_DTYPES[specs["o"].dtype]).cpu()
    stats_values = fwd.lse.to(torch.float32).unsqueeze(-1).cpu()
    write_view(cpu["o"], specs["o"], o_values, case_id=case.id, port="o")
    write_view(cpu["stats"], specs["stats"], stats_values, case_id=case.id, port="stats")
    for port in ("o", "stats"):
        storages[port] = _copy_to(cpu[port], device)

    _sync(device)
    start = time.perf_counter()
    if seqs is None:
        bwd = oracle.backward(q, k, v, do, graph.attributes, fwd, modifiers=mods,
                              max_block_elems=max_block_elems)
    else:
        bwd = oracle_ragged.backward(q, k, v, do, graph.attributes, fwd, seqs,
                                     max_block_elems=max_block_elems)
    _sync(odev)
    oracle_s += time.perf_counter() - start
    del q, k, v, do, mods
    fwd = fwd.without_operands()  # frees the float64 copies of q, k, v

    for port in graph.output_ports:
        storages[port] = canary_storage(specs[port], device, output=True)
    # what the input-modified check compares with: on the CPU the host storages themselves
    # (the device storages are copies of them), elsewhere a copy made on the device
    baselines = cpu if device.type == "cpu" else {port: storages[port].clone() for port in graph.input_ports}
    tensors = {port: view_of(storages[port], specs[port]) for port in graph.ports}
    judged = silent = offsets = None
    if seqs is not None:
        judged, silent = _ragged_rows(graph, seqs, is_device_probe(case), odev)
        offsets = {"cu_seqlens_q": graph.ragged.cu_seqlens_q, "cu_seqlens_kv": graph.ragged.cu_seqlens_kv}
        for port, values in offsets.items():
            tensors[port] = torch.tensor(values, dtype=torch.int32, device=device)
    return Materialized(
        case=case, device=device, tensors=tensors, storages=storages,
        origins={port: GUARD_ELEMS for port in graph.ports},
        unaddressed=_LazyMasks({port: specs[port] for port in graph.ports}, device, silent),
        snapshots=cpu, baselines=baselines, reference=bwd, forward=fwd, oracle_s=oracle_s,
        judged_rows=judged, offsets=offsets)


def is_device_probe(case: Case) -> bool:
    """A probe of bad ragged offsets only device code sees (DESIGN section 10)."""
    return case.expected_rejection is not None and case.expected_rejection.by == "device"


def _ragged_rows(graph: Graph, seqs, device_probe: bool, odev: torch.device):
    """(judged, silent): per output port, the row indices compared with the oracle (the
    given sequences' rows) and the row ranges that must keep the canary (outside every
    sequence; none for a device probe, whose rows outside its good sequences are not
    judged)."""
    def rows(ranges) -> torch.Tensor:
        parts = [torch.arange(a, b) for a, b in ranges if b > a]
        return (torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)).to(odev)

    judged_q = rows([(s.q0, s.q1) for s in seqs])
    judged_kv = rows([(s.k0, s.k1) for s in seqs])
    judged = {"dq": judged_q, "dk": judged_kv, "dv": judged_kv}
    if device_probe:
        return judged, {}
    rag = graph.ragged
    silent_q = (range(0, rag.cu_seqlens_q[0]), range(rag.cu_seqlens_q[-1], graph.T_q))
    silent_kv = (range(0, rag.cu_seqlens_kv[0]), range(rag.cu_seqlens_kv[-1], graph.T_kv))
    return judged, {"dq": silent_q, "dk": silent_kv, "dv": silent_kv}


def judged_outputs(m: Materialized) -> tuple[dict[str, torch.Tensor], oracle.Backward]:
    """The engine's outputs and the oracle's reference, over the rows that are judged (all
    of them, for a padded graph)."""
    outputs = {port: m.tensors[port] for port in m.case.graph.output_ports}
    if m.judged_rows is None:
        return outputs, m.reference
    ref = {}
    for name in oracle.GRADIENT_FIELDS:
        ref[name] = getattr(m.reference, name).index_select(0, m.judged_rows[name[-2:]])
    for port in OUTPUT_PORTS:
        rows = m.judged_rows[port].to(m.device)
        outputs[port] = outputs[port].index_select(0, rows)
    return outputs, oracle.Backward(**ref)


# ----------------------------------------------------------------------------- checks
def _differs_anywhere(a: torch.Tensor, b: torch.Tensor | int) -> torch.Tensor:
    """Device bool scalar: a differs from b (a tensor of a's shape, or one value) somewhere.
    Large storages are compared in SCAN_CHUNK pieces to bound the temporaries."""
    n = a.numel()
    if n <= SCAN_CHUNK:
        return (a != b).any()
    parts = [(a[i:i + SCAN_CHUNK] != (b if isinstance(b, int) else b[i:i + SCAN_CHUNK])).any()
             for i in range(0, n, SCAN_CHUNK)]
    return torch.stack(parts).any()


def _guard_flag(m: Materialized, port: str) -> torch.Tensor:
    """Device bool scalar: the port's storage holds a non-canary pattern where its view
    never reads. A dense view's unaddressed elements are the two ends of its storage; a
    view with gaps (padded rows, interleaving, some broadcasts) is scanned through its mask."""
    spec = m.case.graph.tensors[port]
    bits = m.storages[port].view(BITS_DTYPES[spec.dtype])
    canary = canary_bits(spec.dtype, output=port in _OUTPUTS)
    if is_dense(spec) and not any(len(r) for r in m.unaddressed.silent.get(port, ())):
        start, end = addressed_span(spec)
        return _differs_anywhere(torch.cat([bits[:start], bits[end:]]), canary)
    mask = m.unaddressed[port]
    return torch.stack([((bits[i:i + SCAN_CHUNK] != canary) & mask[i:i + SCAN_CHUNK]).any()
                        for i in range(0, bits.numel(), SCAN_CHUNK)]).any()


def _flagged(ports, flag) -> list[str]:
    """The ports whose device flag is set, read back with one transfer."""
    ports = list(ports)
    return [port for port, bad in zip(ports, read_flags([flag(p) for p in ports])) if bad]


def guard_violations(m: Materialized) -> list[str]:
    """Ports (inputs and outputs) with a non-canary bit pattern in an unaddressed element."""
    return _flagged(m.case.graph.ports, lambda port: _guard_flag(m, port))


def modified_inputs(m: Materialized) -> list[str]:
    """Input ports whose storage (guards included) differs bitwise from its baseline copy."""
    def differs(port):
        if port in OFFSET_PORTS:
            now = m.tensors[port]
            return _differs_anywhere(now, torch.tensor(m.offsets[port], dtype=now.dtype, device=now.device))
        now = bit_pattern(m.storages[port])
        return _differs_anywhere(now, bit_pattern(m.baselines[port].to(now.device)))
    return _flagged(m.case.graph.input_ports + (OFFSET_PORTS if m.offsets else ()), differs)


def nonfinite_outputs(m: Materialized) -> list[str]:
    """Output ports whose view holds a NaN or Inf (the oracle's gradients are always
    finite; an element the engine never wrote still holds the NaN canary)."""
    return [port for port in m.case.graph.output_ports
            if not bool(torch.isfinite(m.tensors[port]).all())]


def reset_outputs(m: Materialized) -> None:
    """Refill every output storage with the canary (before a repeated run)."""
    for port in m.case.graph.output_ports:
        fill_canary(m.storages[port], m.case.graph.tensors[port].dtype, output=True)


def logical_inputs(m: Materialized) -> dict[str, torch.Tensor]:
    """port -> the logical q, k, v, o, do, stats (and bias, sinks) an engine reads: CPU
    copies in the declared dims (contiguous; broadcast axes materialised), safe to modify."""
    return {port: view_of(m.snapshots[port], m.case.graph.tensors[port]).to("cpu", copy=True)
            for port in m.case.graph.input_ports}
