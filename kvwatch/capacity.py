"""The continuous capacity check (DESIGN §1, issue 4): configured vs discovered window and pool.

Pure: it compares numbers an engine reported (a :class:`~kvwatch.engines.base.Discovery`)
with the endpoint's configuration and says what is wrong, with both numbers. The engine call
and the scheduling live with the caller.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kvwatch.canary.model import Severity
from kvwatch.config.capacity import capacity_message, exceeds_capacity
from kvwatch.engines.base import Discovery


class FindingKind(enum.StrEnum):
    # The engine advertises a window larger than the KV pool that must hold it: the
    # incident's precondition (verdict capacity_mismatch, alert KVWatchCapacityMismatch).
    CAPACITY_MISMATCH = "capacity_mismatch"
    # The configuration says one number and the engine another; configuration wins, but
    # someone should look (never pages).
    CONFIG_DISAGREES = "config_disagrees"


SEVERITY: dict[FindingKind, Severity] = {
    FindingKind.CAPACITY_MISMATCH: Severity.CRITICAL,
    FindingKind.CONFIG_DISAGREES: Severity.WARNING,
}


@dataclass(frozen=True, slots=True)
class Finding:
    kind: FindingKind
    message: str
    window: int | None = None
    pool: int | None = None

    @property
    def severity(self) -> Severity:
        return SEVERITY[self.kind]


def assess(
    configured_window: int | None,
    configured_pool: int | None,
    discovery: Discovery,
) -> list[Finding]:
    """Findings for one endpoint, most severe first. An empty list means nothing to report.

    The mismatch is judged on the engine's own numbers, since that is what it serves; the
    configured pair is the start-up gate's business (``config.capacity``), but a configured
    window over a *discovered* pool is the same precondition and is reported too.
    """
    findings: list[Finding] = []
    window, pool = discovery.context_window, discovery.kv_pool_tokens
    if window is not None and pool is not None and exceeds_capacity(window, pool):
        findings.append(
            Finding(
                FindingKind.CAPACITY_MISMATCH,
                f"engine reports {capacity_message(window, pool)}",
                window=window,
                pool=pool,
            )
        )
    elif (
        configured_window is not None
        and pool is not None
        and configured_pool is None
        and exceeds_capacity(configured_window, pool)
    ):
        findings.append(
            Finding(
                FindingKind.CAPACITY_MISMATCH,
                f"configured {capacity_message(configured_window, pool)} (pool as reported "
                "by the engine)",
                window=configured_window,
                pool=pool,
            )
        )
    for what, configured, discovered in (
        ("context_window", configured_window, window),
        ("kv_pool_tokens", configured_pool, pool),
    ):
        if configured is not None and discovered is not None and configured != discovered:
            findings.append(
                Finding(
                    FindingKind.CONFIG_DISAGREES,
                    f"{what} is configured as {configured} but the engine reports {discovered}",
                    window=window,
                    pool=pool,
                )
            )
    return findings


def edge_pool(configured_pool: int | None, discovery: Discovery) -> int | None:
    """The pool an edge probe should sit just over: configuration wins over discovery."""
    return configured_pool if configured_pool is not None else discovery.kv_pool_tokens
