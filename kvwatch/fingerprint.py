"""What an engine says about itself, and when that says it was redeployed (pure).

Most faults of the class kvwatch hunts arrive with a change: a new engine release, a restart
with other flags, another window or KV pool, new weights. Every capacity check already reads
the engine's self-report at no GPU cost; its *fingerprint* keeps only the facts whose change
means a redeploy (model, window, pool, release or build, process start, weights) and never
load or uptime, so a busy engine never looks changed.

An engine that stops answering its self-report and then answers again was most likely
restarted (a crash loop, a rollout that replaced the pod) even if every field is the same:
that is a change too, once it missed ``MISSES_TO_DOWN`` checks in a row — one slow answer
under a long prefill is not a restart.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from kvwatch.canary.model import ProbeKind
from kvwatch.engines.base import Discovery

Fingerprint = Mapping[str, str]
# Consecutive self-reports missed before the endpoint counts as down (its return: a restart).
MISSES_TO_DOWN = 2
# A restart with nothing else changed moves only this field (vLLM's process start).
RESTART_FIELDS = frozenset({"process_start"})


class Reason(enum.StrEnum):
    FINGERPRINT = "fingerprint"  # the engine reports other facts about itself
    RESTART = "restart"  # the same facts, from a new process (or after it stopped answering)


def fingerprint_of(discovery: Discovery) -> dict[str, str]:
    """The facts of ``discovery`` that identify the deployment, as text by field name."""
    fields = dict(discovery.identity)
    for name, value in (
        ("model", discovery.model),
        ("context_window", discovery.context_window),
        ("kv_pool_tokens", discovery.kv_pool_tokens),
        ("max_prompt_tokens", discovery.max_prompt_tokens),
    ):
        if value is not None:
            fields[name] = str(value)
    return dict(sorted(fields.items()))


def digest(fingerprint: Fingerprint) -> str:
    """A stable hash of ``fingerprint`` (field order does not matter)."""
    text = json.dumps(dict(sorted(fingerprint.items())), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Seen:
    """What is known of an endpoint: its last fingerprint, and the self-reports it has missed
    in a row since."""

    fields: Fingerprint | None
    misses: int = 0


@dataclass(frozen=True, slots=True)
class Change:
    reason: Reason
    before: Fingerprint
    after: Fingerprint

    @property
    def fields(self) -> list[str]:
        """The fields that differ (none for a return after silence)."""
        names = set(self.before) | set(self.after)
        return sorted(n for n in names if self.before.get(n) != self.after.get(n))


def observe(previous: Seen | None, now: Fingerprint | None) -> tuple[Seen, Change | None]:
    """What is known after a capacity check that read ``now`` (None: the engine did not
    answer), and the change it shows, if any. The first fingerprint ever seen is no change:
    there is nothing to compare it with."""
    if now is None:
        fields = previous.fields if previous is not None else None
        misses = previous.misses + 1 if previous is not None else 1
        return Seen(fields, misses), None
    seen = Seen(dict(now))
    if previous is None or previous.fields is None:
        return seen, None
    before = previous.fields
    if previous.misses >= MISSES_TO_DOWN:
        return seen, Change(Reason.RESTART, before, now)
    if dict(before) == dict(now):
        return seen, None
    change = Change(Reason.FINGERPRINT, before, now)
    if set(change.fields) <= RESTART_FIELDS:
        change = Change(Reason.RESTART, before, now)
    return seen, change


def run_after(at: datetime, last_run: datetime | None, min_gap_seconds: float) -> datetime:
    """When the canaries of a change seen ``at`` may run: at once, unless the endpoint's
    previous change ran them less than the gap ago (a flapping engine must not burn the
    GPU); then when the gap ends."""
    if last_run is None:
        return at
    return max(at, last_run + timedelta(seconds=min_gap_seconds))


def change_kinds(probes: tuple[ProbeKind, ...]) -> tuple[ProbeKind, ...]:
    """The kinds a change runs at once: every configured kind that sends a prompt (under,
    over, baseline, burst, and any later one). The capacity check is what saw the change,
    and its chain already ran the edge probe if the new pool is smaller than the window."""
    return tuple(kind for kind in probes if kind is not ProbeKind.CAPACITY)
