"""One case's tensors in memory (DESIGN section 5 step 3, CONTRACTS "Harness pieces").

Every port gets its own 1-D storage: GUARD_ELEMS canary elements, then the declared
storage (elements 0 .. offset-1 are guard too), then GUARD_ELEMS more after the last
addressed element. Every element the declared view does not address (guards and the gaps
of padded or interleaved layouts) holds the canary before the engine runs; outputs are all
canary, so an element an engine never writes is a NaN in its output.

The canary is a quiet NaN with a payload no arithmetic produces, compared bitwise, so a
write of any value into a guard is caught, NaN included; inputs and outputs have different
ones, so a NaN read from an input's guard and written into an output's guard is caught too.

Score-modifier ports (bias, sinks, dropout_mask in; dbias, dsinks out) get storages, canaries
and scans like the others; their values come from distributions.draw_modifiers, and the
oracle applies the dropout mask it reads back from the port's storage.

Inputs q, k, v, do are drawn on the CPU (bundlegen.harness.distributions) and rounded to the io
dtype there, so every device holds the same bits; on a GPU only those values travel (through
reused pinned buffers) and the strided write into the canary-filled storage happens on the
device (a layout whose writes overlap is written on the CPU and copied whole). O and Stats
come from the float64 oracle forward of those inputs (O rounded to the io dtype, Stats = LSE
in fp32), written with their declared strides on the case's device, where the oracle left
them. A distribution whose dO is formed from O (l2-grad) writes dO after that forward,
from O as rounded to the io dtype (distributions.do_from_o). The oracle backward of the same inputs is the reference; it stays on the oracle's
device (the GPU when the case runs on one), where the checks compare against it.

The checks read back as little as they can: each scan builds its per-port flags on the
device and reads them with one transfer; the input-modified check compares with a copy of
each input storage made on the device itself.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Mapping

import torch

from bundlegen.dtypes import TORCH_DTYPES
from bundlegen.graph import (MODIFIER_OUTPUT_PORTS, OUTPUT_PORTS, Case, Graph,
                             TensorSpec)
from bundlegen.validate import GUARD_ELEMS, frontend_finding, good_sequences, overlaps_itself
from bundlegen.harness import oracle, oracle_ragged
from bundlegen.harness.io_reference import io_reference
from bundlegen.harness.checks import bit_pattern, read_flags, set_ports
from bundlegen.harness.distributions import (do_from_o, draw_inputs, draw_modifiers, generated_shape,
                                             needs_o)

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
    snapshots: Mapping[str, torch.Tensor]    # input port -> CPU copy of its whole storage (lazy)
    baselines: Mapping[str, torch.Tensor]    # input port -> copy of its whole storage on `device`
    reference: oracle.Backward               # float64, on the oracle device
    forward: oracle.Forward                  # float64, on the oracle device (exact O and LSE)
    oracle_s: float                          # seconds in both references (_OracleClock)
    #: a ragged graph's judged rows: output port -> row indices (on the oracle device) of
    #: the sequences the outputs are compared on (all of them; a device probe's good ones)
    judged_rows: Mapping[str, torch.Tensor] | None = None
    #: a ragged graph's cu_seqlens (and seqused) tensors as handed to the engine, and their values
    offsets: Mapping[str, tuple[int, ...]] | None = None
    #: the keep mask an engine that draws its own announced for this case (the oracle's
    #: dropout mask; harness/drawn_dropout.py), None otherwise
    dropout_keep: torch.Tensor | None = None
    #: the io-precision reference (oracle.io_precision; docs/DESIGN.md), each output in its
    #: port's dtype, on the oracle device; None for a device probe (judged by its bound only)
    io_reference: oracle.Backward | None = None
    io_reference_s: float = 0.0              # the part of oracle_s the io-precision reference took
    #: a ragged graph's slices: output port -> the judged rows of each sequence (they are
    #: back to back in judged_rows), for the statistical judge's sequence x head slices
    sequence_rows: Mapping[str, tuple[int, ...]] | None = None


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
    # Without overlap each element is written once, so the read-back (a device round trip)
    # could only agree.
    if writes_overlap(spec) and not torch.equal(bit_pattern(view_of(storage, spec)),
                                                bit_pattern(values.expand(spec.dims))):
        raise MaterializeError(f"case {case_id}: port {port}: strides {spec.strides} make "
                               f"elements overlap, so the derived values cannot all be stored")


# ----------------------------------------------------------------------------- building
def default_oracle_device(device: torch.device) -> torch.device:
    return device if device.type == "cuda" else torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _OracleClock:
    """Seconds in the oracle steps without waiting for the device between them: on a GPU,
    CUDA events around each step on the device's timeline, read once the case's work has
    finished; on the CPU, where every op is finished when it returns, the host's clock.
    (A device wait per step made each GPU case wait about 14 times; with several worker
    processes sharing a GPU each wait also waits for the others' work.)"""

    def __init__(self, device: torch.device):
        self.device, self._spans, self._host_s = device, [], 0.0

    def __enter__(self):
        if self.device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            start.record(torch.cuda.current_stream(self.device))
            self._spans.append([start, None])
        else:
            self._started = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            stop = torch.cuda.Event(enable_timing=True)
            stop.record(torch.cuda.current_stream(self.device))
            self._spans[-1][1] = stop
        else:
            self._host_s += time.perf_counter() - self._started
        return False

    def seconds(self) -> float:
        """The steps' total; on a GPU, call it after the device has finished them."""
        return self._host_s + sum(a.elapsed_time(b) for a, b in self._spans) / 1e3


def _input_storage(spec: TensorSpec, device: torch.device) -> torch.Tensor:
    """A storage on `device` whose unaddressed elements hold the input canary. On the CPU a
    dense view's span is left unfilled (every element of it is written next); a device fill
    costs next to nothing, so there the whole storage is filled."""
    if device.type != "cpu" or not is_dense(spec):
        return canary_storage(spec, device, output=False)
    storage = torch.empty(storage_size(spec), dtype=TORCH_DTYPES[spec.dtype])
    start, end = addressed_span(spec)
    fill_canary(storage[:start], spec.dtype, output=False)
    fill_canary(storage[end:], spec.dtype, output=False)
    return storage


def writes_overlap(spec: TensorSpec) -> bool:
    """Two of the drawn values (broadcast axes narrowed to one) land on one storage element:
    then which one stays depends on the order of the writes, which only the CPU keeps."""
    return overlaps_itself(dataclasses.replace(spec, dims=generated_shape(spec.dims, spec.strides)))


#: staging buffers for the copies to a GPU kept from one case to the next (per thread and
#: port): pinned once, so no case pays for pinning (or paging in) fresh host memory; a
#: larger one is allocated for its case alone
STAGING_MAX_BYTES = 1 << 26
_staging = threading.local()


def _staging_buffer(port: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    pin = device.type == "cuda"
    if numel * dtype.itemsize > STAGING_MAX_BYTES:
        return torch.empty(numel, dtype=dtype, pin_memory=pin)
    buffers = _staging.__dict__.setdefault("buffers", {})
    buf = buffers.get((port, dtype, pin))
    if buf is None or buf.numel() < numel:
        buf = buffers[(port, dtype, pin)] = torch.empty(numel, dtype=dtype, pin_memory=pin)
    return buf[:numel]


def _write_input(storage: torch.Tensor, spec: TensorSpec, values: torch.Tensor, port: str) -> None:
    """Write drawn float32 `values` (the generated shape) through the declared strides,
    rounded to the io dtype on the CPU. To a GPU only the rounded values travel (through a
    reused pinned buffer, asynchronously: the caller synchronises before the buffers are
    written again), and the strided write happens there; each element is written once
    (the caller keeps overlapping layouts on the CPU), so the bits do not depend on where
    the write happens."""
    shape = tuple(values.shape)
    if storage.device.type == "cpu":
        view_of(storage, spec, shape).copy_(values)
        return
    staged = _staging_buffer(port, values.numel(), storage.dtype, storage.device).view(shape)
    staged.copy_(values)
    view_of(storage, spec, shape).copy_(staged.to(storage.device, non_blocking=True))


class _Snapshots(Mapping):
    """input port -> a CPU copy of its whole storage as materialized, made on first use
    from the baseline (repro and the tests read them; a run never does)."""

    def __init__(self, baselines: Mapping[str, torch.Tensor]):
        self._baselines, self._copies = baselines, {}

    def __getitem__(self, port: str) -> torch.Tensor:
        if port not in self._copies:
            base = self._baselines[port]
            self._copies[port] = base if base.device.type == "cpu" else base.cpu()
        return self._copies[port]

    def __iter__(self) -> Iterator[str]:
        return iter(self._baselines)

    def __len__(self) -> int:
        return len(self._baselines)


def materialize(case: Case, device: torch.device | str,
                oracle_device: torch.device | str | None = None, *,
                max_block_elems: int | None = None,
                dropout_keep: torch.Tensor | None = None) -> Materialized:
    """`dropout_keep`: for a graph with dropout and no dropout_mask port, the keep mask the
    engine announced it draws ([B, H_q, S_q, S_kv], 1 kept): the oracle's O and gradients
    use it as they would the port's."""
    graph, device = case.graph, torch.device(device)
    finding = frontend_finding(graph, offsets_on_device=is_device_probe(case))
    if finding is not None:
        raise MaterializeError(f"case {case.id}: the graph fails frontend validation ({finding})")
    seqs = None if graph.ragged is None else oracle_ragged.sequences(graph, good_sequences(graph))
    odev = torch.device(oracle_device) if oracle_device is not None else default_oracle_device(device)
    specs = graph.tensors

    # q, k, v, do: drawn on the CPU, rounded to the io dtype as they are written through
    # their strides (generate_inputs' values); the logical values are read back from
    # storage, so the oracle sees exactly what an engine reads. A layout whose writes
    # overlap is written on the CPU and copied whole.
    # A distribution whose dO is formed from O (l2-grad) keeps dO's draw (a copy: the draw
    # buffers are reused) and writes dO after the oracle's forward.
    storages: dict[str, torch.Tensor] = {}
    do_noise = None

    def write_input(port: str, values: torch.Tensor) -> None:
        spec = specs[port]
        where = torch.device("cpu") if writes_overlap(spec) else device
        storages[port] = _input_storage(spec, where)
        _write_input(storages[port], spec, values, port)
        if where != device:
            storages[port] = storages[port].to(device)

    for port, values in draw_inputs(graph, case.data.distribution, case.data.seed).items():
        if port == "do" and needs_o(case.data.distribution):
            do_noise = values.clone()
            continue
        write_input(port, values)
    # bias and sinks: small, written through their strides on the CPU (write_view checks a
    # broadcast axis's values agree) and copied whole
    for port, values in draw_modifiers(graph, case.data.bias_values, case.data.seed).items():
        host = _input_storage(specs[port], torch.device("cpu"))
        write_view(host, specs[port], values.to(TORCH_DTYPES[specs[port].dtype]),
                   case_id=case.id, port=port)
        storages[port] = host.to(device)

    def oracle_view(port: str) -> torch.Tensor:
        source = storages[port] if odev == device else storages[port].to(odev)
        return view_of(source, specs[port])

    q, k, v = (oracle_view(p) for p in ("q", "k", "v"))
    mods = oracle.Modifiers(
        bias=oracle_view("bias") if "bias" in specs else None,
        sinks=oracle_view("sinks") if "sinks" in specs else None,
        dbias_dims=specs["dbias"].dims if "dbias" in specs else None, dsinks="dsinks" in specs,
        dropout_keep=(oracle_view("dropout_mask") if "dropout_mask" in specs
                      else None if dropout_keep is None else dropout_keep.to(odev)),
        alibi_slopes=oracle_view("alibi_slopes") if "alibi_slopes" in specs else None)
    clock = _OracleClock(odev)
    with clock:
        if seqs is None:
            fwd = oracle.forward(q, k, v, graph.attributes, modifiers=mods,
                                 max_block_elems=max_block_elems)
        else:
            fwd = oracle_ragged.forward(q, k, v, graph.attributes, seqs, modifiers=mods,
                                        max_block_elems=max_block_elems)

    # O and Stats written on the case's device, where the oracle left them on a GPU
    o_values = fwd.o.to(TORCH_DTYPES[specs["o"].dtype])
    stats_values = fwd.lse.to(torch.float32).unsqueeze(-1)
    for port, values in (("o", o_values), ("stats", stats_values)):
        storages[port] = canary_storage(specs[port], device, output=False)
        write_view(storages[port], specs[port], values, case_id=case.id, port=port)
    if do_noise is not None:   # dO from O as the engine reads it, in dO's generated shape
        o_drawn = o_values
        for axis, size in enumerate(do_noise.shape):
            o_drawn = o_drawn.narrow(axis, 0, size)
        write_input("do", do_from_o(o_drawn, do_noise))
        del o_drawn, do_noise
    do = oracle_view("do")
    engine_forward = oracle.Forward(o=o_values, lse=fwd.lse.to(torch.float32))   # what an engine reads
    del o_values, stats_values

    with clock:
        if seqs is None:
            bwd = oracle.backward(q, k, v, do, graph.attributes, fwd, modifiers=mods,
                                  max_block_elems=max_block_elems)
        else:
            bwd = oracle_ragged.backward(q, k, v, do, graph.attributes, fwd, seqs, modifiers=mods,
                                         max_block_elems=max_block_elems)
    io_clock = _OracleClock(odev)
    io_ref = None
    if not is_device_probe(case):
        with clock, io_clock:
            io_ref = io_reference(graph, (q, k, v, do), engine_forward, mods, seqs, max_block_elems)
    del q, k, v, do, mods, engine_forward
    fwd = fwd.without_operands()  # frees the float64 copies of q, k, v

    for port in graph.output_ports:
        storages[port] = canary_storage(specs[port], device, output=True)
    if seqs is not None:
        _canary_padding(graph, specs, storages)
    # what the input-modified check compares with: a copy of each input storage made on
    # the device itself
    baselines = {port: storages[port].clone() for port in graph.input_ports}
    tensors = {port: view_of(storages[port], specs[port]) for port in graph.ports}
    judged = silent = offsets = sequence_rows = None
    if seqs is not None:
        judged, silent = _ragged_rows(graph, seqs, is_device_probe(case), odev)
        by_q, by_kv = tuple(s.q1 - s.q0 for s in seqs), tuple(s.k1 - s.k0 for s in seqs)
        sequence_rows = {"dq": by_q, "dk": by_kv, "dv": by_kv}
        offsets = {"cu_seqlens_q": graph.ragged.cu_seqlens_q, "cu_seqlens_kv": graph.ragged.cu_seqlens_kv,
                   **{p: getattr(graph.ragged, p) for p in graph.ragged.seqused_ports}}
        for port, values in offsets.items():
            tensors[port] = torch.tensor(values, dtype=torch.int32, device=device)
    # the one wait of materialize: the engine's time starts on an idle device, and the
    # staging buffers are free again from here on
    _sync(device)
    if odev != device:
        _sync(odev)
    return Materialized(
        case=case, device=device, tensors=tensors, storages=storages,
        origins={port: GUARD_ELEMS for port in graph.ports},
        unaddressed=_LazyMasks({port: specs[port] for port in graph.ports}, device, silent),
        snapshots=_Snapshots(baselines), baselines=baselines, reference=bwd, forward=fwd,
        oracle_s=clock.seconds(), judged_rows=judged, offsets=offsets, dropout_keep=dropout_keep,
        io_reference=io_ref, io_reference_s=io_clock.seconds(), sequence_rows=sequence_rows)



#: the input ports of each side of a ragged graph (stats, o, do: the query side)
_SIDE_INPUTS = {"q": ("q", "o", "do", "stats"), "kv": ("k", "v")}


def padding_rows(graph: Graph, side: str) -> tuple[range, ...]:
    """A padded ragged graph's padding rows on `side` (q or kv): each sequence's rows past
    its used length, up to the end of its cu_seqlens range (only sequences whose offsets
    and used length are in range: validate.good_sequences)."""
    rag = graph.ragged
    if getattr(rag, f"seqused_{side}") is None:
        return ()
    cu, used = getattr(rag, f"cu_seqlens_{side}"), rag.used_lengths(side)
    return tuple(range(cu[b] + used[b], cu[b + 1]) for b in good_sequences(graph)
                 if cu[b] + used[b] < cu[b + 1])


def _canary_padding(graph: Graph, specs, storages) -> None:
    """The input canary into every input's padding rows (a padded ragged graph): an engine
    that reads them gets NaN (DESIGN section 10)."""
    for side, ports in _SIDE_INPUTS.items():
        for rows in padding_rows(graph, side):
            for port in ports:
                spec = specs[port]
                bits = storages[port].view(BITS_DTYPES[spec.dtype])
                view_of(bits, spec)[rows.start:rows.stop] = canary_bits(spec.dtype, output=False)


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
    silent_q = (range(0, rag.cu_seqlens_q[0]), range(rag.cu_seqlens_q[-1], graph.T_q), *padding_rows(graph, "q"))
    silent_kv = (range(0, rag.cu_seqlens_kv[0]), range(rag.cu_seqlens_kv[-1], graph.T_kv),
                 *padding_rows(graph, "kv"))
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
    for name in oracle.MODIFIER_FIELDS:   # dBias (padded layout) and dSinks: judged whole
        ref[name] = getattr(m.reference, name)
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


def flagged(flags: Mapping[str, torch.Tensor]) -> list[str]:
    """The ports whose device flag is set, read back with one transfer."""
    return set_ports(flags, read_flags(list(flags.values())))


def guard_flags(m: Materialized) -> dict[str, torch.Tensor]:
    """port -> device bool scalar: the port's storage (inputs and outputs) holds a
    non-canary bit pattern in an unaddressed element. Not read back."""
    return {port: _guard_flag(m, port) for port in m.case.graph.ports}


def modified_flags(m: Materialized) -> dict[str, torch.Tensor]:
    """input port -> device bool scalar: its storage (guards included) differs bitwise
    from its baseline copy. Not read back."""
    def differs(port):
        if port in (m.offsets or ()):
            now = m.tensors[port]
            return _differs_anywhere(now, torch.tensor(m.offsets[port], dtype=now.dtype, device=now.device))
        now = bit_pattern(m.storages[port])
        return _differs_anywhere(now, bit_pattern(m.baselines[port].to(now.device)))
    return {port: differs(port)
            for port in m.case.graph.input_ports + tuple(m.offsets or ())}


def guard_violations(m: Materialized) -> list[str]:
    """Ports (inputs and outputs) with a non-canary bit pattern in an unaddressed element."""
    return flagged(guard_flags(m))


def modified_inputs(m: Materialized) -> list[str]:
    """Input ports whose storage (guards included) differs bitwise from its baseline copy."""
    return flagged(modified_flags(m))


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
