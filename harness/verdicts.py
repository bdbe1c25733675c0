"""Every verdict a case can get (DESIGN section 5, CONTRACTS "Results"), and which of them
fail a run. Nothing else in the harness spells a verdict string."""
from __future__ import annotations

PASS = "pass"
FAIL_NUMERIC = "fail:numeric"           # outside the worst-case bound
FAIL_STATISTICAL = "fail:statistical"   # error many times an honest io-precision computation's
FAIL_GUARD = "fail:guard"
FAIL_INPUT_MODIFIED = "fail:input-modified"
FAIL_NAN = "fail:nan"
FAIL_NONDETERMINISTIC = "fail:nondeterministic"
DECLINED = "declined"
CLAIM_BROKEN = "claim-broken"
REJECTED = "rejected"
REJECTION_ACCEPTED = "rejection-accepted"
SKIPPED = "skipped"
CRASHED = "crashed"
ERROR_BUNDLE = "error:bundle"
# device probes (bad ragged offsets only device code sees; DESIGN section 10)
CONTAINED = "contained"                # ran, touched nothing outside, good sequences right
FAIL_ESCAPED = "fail:escaped"          # wrote outside its tensors or into an input
FAIL_CORRUPTED = "fail:corrupted"      # a good sequence's gradients wrong or NaN

#: every verdict, in the order summaries list them
ALL = (PASS, REJECTED, CONTAINED, DECLINED, SKIPPED, FAIL_NUMERIC, FAIL_STATISTICAL, FAIL_GUARD,
       FAIL_INPUT_MODIFIED, FAIL_NAN, FAIL_NONDETERMINISTIC, FAIL_ESCAPED, FAIL_CORRUPTED,
       CLAIM_BROKEN, REJECTION_ACCEPTED, CRASHED, ERROR_BUNDLE)

#: a run with any of these exits 1
FAILING = frozenset({FAIL_NUMERIC, FAIL_STATISTICAL, FAIL_GUARD, FAIL_INPUT_MODIFIED, FAIL_NAN,
                     FAIL_NONDETERMINISTIC, FAIL_ESCAPED, FAIL_CORRUPTED, CLAIM_BROKEN, REJECTION_ACCEPTED, CRASHED,
                     ERROR_BUNDLE})

#: what a claimed case becomes claim-broken for (DESIGN section 5: declined or failed)
CLAIM_BREAKING = frozenset({FAIL_NUMERIC, FAIL_STATISTICAL, FAIL_GUARD, FAIL_INPUT_MODIFIED, FAIL_NAN,
                            FAIL_NONDETERMINISTIC, DECLINED})

#: verdicts that say the engine did not run the case, for a reason that is not a failure
NOT_RUN = frozenset({DECLINED, SKIPPED})

#: `bundlegen run` exit codes: nothing failed; something failed; bad usage; nothing failed
#: but nothing was tested either (every case declined or skipped, or none selected), which
#: must not pass a CI job unless asked for (--allow-empty; 5 is pytest's "no tests ran");
#: stopped by Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOTHING_TESTED, EXIT_INTERRUPTED = 0, 1, 2, 5, 130

#: the detail of a case the cost model keeps off the CPU
TOO_LARGE_FOR_CPU = "too large for cpu"
#: the start of the detail of a case whose footprint passes its level's byte ceiling
TOO_LARGE = "too large"


def is_failing(verdict: str) -> bool:
    return verdict in FAILING
