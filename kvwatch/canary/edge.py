"""The *edge* probe's verdict (issue 4): a prompt just over the KV pool, inside the window.

This is exactly the gap where the incident happened: an engine advertising a window larger
than its KV pool swapped such a prompt for a placeholder and answered 200 from other users'
cache pages. At the edge an engine has two honest answers: reject the prompt with a 4xx
context-length error, or answer it from the whole prompt (marker recalled, usage as planned).
Everything else is the usual verdict for what went wrong. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kvwatch.canary.model import (
    Exchange,
    ForeignMarker,
    Judgement,
    PlannedPrompt,
    ProbeKind,
    Rejection,
    Verdict,
)
from kvwatch.canary.scan import AnswerScan
from kvwatch.canary.verdicts import judge


def judge_edge(
    plan: PlannedPrompt,
    ex: Exchange,
    foreign: Sequence[ForeignMarker] = (),
    *,
    tenant: str | None = None,
    scan: AnswerScan | None = None,
) -> Judgement:
    """Classify an edge probe. A 2xx is judged exactly like *under* (marker, usage, stream);
    a 4xx context-length rejection passes; any other non-2xx is a ``wrong_rejection``."""
    # Judged as a recall probe: the same checks, in the same order, for every 2xx, and the
    # same transport / auth / throttling / leak verdicts for everything before a status.
    as_recall = dataclasses.replace(plan, kind=ProbeKind.UNDER)
    judgement = judge(as_recall, ex, foreign, tenant=tenant, scan=scan)
    status = ex.status
    if (
        judgement.verdict in (Verdict.ERROR, Verdict.UNDER_REJECTED)
        and ex.transport_error is None
        and status is not None
        and not 200 <= status < 300
    ):
        if 400 <= status < 500 and ex.rejection is Rejection.CONTEXT_LENGTH:
            reason = (
                f"{plan.planned_tokens}-token prompt over the KV pool rejected with HTTP "
                f"{status} context-length error"
            )
            return dataclasses.replace(judgement, verdict=Verdict.PASS, reason=reason)
        reason = (
            f"prompt over the KV pool answered HTTP {status}, not a 4xx context-length "
            f"error: {ex.error_detail or 'no detail'}"
        )
        return dataclasses.replace(judgement, verdict=Verdict.WRONG_REJECTION, reason=reason)
    return judgement
