"""Judging an engine that draws its own dropout mask (docs/CONTRACTS.md, "Dropout").

A graph with dropout_probability p > 0 and no dropout_mask port asks the engine to draw its
mask itself, from a counter-based generator (a seed and an offset, as FlashAttention and
PyTorch's kernels do), whose mask is a function of the seed, the offset and the sizes
alone. Such an engine (`Engine.draws_dropout_mask`) tells the mask through
`Engine.drawn_dropout_mask(graph)`: before the run, so that the O it is handed and the
oracle's reference are those of that mask; and after the run, when the mask must be the
same one (the same seed and offset give the same mask) and is checked: its dims, values
0 or 1, and a keep count within a binomial bound of n (1 - p), n the entries the graph's
mask attends (a bit the mask removes scales nothing, and a kernel that skips such tiles
never draws it)."""
from __future__ import annotations

import math

import torch

from bundlegen.graph import Case, Graph
from bundlegen.harness import materialize as M
from bundlegen.mask import keep_mask

#: a drawn mask's keep count may differ from n (1 - p) by this many standard deviations
KEEP_RATE_SIGMAS = 6.0


def draws_here(graph: Graph, engine) -> bool:
    """The graph asks the engine for a mask of its own, and the engine draws one."""
    return graph.asks_drawn_dropout and bool(getattr(engine, "draws_dropout_mask", False))


def mask_problem(keep: torch.Tensor | None, graph: Graph) -> str | None:
    """Why a told mask cannot be the one drawn for `graph`, or None: its dims, its values
    (0 or 1), its keep count within KEEP_RATE_SIGMAS standard deviations of
    Binomial(n, 1 - p) (a wrong p or a stuck generator)."""
    p = graph.attributes.dropout_probability
    want = (graph.B, graph.H_q, graph.S_q, graph.S_kv)
    if keep is None:
        return "the engine told no drawn dropout mask"
    if tuple(keep.shape) != want:
        return f"drawn dropout mask of dims {list(keep.shape)}, not {list(want)}"
    if not bool(((keep == 0) | (keep == 1)).all()):
        return "drawn dropout mask holds values other than 0 and 1"
    attended = keep_mask(graph.S_q, graph.S_kv, graph.attributes, device=keep.device)
    if attended is None:
        n, kept = keep.numel(), int(keep.sum())
    else:
        n = int(attended.sum()) * graph.B * graph.H_q
        kept = int((keep * attended).sum())
    bound = KEEP_RATE_SIGMAS * math.sqrt(n * p * (1 - p)) + 1
    if abs(kept - n * (1 - p)) > bound:
        return (f"drawn dropout mask keeps {kept} of {n} entries: outside {n * (1 - p):.0f} "
                f"+- {bound:.0f} for p = {p:g}")
    return None


def materialized(case: Case, engine) -> M.Materialized:
    """materialize(case) on the engine's device, with the mask the engine announces when it
    draws its own (a mask with a problem is not used: the check after the run fails it)."""
    keep = None
    if draws_here(case.graph, engine):
        told = engine.drawn_dropout_mask(case.graph)
        keep = told if mask_problem(told, case.graph) is None else None
    return M.materialize(case, engine.device, dropout_keep=keep)


def problem_after_run(m: M.Materialized, engine) -> str | None:
    """After the run: why the engine's drawn mask fails (its checks, or not the mask it
    announced before the run for the same seed and offset), or None."""
    graph = m.case.graph
    if not draws_here(graph, engine):
        return None
    keep = engine.drawn_dropout_mask(graph)
    problem = mask_problem(keep, graph)
    if problem is not None:
        return problem
    if m.dropout_keep is None or not torch.equal(keep.cpu(), m.dropout_keep.cpu()):
        return "the dropout mask drawn differs from the one announced for the same seed and offset"
    return None
