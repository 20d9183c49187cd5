"""Reading history back: filters, cursor pagination, the latest result per endpoint."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from sqlalchemy import event, insert, select

from kvwatch.store import NewProbe, ProbeOutcome
from kvwatch.store.models import Endpoint, Probe
from kvwatch.store.queries import HistoryQueries
from tests.helpers.store import Store, latest_per_endpoint

NewProbeFactory = Callable[..., NewProbe]
OutcomeFactory = Callable[..., ProbeOutcome]


def test_probes_are_listed_newest_first_and_filtered(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory, t0: datetime
) -> None:
    """list_probes filters by endpoint, kind, verdict, state and a started_at window."""
    ids: dict[str, int] = {}
    plan = [
        ("a-under-pass", "a", "under", "pass", 0),
        ("a-over-accepted", "a", "over", "over_accepted", 1),
        ("b-under-missing", "b", "under", "marker_missing", 2),
        ("b-under-running", "b", "under", None, 3),
    ]
    for key, endpoint, kind, verdict, minute in plan:
        started = t0 + timedelta(minutes=minute)
        ids[key] = store.begin_probe(new_probe(endpoint=endpoint, kind=kind, started_at=started))
        if verdict is not None:
            store.finish_probe(ids[key], make_outcome(verdict))

    def listed(**filters: object) -> list[int]:
        return [row.id for row in store.list_probes(**filters)]  # type: ignore[arg-type]

    assert listed() == [ids[k] for k in reversed(list(ids))]
    assert listed(endpoint="a") == [ids["a-over-accepted"], ids["a-under-pass"]]
    assert listed(kind="under", endpoint="b") == [ids["b-under-running"], ids["b-under-missing"]]
    assert listed(verdict="marker_missing") == [ids["b-under-missing"]]
    assert listed(state="running") == [ids["b-under-running"]]
    window = {"since": t0 + timedelta(minutes=1), "until": t0 + timedelta(minutes=3)}
    assert listed(**window) == [ids["b-under-missing"], ids["a-over-accepted"]]
    assert listed(endpoint="nobody") == []


def test_cursor_pagination_walks_every_probe_once(store: Store, new_probe: NewProbeFactory) -> None:
    """Pages of `limit` rows, continued with before_id, cover all rows without overlap."""
    created = [store.begin_probe(new_probe()) for _ in range(7)]
    seen: list[int] = []
    before: int | None = None
    pages = 0
    while True:
        page = store.list_probes(limit=3, before_id=before)
        if not page:
            break
        pages += 1
        seen.extend(row.id for row in page)
        before = page[-1].id
    assert seen == sorted(created, reverse=True)
    assert pages == 3


def test_a_limit_below_one_is_refused(store: Store) -> None:
    """A zero or negative page size is a caller bug, not an empty page."""
    with pytest.raises(ValueError, match="limit must be at least 1"):
        store.list_probes(limit=0)


def test_latest_per_endpoint_gives_the_newest_finished_probe_per_kind(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory
) -> None:
    """Running and interrupted probes do not replace the latest finished result."""
    old = store.begin_probe(new_probe(endpoint="a", kind="under"))
    store.finish_probe(old, make_outcome("marker_missing"))
    new = store.begin_probe(new_probe(endpoint="a", kind="under"))
    store.finish_probe(new, make_outcome("pass"))
    over = store.begin_probe(new_probe(endpoint="a", kind="over"))
    store.finish_probe(over, make_outcome("pass"))
    b_done = store.begin_probe(new_probe(endpoint="b", kind="under"))
    store.finish_probe(b_done, make_outcome("truncated"))
    store.begin_probe(new_probe(endpoint="a", kind="under"))  # still running
    interrupted = store.begin_probe(new_probe(endpoint="b", kind="under"))
    store.interrupt_running(probe_ids=[interrupted], reason="shutdown")
    store.begin_probe(new_probe(endpoint="c", kind="baseline"))  # never finished

    latest = latest_per_endpoint(store)
    assert {key: row.id for key, row in latest.items()} == {
        ("a", "under"): new,
        ("a", "over"): over,
        ("b", "under"): b_done,
    }
    assert latest[("b", "under")].verdict == "truncated"


def test_upserting_an_endpoint_keeps_its_id_and_refreshes_its_fields(
    store: Store, t0: datetime
) -> None:
    """The same name maps to the same id across restarts; changed config is written."""
    later = t0 + timedelta(days=1)
    first = Store(store.engine, now=lambda: t0).upsert_endpoint(
        "glm", "http://a/v1", "openai", "m1", None, None, {}
    )
    second = Store(store.engine, now=lambda: later).upsert_endpoint(
        "glm", "http://b/v1", "vllm", "m2", 4096, 8192, {"t": "x"}
    )
    other = store.upsert_endpoint("other", "http://c/v1", "openai", "m1", None, None, {})
    assert first == second
    assert other != first
    with store.engine.connect() as connection:
        row = connection.execute(select(Endpoint).where(Endpoint.id == first)).one()
    assert (row.url, row.flavour, row.model) == ("http://b/v1", "vllm", "m2")
    assert (row.context_window, row.kv_pool_tokens, row.labels) == (4096, 8192, {"t": "x"})
    assert (row.created_at, row.updated_at) == (t0, later)


def test_an_endpoints_first_probe_time_is_its_oldest_start(
    store: Store, new_probe: NewProbeFactory, t0: datetime
) -> None:
    """first_started_at: the earliest started_at of that endpoint's probes, None before any."""
    queries = HistoryQueries(store)
    assert queries.first_started_at("glm-prod") is None
    for minutes in (5, -3, 9):
        store.begin_probe(new_probe(started_at=t0 + timedelta(minutes=minutes)))
    store.begin_probe(new_probe(endpoint="other", started_at=t0 - timedelta(days=1)))
    assert queries.first_started_at("glm-prod") == t0 - timedelta(minutes=3)


def test_the_overview_gives_each_endpoint_its_newest_probes_and_latest_finished_per_kind(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory, t0: datetime
) -> None:
    """The strip is the newest probes of any state, newest first; each kind's badge is its
    newest finished probe, found even when it is older than the strip."""
    ids: dict[str, int] = {}
    plan = [
        ("a-over-old", "a", "over", "pass", 0),
        ("a-under-1", "a", "under", "marker_missing", 1),
        ("a-under-2", "a", "under", "pass", 2),
        ("a-under-3", "a", "under", "pass", 3),
        ("a-under-running", "a", "under", None, 4),
        ("b-under", "b", "under", "pass", 5),
    ]
    for key, endpoint, kind, verdict, minute in plan:
        started = t0 + timedelta(minutes=minute)
        ids[key] = store.begin_probe(new_probe(endpoint=endpoint, kind=kind, started_at=started))
        if verdict is not None:
            store.finish_probe(ids[key], make_outcome(verdict))
    new_probe(endpoint="c")  # registered, never probed

    overview = {o.endpoint.name: o for o in HistoryQueries(store).overview(recent=3)}

    assert list(overview) == ["a", "b", "c"]
    a = overview["a"]
    assert [p.id for p in a.recent] == [ids["a-under-running"], ids["a-under-3"], ids["a-under-2"]]
    assert {kind: p.id for kind, p in a.latest.items()} == {
        "under": ids["a-under-3"],
        "over": ids["a-over-old"],
    }
    assert a.latest["over"].verdict == "pass"
    assert [p.id for p in overview["b"].recent] == [ids["b-under"]]
    assert overview["c"].recent == [] and overview["c"].latest == {}


def test_the_overview_of_named_endpoints_leaves_out_the_others_stored(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory, t0: datetime
) -> None:
    """``only``: the endpoints a daemon probes now; one it no longer probes keeps its rows but
    is neither listed nor walked, and a name never stored adds nothing."""
    ids = {}
    for minute, endpoint in enumerate(["kept", "removed", "kept", "removed"]):
        ids[endpoint] = store.begin_probe(
            new_probe(endpoint=endpoint, started_at=t0 + timedelta(minutes=minute))
        )
        store.finish_probe(ids[endpoint], make_outcome("pass"))
    new_probe(endpoint="idle")  # registered, never probed

    queries = HistoryQueries(store)
    shown = queries.overview(recent=5, only={"kept", "idle", "never-stored"})

    assert [o.endpoint.name for o in shown] == ["idle", "kept"]
    assert [p.id for p in shown[1].recent][:1] == [ids["kept"]]
    assert shown[1].latest["under"].id == ids["kept"]
    assert queries.overview(recent=5, only=set()) == []
    assert [o.endpoint.name for o in queries.overview(recent=0)] == ["idle", "kept", "removed"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_on_sqlite_the_overview_does_not_walk_the_history_of_kinds_never_run(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory
) -> None:
    """Eight times the history costs the overview no more SQLite steps: each kind's badge is
    one probe of ix_probes_latest, not a walk back through every probe of the endpoint."""
    first = store.begin_probe(new_probe(endpoint="a", kind="under"))
    store.finish_probe(first, make_outcome("pass"))
    counted = 0

    def step() -> int:
        nonlocal counted
        counted += 1
        return 0  # go on

    def double(times: int) -> None:
        columns = [c for c in Probe.__table__.columns if c.name != "id"]
        with store.engine.begin() as c:
            for _ in range(times):
                c.execute(insert(Probe).from_select([c.name for c in columns], select(*columns)))

    def counting(dbapi: sqlite3.Connection, _record: object, _proxy: object) -> None:
        dbapi.set_progress_handler(step, 100)  # called every 100 virtual-machine steps

    def steps_of_the_overview() -> int:
        nonlocal counted
        counted = 0
        event.listen(store.engine, "checkout", counting)
        try:
            overview = HistoryQueries(store).overview(recent=24)
        finally:
            event.remove(store.engine, "checkout", counting)
            store.engine.dispose()  # no connection keeps the handler
        assert len(overview[0].recent) == 24 and set(overview[0].latest) == {"under"}
        return counted

    double(8)  # 256 probes of one kind
    small = steps_of_the_overview()
    double(3)  # 2,048
    large = steps_of_the_overview()
    assert large < small * 1.5, (small, large)
