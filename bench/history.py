"""History benchmark: page and API latency over a large probe history.

Generates a realistic history (12 endpoints x 3 probe kinds, one probe every 5 minutes per
series, ending now, ~2.5 % failures of every kind, a rare cross-request leak) straight into a
migrated database: 1,000,000 rows in SQLite and 10,000,000 in PostgreSQL by default, by bulk
insert (executemany / COPY). Then it requests each review page and API call in-process
(httpx over ASGI, the same app the daemon serves) and prints p50/p95 latency; the target is
p95 < 100 ms. Generation time is printed too.

    python -m bench.history [--sqlite-rows N] [--postgres-rows N] [--only sqlite|postgres]
                            [--postgres-database URL]

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
from kvwatch.store.models import Probe
from kvwatch.store.repository import Store
from kvwatch.store.rollups import rebuild
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
PG_CHUNK = 1_000_000  # rows per INSERT ... SELECT on PostgreSQL
PG_DEADLINE = 12 * 60  # seconds of PostgreSQL generation before stopping short

# One chunk of _rows' history (same series, spacing and verdict odds), made by the
# server; ``g`` numbers the rows in _rows' order, so chunks continue one another.
PG_FILL = """
INSERT INTO probes ({columns})
SELECT endpoint, endpoint_id, kind, 'done', verdict, 'benchmark row (' || verdict || ')',
       started, started + make_interval(secs => duration), 'bench-0', 'sim-1',
       planned, planned,
       CASE WHEN ok THEN planned WHEN verdict = 'truncated' THEN planned / 2 END,
       CASE WHEN ok THEN 9 END, 16, 'server', 1, marker, 0.0, ok AND verdict = 'pass',
       CASE WHEN verdict = 'foreign_marker' THEN jsonb_build_array(jsonb_build_object(
           'marker', 'KVW-AAAA-BBBB-CCCC', 'probe_id', 1, 'endpoint', endpoint,
           'issued_at', to_char(%(start)s::timestamptz AT TIME ZONE 'UTC',
                                'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')))
            ELSE '[]'::jsonb END,
       CASE WHEN ok THEN 200 ELSE 400 END, CASE WHEN ok THEN 'stop' END, kind = 'under',
       CASE WHEN ok THEN 'The code is ' || marker || '.' END,
       CASE WHEN ok THEN NULL ELSE '{{"error": "benchmark"}}' END, NULL,
       round((duration * 0.9)::numeric, 3)::float8, duration, NULL
FROM (
    SELECT *, kind <> 'over' AND verdict IN ('pass', 'foreign_marker', 'marker_missing') AS ok
    FROM (
        SELECT e.name AS endpoint, e.id AS endpoint_id, s.kind, s.started, s.marker,
               CASE s.kind WHEN 'under' THEN 8176 WHEN 'over' THEN 8177 ELSE 1536 END
                   AS planned,
               CASE WHEN s.roll < 0.025 THEN (CASE s.kind
                        WHEN 'under' THEN ARRAY['marker_missing', 'truncated',
                                                'under_rejected', 'stream_error', 'error']
                        WHEN 'over' THEN ARRAY['over_accepted', 'wrong_rejection', 'error',
                                               'throttled']
                        ELSE ARRAY['canary_ineffective', 'error', 'throttled']
                    END)[1 + floor(s.pick * CASE s.kind WHEN 'under' THEN 5
                                                        WHEN 'over' THEN 4 ELSE 3 END)::int]
                    WHEN s.roll < 0.0252 AND s.kind = 'under' THEN 'foreign_marker'
                    ELSE 'pass' END AS verdict,
               -- lognormal(0.5, 0.4) by Box-Muller, as random.lognormvariate
               round(exp(0.5 + 0.4 * sqrt(-2 * ln(1 - s.u1)) * cos(2 * pi() * s.u2))::numeric,
                     3)::float8 AS duration
        FROM (
            SELECT g, (ARRAY['under', 'over', 'baseline'])[g %% 3 + 1] AS kind,
                   'ep-' || lpad(((g %% 36) / 3)::text, 2, '0') AS ep,
                   %(start)s::timestamptz + (g / 36) * interval '5 minutes'
                       + (g %% 36) * interval '1 second' AS started,
                   random() AS roll, random() AS pick, random() AS u1, random() AS u2,
                   'KVW-' || upper(lpad(to_hex((random() * 65535)::int), 4, '0')) || '-'
                       || upper(lpad(to_hex((random() * 65535)::int), 4, '0')) || '-'
                       || upper(lpad(to_hex(g + 1), 4, '0')) AS marker
            FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
        ) AS s
        JOIN endpoints AS e ON e.name = s.ep
    ) AS v
) AS w
"""


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
    """The same history as ``_rows``, generated by the server in chunks (``PG_FILL``).

    Python cannot produce 10 M rows quickly enough on a small machine; the server can. The
    secondary indexes are dropped first and rebuilt once at the end (a sorted build is far
    cheaper than 10 M index insertions). Each chunk commits, so a fill cut short (the
    server restarted, ``PG_DEADLINE`` passed) resumes where it stopped on the next run;
    the count actually stored is what is reported.
    """
    del ids  # the generating SQL joins endpoints by name
    indexes = sorted(Probe.metadata.tables["probes"].indexes, key=lambda i: str(i.name))
    raw = engine.raw_connection()
    try:
        driver: Any = raw.driver_connection
        driver.autocommit = True
        driver.execute("SET synchronous_commit = off")
        driver.execute("SET maintenance_work_mem = '512MB'")
        done, first = driver.execute("SELECT count(*), min(started_at) FROM probes").fetchone()
        per_series = -(-total // (len(ENDPOINTS) * len(KINDS)))
        start = first if done else end - STEP * per_series
        for index in indexes:
            driver.execute(f'DROP INDEX IF EXISTS "{index.name}"')
        deadline = time.monotonic() + PG_DEADLINE
        while done < total and time.monotonic() < deadline:
            last = min(total, done + PG_CHUNK) - 1
            driver.execute(
                PG_FILL.format(columns=COLUMNS), {"start": start, "first": done, "last": last}
            )
            done = last + 1
            print(f"#   {done:,} rows", flush=True)
    finally:
        raw.close()
    with engine.begin() as c:
        c.execute(text("SET maintenance_work_mem = '512MB'"))
        for index in indexes:
            index.create(c, checkfirst=True)
    raw = engine.raw_connection()
    try:
        driver = raw.driver_connection
        driver.autocommit = True
        # What autovacuum does in production: statistics, and the visibility map that lets
        # a covering index answer without touching the table.
        driver.execute("VACUUM ANALYZE probes")
    finally:
        raw.close()


def _calls(deep: int, now: datetime) -> list[tuple[str, str]]:
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
    context = WebContext(store=store, registry=CollectorRegistry(), alive=lambda: True, now=now)
    app = create_app(context)
    with store.engine.connect() as c:
        low, high = c.execute(text("SELECT min(id), max(id) FROM probes")).one()
        # A probe from the middle of the history (ids are dense after a bulk load).
        deep = int(
            c.execute(
                text("SELECT min(id) FROM probes WHERE id >= :mid"), {"mid": (low + high) // 2}
            ).scalar_one()
        )
    results = []
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        for name, path in _calls(deep, now()):
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
        with engine.connect() as c:
            existing = int(c.execute(text("SELECT count(*) FROM probes")).scalar_one())
            rolled_up = int(c.execute(text("SELECT count(*) FROM probe_rollups")).scalar_one())
        generated = 0.0
        if existing < rows:
            if existing:
                print(f"# {label}: resuming a fill that stopped at {existing:,} rows")
            t0 = time.perf_counter()
            fill(engine, rows, _register(store), datetime.now(UTC))
            generated = time.perf_counter() - t0
        else:
            print(f"# {label}: reusing the {existing:,} probe rows already in {url}")
        if existing < rows or not rolled_up:
            # Bulk loads bypass the store, so the hourly rollups are rebuilt from the rows
            # (the store keeps them current when probes finish or are pruned).
            t0 = time.perf_counter()
            with engine.begin() as c:
                rollups = rebuild(c)
                c.execute(text("ANALYZE probe_rollups"))
            print(f"# {label}: {rollups:,} rollup rows rebuilt in {time.perf_counter() - t0:.1f} s")
        with engine.connect() as c:
            count = int(c.execute(text("SELECT count(*) FROM probes")).scalar_one())
            newest = c.execute(text("SELECT max(started_at) FROM probes")).scalar_one()
        # The calls look back from the newest probe, so a reused database measures the same.
        end_at = newest if isinstance(newest, datetime) else _parse_sqlite(str(newest))
        results = asyncio.run(_measure(store, lambda: end_at))
        _report(label, count, generated, results)
    finally:
        engine.dispose()


def _parse_sqlite(value: str) -> datetime:
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


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
    parser.add_argument(
        "--postgres-database",
        default=None,
        help="use (and keep) this database instead of a fresh one; filled only if empty",
    )
    parser.add_argument("--only", choices=("sqlite", "postgres"), default=None)
    args = parser.parse_args([] if argv is None else argv)
    print(f"# history benchmark — {describe()}")
    print(f"# {REQUESTS} timed requests per call (after {WARMUP} warm-up), in-process ASGI")
    if args.only in (None, "sqlite"):
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{Path(tmp) / 'history.db'}"
            _run("SQLite", url, args.sqlite_rows, _fill_sqlite)
    if args.only in (None, "postgres"):
        if args.postgres_database is not None:
            _run("PostgreSQL", args.postgres_database, args.postgres_rows, _fill_postgres)
            return
        url, drop = _postgres_database(args.postgres_url)
        try:
            _run("PostgreSQL", url, args.postgres_rows, _fill_postgres)
        finally:
            drop()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
