"""Building real probe targets (config → engine → counter → store row) for tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import yaml
from prometheus_client import CollectorRegistry

from kvwatch.config import Config, parse_config
from kvwatch.daemon import build_targets
from kvwatch.metrics import ProbeMetrics
from kvwatch.probe.model import Target
from kvwatch.probe.runner import ProbeRunner
from kvwatch.store.repository import Store


def config_for(endpoints: Sequence[Mapping[str, Any]], *, database: str, **top: Any) -> Config:
    """A real, validated config for the given endpoint entries."""
    doc: dict[str, Any] = {"database": database, "endpoints": list(endpoints), **top}
    return parse_config(yaml.safe_dump(doc), source="<test>")


def sim_endpoint_entry(sim: Any, name: str, **overrides: Any) -> dict[str, Any]:
    """A config entry for a simulator endpoint, using the endpoint's own window and model."""
    ep = next(e for e in sim.endpoints if e.name == name)
    entry: dict[str, Any] = {
        "name": name,
        "url": sim.url_for(name),
        "model": ep.model,
        "context_window": ep.window,
        "interval": "1m",
        "jitter": "0s",
    }
    entry.update(overrides)
    return entry


def targets_and_runner(
    config: Config, store: Store, client: httpx.AsyncClient
) -> tuple[dict[str, Target], ProbeRunner, ProbeMetrics]:
    metrics = ProbeMetrics(CollectorRegistry())
    targets = build_targets(config.resolved_endpoints(), store, lambda _name: client, metrics)
    runner = ProbeRunner(store=store, metrics=metrics, replica="test-replica")
    return {t.spec.name: t for t in targets}, runner, metrics
