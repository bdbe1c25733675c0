"""Engine mutants and the kill matrix (DESIGN section 8).

A mutant is a correct engine with one real defect put back in: a wrapper that hands the
engine altered views or graphs, post-processes its outputs or drops one of its decline
arms (mutants/wrappers.py), or the Triton engine with an edited copy of its launcher or
kernels (mutants/triton_source.py).
`bundlegen mutate` runs every mutant over a level's cases through the harness and reports
which case killed it (mutants/kill.py); a mutant that survives a level is a hole in the plan.
"""
