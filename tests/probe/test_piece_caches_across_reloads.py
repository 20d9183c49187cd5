"""Filler piece counts are kept per model across reloads: endpoints a reload adds use the
counts already made, and a model nobody serves any more is forgotten."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from kvwatch.daemon import build_targets, drop_unused_piece_caches
from kvwatch.metrics import ProbeMetrics
from kvwatch.store import create_engine_for
from kvwatch.store.migrate import upgrade_engine
from kvwatch.store.repository import Store
from kvwatch.tokens.server import PieceCache
from tests.helpers.targets import config_for


def _entry(name: str, model: str) -> dict[str, object]:
    # Port 9 (discard): nothing answers, so any tokenize call would fail the count.
    return {"name": name, "url": "http://127.0.0.1:9/v1", "model": model, "tokenizer": "server"}


def test_an_endpoint_added_by_a_reload_counts_nothing_its_model_has_counted(
    tmp_path: Path,
) -> None:
    """The second batch's counter answers from the first batch's counts, without a call."""
    engine = create_engine_for(f"sqlite:///{tmp_path / 'kvwatch.db'}")
    upgrade_engine(engine)
    store = Store(engine)
    metrics = ProbeMetrics(CollectorRegistry())
    caches: dict[tuple[str, str], PieceCache] = {}
    client = httpx.AsyncClient()
    try:
        first = config_for([_entry("a", "m")], database="sqlite:///unused.db")
        build_targets(first.resolved_endpoints(), store, lambda _n: client, metrics, caches)
        caches[("openai", "m")].counts[" jade"] = 3  # what a probe of "a" counted
        later = config_for([_entry("b", "m")], database="sqlite:///unused.db")
        [added] = build_targets(
            later.resolved_endpoints(), store, lambda _n: client, metrics, caches
        )
        assert asyncio.run(added.counter.count_pieces([" jade"])) == [3]
        assert list(caches) == [("openai", "m")]
    finally:
        asyncio.run(client.aclose())
        engine.dispose()


def test_the_counts_of_a_model_no_target_serves_are_dropped(tmp_path: Path) -> None:
    """After a reload removing model n's last endpoint, only model m's counts are kept."""
    engine = create_engine_for(f"sqlite:///{tmp_path / 'kvwatch.db'}")
    upgrade_engine(engine)
    store = Store(engine)
    caches: dict[tuple[str, str], PieceCache] = {}
    client = httpx.AsyncClient()
    try:
        config = config_for([_entry("a", "m"), _entry("b", "n")], database="sqlite:///u.db")
        targets = build_targets(
            config.resolved_endpoints(),
            store,
            lambda _n: client,
            ProbeMetrics(CollectorRegistry()),
            caches,
        )
        assert set(caches) == {("openai", "m"), ("openai", "n")}
        drop_unused_piece_caches(caches, [t for t in targets if t.spec.name == "a"])
        assert set(caches) == {("openai", "m")}
    finally:
        asyncio.run(client.aclose())
        engine.dispose()
