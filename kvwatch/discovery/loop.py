"""The refresh loop: each source fetched on its own interval, its last good list kept.

A failed refresh (source down, bad list) is logged and counted and changes nothing: the
endpoints found before go on being probed, as Prometheus keeps its last good target list.
When a list changes, ``on_change`` is called; the daemon then merges every source's list with
the static endpoints through the same path as a configuration reload. It returns whether that
worked: one that did not (the database was down) is tried again at the next poll, since the
list itself will not change to prompt it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

import structlog

from kvwatch.config.resolve import EndpointSpec
from kvwatch.discovery.sources import FetchError, Source
from kvwatch.metrics import DiscoveryMetrics

log = structlog.get_logger("kvwatch.discovery")


class DiscoveryLoop:
    def __init__(
        self,
        sources: Sequence[Source],
        *,
        on_change: Callable[[], Awaitable[bool]],
        metrics: DiscoveryMetrics,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._sources = list(sources)
        self._on_change = on_change
        self._metrics = metrics
        self._clock = clock
        self._lists: dict[str, list[EndpointSpec]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._unapplied = False

    def endpoints(self) -> list[EndpointSpec]:
        """Every source's last good list, in the order the sources are configured."""
        return [spec for source in self._sources for spec in self._lists.get(source.name, ())]

    def listed_all(self) -> bool:
        """Whether every source has given a good list since it was configured: until then,
        an endpoint none lists may be one a source that has not answered yet would list."""
        return all(source.name in self._lists for source in self._sources)

    async def refresh(self, source: Source) -> bool:
        """Fetch ``source`` once; True when its list changed."""
        try:
            found = await source.fetch()
        except FetchError as exc:
            log.error(
                "discovery_refresh_failed",
                source=source.name,
                reason=exc.reason,
                error=str(exc),
                kept=len(self._lists.get(source.name, ())),
            )
            self._metrics.failed(source.name, exc.reason)
            return False
        before = self._lists.get(source.name)
        if found is None:  # unchanged since the last good fetch
            found = before or []
        self._lists[source.name] = found
        self._metrics.refreshed(source.name, len(found), self._clock())
        if found == before:
            return False
        old = {spec.name for spec in before or ()}
        new = {spec.name for spec in found}
        log.info(
            "discovery_changed",
            source=source.name,
            endpoints=len(found),
            added=sorted(new - old),
            removed=sorted(old - new),
        )
        return True

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._follow(source), name=f"discovery-{source.name}")
            for source in self._sources
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def replace(self, sources: Sequence[Source]) -> None:
        """Follow ``sources`` instead (a reload). A new or changed source is fetched at once,
        so the caller applies its list straight away; until that works, a changed source
        keeps the list it had (its endpoints are not dropped only to come back). A source no
        longer configured is forgotten."""
        await self.stop()
        # A list, not a set: the configuration models hold lists and do not hash.
        before = [(s.name, s.config, s.defaults) for s in self._sources]
        names = {s.name for s in sources}
        for old in self._sources:
            if old.name not in names:
                self._metrics.forget(old.name)
        self._lists = {name: specs for name, specs in self._lists.items() if name in names}
        self._sources = list(sources)
        for source in sources:
            if (source.name, source.config, source.defaults) not in before:
                await self.refresh(source)
        self.start()

    async def _follow(self, source: Source) -> None:
        while True:
            if await self.refresh(source) or self._unapplied:
                try:
                    self._unapplied = not await self._on_change()
                except Exception as exc:  # the loop must outlive one failed apply
                    log.error("discovery_apply_failed", source=source.name, error=str(exc))
                    self._unapplied = True
            await asyncio.sleep(source.poll_seconds)
