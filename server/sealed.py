"""What a sealed split's verdicts may say (DESIGN §4): pass/fail and component scores only.

Families write free-text feedback (test output, the expected value, a mesh's measured
volume, a script's stderr run on hidden parameters). On a public split that helps; on a
sealed split it is how held-out answers leak. The episode manager passes every verdict of
a sealed task through `seal` once, where it is made, before it is cached, stored, put in a
step reply, a trajectory, a void reason or the sampler's history: so no family (a new one
included) can forget to, and no later path can serve the original. The original feedback
stays in the server's memory for admin tokens only (`EpisodeManager.verify`/`state`).
"""

from __future__ import annotations

from palaestra.sdk.models import Verdict

WITHHELD = "the verifier's details are withheld on a sealed split"


def sealed_feedback(verdict: Verdict) -> str:
    """The feedback a sealed verdict carries: its outcome, nothing the verifier wrote."""
    if verdict.status == "void":
        outcome = "void"
    else:
        outcome = "passed" if verdict.passed else "failed"
        if verdict.failure:
            outcome += f" ({verdict.failure})"
    return f"{outcome}; {WITHHELD}"


def seal(verdict: Verdict) -> Verdict:
    """`verdict` as a sealed split may show it: reward, pass/fail, failure class, components."""
    return verdict.model_copy(update={"feedback": sealed_feedback(verdict)})
