"""What the web layer is given by the composition root."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from kvwatch.store.repository import Store
from kvwatch.web.settings import WebSettings


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class WebContext:
    store: Store
    registry: CollectorRegistry
    # Liveness is in-process only: is the scheduler still scheduling?
    alive: Callable[[], bool]
    settings: WebSettings = field(default_factory=WebSettings)
    # "Now" for default windows (last 24 h, recently resolved); tests pass a fixed clock.
    now: Callable[[], datetime] = utcnow
    # POST /-/reload: re-read the configuration (the daemon's; None where there is none).
    reload: Callable[[], Awaitable[tuple[bool, str]]] | None = None
    # An endpoint's canary tokens a day and what its schedule plans (the daemon's
    # ProbeMetrics.budget_of; None without a budget). Not read back from the registry's
    # gauge: that collects every series of every endpoint for one value.
    budget: Callable[[str], tuple[int, int | None] | None] = lambda _name: None
    # The names of the endpoints the daemon probes now, which the overview and the API's
    # endpoint list show (None: every endpoint stored, where no daemon runs beside the web
    # layer). The database keeps every endpoint ever registered; a removed one's history
    # stays reachable by name.
    probed: Callable[[], Collection[str]] | None = None

    def shown_endpoints(self) -> Collection[str] | None:
        """The endpoint names the overview and the API's list show; None: every one stored."""
        return None if self.probed is None else self.probed()
