"""The engines' smoke checks on the harness's own pieces: one graph, laid out and filled
by `materialize` (canary-guarded storages, inputs from a seed, O and Stats from the float64
oracle forward, the oracle backward as the reference), one engine run, and what the
harness's checks say of it: canaries outside the declared views, inputs modified, NaN/Inf
in the outputs, each output's error against the oracle. No verdict: a smoke script reads
the record and applies its own pass rule (bench/triton_selfcheck.py,
bench/torch_sdpa_selfcheck.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from bundlegen.graph import Case, DataSpec, Graph
from bundlegen.harness import checks
from bundlegen.harness import materialize as M
from bundlegen.harness.config import Tolerance

#: the purpose a smoke case is laid out for: a valid graph the engine is asked to serve
PURPOSE = "claim"


def smoke_case(graph: Graph, seed: int, label: str = "selfcheck", *,
               distribution: str = "randn", bias_values: str = "randn") -> Case:
    """A case of one graph, as a bundle would hold it, without a bundle."""
    return Case(id=label, purpose=PURPOSE, items=(), graph=graph,
                data=DataSpec(seed=seed, distribution=distribution, bias_values=bias_values))


def prepare(graph: Graph, seed: int, device: torch.device | str, label: str = "selfcheck",
            **data) -> M.Materialized:
    """The graph's tensors in memory, as the harness lays out a case (`data`: smoke_case's
    distribution and bias_values)."""
    return M.materialize(smoke_case(graph, seed, label, **data), device)


@dataclass(frozen=True)
class Finding:
    """What the harness's checks say of one engine run on a prepared graph."""
    #: output port -> its error against the oracle under the tolerance asked for
    errors: Mapping[str, checks.OutputError]
    #: output port -> max |reference|, for errors relative to the output's scale
    ref_max: Mapping[str, float]
    wrote_outside: tuple[str, ...]      # ports with a canary overwritten outside their view
    modified_inputs: tuple[str, ...]    # input ports whose storage changed
    nonfinite: tuple[str, ...]          # output ports holding a NaN or Inf

    def relative_error(self, port: str, floor: float = 1e-4) -> float:
        """max |err| / max |reference| (the reference's scale floored at `floor`)."""
        return self.errors[port].max_abs_err / max(self.ref_max[port], floor)

    @property
    def worst_normalized_error(self) -> float:
        """The largest normalized error (1 / margin) over the outputs: > 1 is outside."""
        return max((e.normalized_error for e in self.errors.values()), default=0.0)

    @property
    def memory_intact(self) -> bool:
        return not self.wrote_outside and not self.modified_inputs


def judge(m: M.Materialized, tol: Tolerance) -> Finding:
    """The checks on the engine's outputs now in `m` (after its run)."""
    outputs, reference = M.judged_outputs(m)
    ports = m.case.graph.output_ports
    pairs = checks.output_pairs({p: outputs[p] for p in ports}, reference)
    errors = checks.output_errors(pairs, tol)
    ref_max = {p: float(reference.gradient(p).abs().max()) if reference.gradient(p).numel() else 0.0
               for p in ports}
    return Finding(errors=errors, ref_max=ref_max,
                   wrote_outside=tuple(M.guard_violations(m)),
                   modified_inputs=tuple(M.modified_inputs(m)),
                   nonfinite=tuple(M.nonfinite_outputs(m)))


def run_and_judge(engine, m: M.Materialized, tol: Tolerance) -> Finding:
    """Run `engine` on the prepared tensors, wait for its device, and judge."""
    engine.run(m.case.graph, m.tensors)
    if m.device.type == "cuda":
        torch.cuda.synchronize(m.device)
    return judge(m, tol)


def output_copies(m: M.Materialized) -> dict[str, torch.Tensor]:
    """port -> a copy of each output's storage (for bitwise re-run comparisons)."""
    return {p: m.storages[p].clone() for p in m.case.graph.output_ports}


def same_bits(m: M.Materialized, before: Mapping[str, torch.Tensor]) -> bool:
    """Every output storage holds the bits of its copy in `before` (output_copies)."""
    return all(checks.bitwise_equal(copy, m.storages[p]) for p, copy in before.items())
