"""The generator: expands a plan (plans/sdpa_bwd.py) into bundles, their manifest and
the dry-run report. `build(plan) -> GeneratedPlan` does the work without I/O."""
from bundlegen.generator.generate import build, build_default
from bundlegen.generator.errors import PlanError

__all__ = ["build", "build_default", "PlanError"]
