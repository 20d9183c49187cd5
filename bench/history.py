"""History benchmark: page and API latency over a large probe history.

Generates a realistic history (12 endpoints x 3 probe kinds, one probe every 5 minutes per
series, ending now, ~2.5 % failures of every kind, a rare cross-request leak) straight into a
migrated database: 1,000,000 rows in SQLite and 10,000,000 in PostgreSQL by default, by bulk
insert (executemany / COPY). Then it requests each review page and API call in-process
(httpx over ASGI, the same app the daemon serves) and prints p50/p95 latency; the target is
p95 < 100 ms. Generation time is printed too.

    python -m bench.history [--sqlite-rows N] [--postgres-rows N] [--only sqlite|postgres]

The markers table is not filled: no page or API call reads it (only the probe runner does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, create_engine, text

from bench.machine import describe
from kvwatch.store.engine import create_engine_for
from kvwatch.store.migrate import upgrade_engine
from kvwatch.store.repository import Store
from kvwatch.web.app import WebContext, create_app

DEFAULT_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
ENDPOINTS = [f"ep-{i:02d}" for i in range(12)]
KINDS = ("under", "over", "baseline")
STEP = timedelta(minutes=5)
REQUESTS = 60  # timed requests per call, after WARMUP untimed ones
WARMUP = 5
COLUMNS = (
    "endpoint, endpoint_id, kind, state, verdict, reason, started_at, finished_at, replica, "
    "model, planned_prompt_tokens, target_prompt_tokens, reported_prompt_tokens, "
    "completion_tokens, max_tokens, token_source, tokenize_calls, marker, marker_depth, "
    "marker_found, foreign_markers, http_status, finish_reason, streamed, answer_excerpt, "
    "error_body, error_detail, ttfb_seconds, duration_seconds, confirms_probe_id"
)
FAILURES = {
    "under": ("marker_missing", "truncated", "under_rejected", "stream_error", "error"),
    "over": ("over_accepted", "wrong_rejection", "error", "throttled"),
    "baseline": ("canary_ineffective", "error", "throttled"),
}


def _rows(total: int, end: datetime, ids: dict[str, int]) -> Iterator[tuple[Any, ...]]:
    """``total`` probe rows, oldest first, as tuples in COLUMNS order (timestamps aware)."""
    rng = random.Random(42)
    series = [(ep, kind) for ep in ENDPOINTS for kind in KINDS]
    per_series = -(-total // len(series))
    start = end - STEP * per_series
    emitted = 0
    for step in range(per_series):
        at = start + STEP * step
        for n, (ep, kind) in enumerate(series):
            if emitted == total:
                return
            emitted += 1
            started = at + timedelta(seconds=n)
            roll = rng.random()
            verdict = "pass"
            if roll < 0.025:
                verdict = rng.choice(FAILURES[kind])
            elif roll < 0.0252 and kind == "under":
                verdict = "foreign_marker"
            planned = 8176 if kind == "under" else 8177 if kind == "over" else 1536
            ok = kind != "over" and verdict in ("pass", "foreign_marker", "marker_missing")
            reported = planned if ok else (planned // 2 if verdict == "truncated" else None)
            duration = round(rng.lognormvariate(0.5, 0.4), 3)
            foreign = (
                json.dumps(
                    [
                        {
                            "marker": "KVW-AAAA-BBBB-CCCC",
                            "probe_id": 1,
                            "endpoint": ep,
                            "issued_at": start.isoformat(),
                        }
                    ]
                )
                if verdict == "foreign_marker"
                else "[]"
            )
            marker = f"KVW-{rng.getrandbits(16):04X}-{rng.getrandbits(16):04X}-{emitted:04X}"
            yield (
                ep,
                ids[ep],
                kind,
                "done",
                verdict,
                f"benchmark row ({verdict})",
                started,
                started + timedelta(seconds=duration),
                "bench-0",
                "sim-1",
                planned,
                planned,
                reported,
                9 if ok else None,
                16,
                "server",
                1,
                marker,
                0.0,
                ok and verdict == "pass",
                foreign,
                200 if ok else 400,
                "stop" if ok else None,
                kind == "under",
                f"The code is {marker}." if ok else None,
                None if ok else '{"error": "benchmark"}',
                None,
                round(duration * 0.9, 3),
                duration,
                None,
            )


def _register(store: Store) -> dict[str, int]:
    return {
        ep: store.upsert_endpoint(ep, f"http://10.0.0.{i}:8000/v1", "vllm", "sim-1", 8192, 8192, {})
        for i, ep in enumerate(ENDPOINTS)
    }


def _fill_sqlite(engine: Engine, total: int, ids: dict[str, int], end: datetime) -> None:
    # SQLAlchemy's SQLite format for naive UTC timestamps; comparisons are string comparisons.
    def ts(value: datetime) -> str:
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")

    placeholders = ", ".join("?" * len(COLUMNS.split(",")))
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        batch: list[tuple[Any, ...]] = []
        for row in _rows(total, end, ids):
            batch.append((*row[:6], ts(row[6]), ts(row[7]), *row[8:]))
            if len(batch) == 50_000:
                cursor.executemany(f"INSERT INTO probes ({COLUMNS}) VALUES ({placeholders})", batch)
                batch.clear()
        if batch:
            cursor.executemany(f"INSERT INTO probes ({COLUMNS}) VALUES ({placeholders})", batch)
        raw.commit()
        cursor.execute("ANALYZE")
        raw.commit()
    finally:
        raw.close()


def _fill_postgres(engine: Engine, total: int, ids: dict[str, int], end: datetime) -> None:
    raw = engine.raw_connection()
    try:
        cursor: Any = raw.cursor()
        with cursor.copy(f"COPY probes ({COLUMNS}) FROM STDIN") as copy:
            for row in _rows(total, end, ids):
                copy.write_row(row)
        raw.commit()
        raw.commit()
        # What autovacuum does in production: statistics, and the visibility map that lets
        # the covering index answer a chart without touching the table.
        driver: Any = raw.driver_connection
        driver.autocommit = True
        driver.execute("VACUUM ANALYZE probes")
    finally:
        raw.close()


def _calls(ids: list[int], now: datetime) -> list[tuple[str, str]]:
    deep = ids[len(ids) // 2]
    old = (now - timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    older = (now - timedelta(days=31)).strftime("%Y-%m-%dT%H:%M:%SZ")
    ep = ENDPOINTS[3]
    return [
        ("page: overview", "/"),
        ("page: endpoint 24h", f"/endpoints/{ep}?range=24h"),
        ("page: endpoint 7d", f"/endpoints/{ep}?range=7d"),
        ("page: endpoint 30d", f"/endpoints/{ep}?range=30d"),
        ("page: probe", f"/probes/{deep}"),
        ("page: probes, endpoint+verdict", f"/probes?endpoint={ep}&verdict=truncated"),
        ("page: alerts", "/alerts"),
        ("api: endpoints", "/api/v1/endpoints"),
        ("api: probes (first page)", "/api/v1/probes"),
        ("api: probes ?endpoint", f"/api/v1/probes?endpoint={ep}"),
        ("api: probes ?verdict (rare)", "/api/v1/probes?verdict=foreign_marker"),
        ("api: probes ?kind&verdict", "/api/v1/probes?kind=over&verdict=over_accepted"),
        ("api: probes deep cursor", f"/api/v1/probes?endpoint={ep}&before_id={deep}"),
        ("api: probes 30 days ago", f"/api/v1/probes?since={older}&until={old}"),
        ("api: probe", f"/api/v1/probes/{deep}"),
        ("api: summary 24h", f"/api/v1/endpoints/{ep}/summary?window=24h"),
        ("api: summary 7d", f"/api/v1/endpoints/{ep}/summary?window=7d"),
        ("api: alerts", "/api/v1/alerts"),
    ]


async def _measure(store: Store, now: Callable[[], datetime]) -> list[tuple[str, float, float]]:
    app = create_app(WebContext(store=store, registry=CollectorRegistry(), alive=lambda: True))
    with store.engine.connect() as c:
        ids = [int(i) for i in c.execute(text("SELECT id FROM probes ORDER BY id")).scalars()]
    results = []
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        for name, path in _calls(ids, now()):
            timings = []
            for i in range(WARMUP + REQUESTS):
                t0 = time.perf_counter()
                response = await client.get(path)
                elapsed = time.perf_counter() - t0
                if response.status_code != 200:
                    raise SystemExit(f"{path}: HTTP {response.status_code}: {response.text[:200]}")
                if i >= WARMUP:
                    timings.append(elapsed * 1000)
            timings.sort()
            p95 = timings[max(0, round(0.95 * len(timings)) - 1)]
            results.append((name, statistics.median(timings), p95))
    return results


def _report(
    label: str, rows: int, generated: float, results: list[tuple[str, float, float]]
) -> None:
    print(f"\n## {label}: {rows:,} probe rows (generated in {generated:.1f} s)")
    print(f"{'call':<34} {'p50 ms':>8} {'p95 ms':>8}")
    for name, p50, p95 in results:
        flag = "" if p95 < 100 else "  <-- over target"
        print(f"{name:<34} {p50:>8.1f} {p95:>8.1f}{flag}")
    worst = max(p95 for _, _, p95 in results)
    print(f"worst p95: {worst:.1f} ms (target < 100 ms)")


def _run(label: str, url: str, rows: int, fill: Callable[..., None]) -> None:
    engine = create_engine_for(url)
    try:
        upgrade_engine(engine)
        store = Store(engine)
        end = datetime.now(UTC)
        t0 = time.perf_counter()
        fill(engine, rows, _register(store), end)
        generated = time.perf_counter() - t0
        results = asyncio.run(_measure(store, lambda: datetime.now(UTC)))
        _report(label, rows, generated, results)
    finally:
        engine.dispose()


def _postgres_database(server: str) -> tuple[str, Callable[[], None]]:
    """A fresh database on ``server`` for the run, and how to drop it afterwards."""
    from sqlalchemy.engine import make_url

    base = make_url(server)
    name = f"kvwatch_bench_{os.getpid()}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return base.set(database=name).render_as_string(hide_password=False), drop


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.history", description=__doc__)
    parser.add_argument("--sqlite-rows", type=int, default=1_000_000)
    parser.add_argument("--postgres-rows", type=int, default=10_000_000)
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES, help="server to create in")
    parser.add_argument("--only", choices=("sqlite", "postgres"), default=None)
    args = parser.parse_args([] if argv is None else argv)
    print(f"# history benchmark — {describe()}")
    print(f"# {REQUESTS} timed requests per call (after {WARMUP} warm-up), in-process ASGI")
    if args.only in (None, "sqlite"):
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{Path(tmp) / 'history.db'}"
            _run("SQLite", url, args.sqlite_rows, _fill_sqlite)
    if args.only in (None, "postgres"):
        url, drop = _postgres_database(args.postgres_url)
        try:
            _run("PostgreSQL", url, args.postgres_rows, _fill_postgres)
        finally:
            drop()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
