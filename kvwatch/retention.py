"""Retention: old probe results are deleted in batches; critical ones are kept longer."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import structlog

from kvwatch.canary.model import SEVERITY, Severity
from kvwatch.config.model import Retention
from kvwatch.store.errors import StoreError
from kvwatch.store.repository import Store

log = structlog.get_logger("kvwatch.retention")

# A critical verdict is incident evidence (a foreign marker names other users' requests).
CRITICAL_VERDICTS = tuple(v.value for v, s in SEVERITY.items() if s is Severity.CRITICAL)


def prune_once(store: Store, retention: Retention, now: datetime | None = None) -> int:
    """Delete what retention says is old; returns how many probes went."""
    now = now or datetime.now(UTC)
    deleted = store.prune(
        now - timedelta(seconds=retention.probes), keep_verdicts=CRITICAL_VERDICTS
    )
    deleted += store.prune(now - timedelta(seconds=retention.critical))
    return deleted


async def retention_loop(store: Store, retention: Retention) -> None:
    """Prune now and then every ``retention.every``; a failed round is logged, not fatal."""
    while True:
        try:
            deleted = await asyncio.to_thread(prune_once, store, retention)
            if deleted:
                log.info("pruned", probes=deleted)
        except StoreError as exc:
            log.warning("prune_failed", error=str(exc))
        await asyncio.sleep(retention.every)
