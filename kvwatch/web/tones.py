"""How a verdict looks: its colour class, from the severity DESIGN §2 gives it.

Pure presentation logic shared by the pages, the SVG charts and the API (``tone`` fields), so
a colour means the same thing everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvwatch.canary.model import SEVERITY, ProbeState, Severity, Verdict

# Worst first: the order in which a mixed set of probes takes its colour.
# "info" is healthy but worth seeing: an engine that truncates by design (over_truncated).
TONES = ("critical", "warning", "error", "unknown", "pending", "muted", "info", "ok", "none")
_RANK = {tone: len(TONES) - i for i, tone in enumerate(TONES)}

# Problems of the probe path rather than of the endpoint's answers: grey-amber, not amber.
_PATH_PROBLEMS = frozenset({Verdict.ERROR, Verdict.AUTH_ERROR})


def tone(verdict: str | None, state: str = ProbeState.DONE.value) -> str:
    """The colour class of one probe: ok, info, critical, warning, error, muted, pending,
    unknown."""
    if state != ProbeState.DONE.value or verdict is None:
        return "pending"  # running or interrupted: no verdict to colour
    try:
        v = Verdict(verdict)
    except ValueError:
        return "unknown"  # a verdict from a newer kvwatch sharing the database
    if v in _PATH_PROBLEMS:
        return "error"
    severity = SEVERITY[v]
    if severity is Severity.CRITICAL:
        return "critical"
    if severity is Severity.WARNING:
        return "warning"
    if severity is Severity.INFO:
        return "info"
    return "ok" if v is Verdict.PASS else "muted"


def worst(tones: Iterable[str]) -> str:
    """The most alarming of ``tones``; ``none`` when there are none."""
    return max(tones, key=lambda t: _RANK.get(t, 0), default="none")


def severity(verdict: str | None) -> str | None:
    """DESIGN §2 severity of a verdict, or None for no verdict or an unknown one."""
    if verdict is None:
        return None
    try:
        return SEVERITY[Verdict(verdict)].value
    except ValueError:
        return None
