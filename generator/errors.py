"""The one error type for bad plan input."""


class PlanError(ValueError):
    """The plan is malformed; the message names the plan entry at fault
    (e.g. "rule 'qkv-interleaved-needs-equal-heads': unknown value 'x' for axis 'heads'")."""
