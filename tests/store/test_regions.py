"""Multi-region mode in the store: every region runs every slot, each keeps its own alerts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, MetaData, insert, inspect, text

from kvwatch.canary.model import ProbeState
from kvwatch.store import AlertStateRecord, NewProbe, ProbeOutcome
from kvwatch.store.engine import create_engine_for
from kvwatch.store.migrate import downgrade_engine, upgrade_engine
from kvwatch.store.queries import HistoryQueries, ProbeFilter
from tests.helpers.store import Store, get_probe
from tests.store.conftest import insert_old_rows

NewProbeFactory = Callable[..., NewProbe]
OutcomeFactory = Callable[..., ProbeOutcome]
T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """A freshly migrated database."""
    engine = create_engine_for(db_url)
    upgrade_engine(engine)
    try:
        yield engine
    finally:
        engine.dispose()


def regional(engine: Engine, region: str | None, clock: Clock | None = None) -> Store:
    return Store(engine, region=region, now=clock or Clock())


def probe_on(endpoint_id: int, **changes: object) -> NewProbe:
    """A minimal under probe of endpoint "ep"; keyword arguments override fields."""
    probe = NewProbe(
        endpoint="ep",
        endpoint_id=endpoint_id,
        kind="under",
        started_at=T0,
        replica="eu-0",
        model="m",
        planned_prompt_tokens=1,
        target_prompt_tokens=1,
        max_tokens=1,
        token_source="server",
        tokenize_calls=1,
        marker="KVW-AAAA-BBBB-CCCC",
        marker_depth=0.0,
        streamed=True,
    )
    return replace(probe, **changes)  # type: ignore[arg-type]


def leak_alert(endpoint: str = "glm-prod", **changes: object) -> AlertStateRecord:
    record = AlertStateRecord(
        alertname="KVWatchCrossRequestLeak",
        endpoint=endpoint,
        probe="under",
        state="firing",
        severity="critical",
        updated_at=T0,
        failures=2,
        passes=0,
        starts_at=T0,
        labels={"alertname": "KVWatchCrossRequestLeak", "endpoint": endpoint},
    )
    return replace(record, **changes)  # type: ignore[arg-type]


def test_two_regions_claim_the_same_slot_and_both_get_it(engine: Engine) -> None:
    """A slot is claimed once per region: eu and us each run it."""
    eu, us = regional(engine, "eu"), regional(engine, "us")
    assert eu.claim_slot("ep", "under", 1000, "eu-0", ttl=60)
    assert us.claim_slot("ep", "under", 1000, "us-0", ttl=60)


def test_two_replicas_of_one_region_share_a_slot_exactly_once(engine: Engine) -> None:
    """Within a region the first claim wins, as in single-region mode, and done is final."""
    eu = regional(engine, "eu")
    assert eu.claim_slot("ep", "under", 1000, "eu-0", ttl=60)
    assert not eu.claim_slot("ep", "under", 1000, "eu-1", ttl=60)
    eu.complete_slot("ep", "under", 1000, None)
    assert not regional(engine, "eu").claim_slot("ep", "under", 1000, "eu-1", ttl=60)
    # The regionless deployment is a region of its own, too.
    assert regional(engine, None).claim_slot("ep", "under", 1000, "solo", ttl=60)


def test_completing_a_slot_completes_it_only_in_its_own_region(engine: Engine) -> None:
    """eu finishing the slot leaves us's claim undone, so us's expiry still retries it."""
    clock = Clock()
    eu, us = regional(engine, "eu", clock), regional(engine, "us", clock)
    assert eu.claim_slot("ep", "under", 1000, "eu-0", ttl=60)
    assert us.claim_slot("ep", "under", 1000, "us-0", ttl=60)
    eu.complete_slot("ep", "under", 1000, None)
    clock.now += timedelta(seconds=61)
    assert eu.expired_slots(0) == []
    assert us.expired_slots(0) == [("ep", "under", 1000)]


def test_expiry_and_the_sweep_only_touch_the_own_region(engine: Engine) -> None:
    """expire_claims and expired_slots see this region's claims, never another region's."""
    clock = Clock()
    eu, us = regional(engine, "eu", clock), regional(engine, "us", clock)
    # One replica id in both regions, so only the region can tell the claims apart.
    assert eu.claim_slot("ep", "under", 1000, "kvwatch-0", ttl=600)
    assert us.claim_slot("ep", "under", 1000, "kvwatch-0", ttl=600)
    clock.now += timedelta(seconds=1)
    assert eu.expire_claims("kvwatch-0") == 1
    clock.now += timedelta(seconds=1)
    assert eu.expired_slots(0) == [("ep", "under", 1000)]
    assert us.expired_slots(0) == []
    assert eu.claim_slot("ep", "under", 1000, "kvwatch-1", ttl=600)  # taken over in eu
    assert not us.claim_slot("ep", "under", 1000, "kvwatch-1", ttl=600)  # still held in us


def test_a_takeover_interrupts_the_dead_replicas_probe_in_its_region_only(
    engine: Engine,
) -> None:
    """The probe of the other region's live claim on the same slot keeps running."""
    clock = Clock()
    eu, us = regional(engine, "eu", clock), regional(engine, "us", clock)
    eid = eu.upsert_endpoint("ep", "http://h/v1", "openai", "m", 4096, None, {})
    probe = probe_on(eid, replica="eu-0", slot=1000)
    assert eu.claim_slot("ep", "under", 1000, "eu-0", ttl=60)
    dead = eu.begin_probe(probe)
    clock.now += timedelta(seconds=50)
    assert us.claim_slot("ep", "under", 1000, "us-0", ttl=60)
    alive = us.begin_probe(replace(probe, replica="us-0", marker="KVW-DDDD-EEEE-FFFF"))
    clock.now += timedelta(seconds=11)
    assert eu.claim_slot("ep", "under", 1000, "eu-1", ttl=60)
    dead_row, alive_row = get_probe(eu, dead), get_probe(us, alive)
    assert dead_row is not None and dead_row.state is ProbeState.INTERRUPTED
    assert alive_row is not None and alive_row.state is ProbeState.RUNNING


def test_each_probe_records_its_region_and_history_filters_by_it(
    engine: Engine, make_outcome: OutcomeFactory
) -> None:
    """begin_probe and record_probe stamp the store's region; no region stays NULL."""
    stores = {region: regional(engine, region) for region in ("eu", "us", None)}
    eid = stores["eu"].upsert_endpoint("ep", "http://h/v1", "openai", "m", 4096, None, {})
    ids = {}
    for n, (region, store) in enumerate(stores.items()):
        probe = probe_on(
            eid,
            started_at=T0 + timedelta(seconds=n),
            replica=f"{region}-0",
            marker=f"KVW-AAAA-BBBB-CCC{n}",
        )
        if region == "us":
            ids[region] = store.record_probe(probe, make_outcome())
        else:
            ids[region] = store.begin_probe(probe)
    for region, probe_id in ids.items():
        row = get_probe(stores[region], probe_id)
        assert row is not None and row.region == region
    history = HistoryQueries(stores[None])
    assert [p.id for p in history.probes(ProbeFilter(region="eu")).probes] == [ids["eu"]]
    assert len(history.probes(ProbeFilter()).probes) == 3


def test_alert_states_are_kept_per_region(engine: Engine) -> None:
    """One alert key firing in eu and resolved in us: each region loads and updates its own."""
    eu, us, solo = regional(engine, "eu"), regional(engine, "us"), regional(engine, None)
    eu.save_alert_states([leak_alert()])
    us.save_alert_states([leak_alert(state="resolved", ends_at=T0)])
    assert eu.load_alert_states() == [leak_alert()]
    assert us.load_alert_states() == [leak_alert(state="resolved", ends_at=T0)]
    assert solo.load_alert_states() == []
    us.save_alert_states([leak_alert(state="pending", failures=1)])
    assert eu.load_alert_states() == [leak_alert()]
    assert us.load_alert_states() == [leak_alert(state="pending", failures=1)]


def test_upgrading_from_0004_keeps_every_row_and_keys_them_on_region(db_url: str) -> None:
    """Probes, slot claims and alert states stored at 0004 survive 0005 as regionless rows."""
    engine = create_engine_for(db_url)
    try:
        upgrade_engine(engine, "0004")
        tables = MetaData()
        tables.reflect(engine)
        with engine.begin() as c:
            insert_old_rows(c, tables, {"id": 7, "slot": 1000}, at=T0)
            c.execute(
                insert(tables.tables["probe_slots"]).values(
                    endpoint="ep",
                    kind="under",
                    slot=1000,
                    replica="kvwatch-0",
                    claimed_at=T0,
                    expires_at=T0 + timedelta(minutes=1),
                    attempts=1,
                    done=True,
                    probe_id=7,
                )
            )
            c.execute(
                insert(tables.tables["alert_states"]).values(
                    alertname="KVWatchCrossRequestLeak",
                    endpoint="ep",
                    probe="under",
                    state="firing",
                    severity="critical",
                    failures=2,
                    passes=0,
                    starts_at=T0,
                    last_probe_id=7,
                    labels={"alertname": "KVWatchCrossRequestLeak"},
                    annotations={},
                    updated_at=T0,
                )
            )
        upgrade_engine(engine)

        keys = inspect(engine)
        assert keys.get_pk_constraint("probe_slots")["constrained_columns"] == [
            "endpoint",
            "kind",
            "slot",
            "region",
        ]
        assert [u["column_names"] for u in keys.get_unique_constraints("alert_states")] == [
            ["alertname", "endpoint", "probe", "region"]
        ]
        solo = Store(engine, now=Clock())
        row = get_probe(solo, 7)
        assert row is not None and (row.verdict, row.slot, row.region) == ("pass", 1000, None)
        [state] = solo.load_alert_states()
        assert (state.alertname, state.state, state.last_probe_id) == (
            "KVWatchCrossRequestLeak",
            "firing",
            7,
        )
        # The old claim still decides the old slot for the regionless deployment; a region
        # runs it anew.
        assert not solo.claim_slot("ep", "under", 1000, "kvwatch-1", ttl=60)
        assert Store(engine, region="eu", now=Clock()).claim_slot(
            "ep", "under", 1000, "eu-0", ttl=60
        )
    finally:
        engine.dispose()


def test_downgrading_to_0004_keeps_the_regionless_rows(engine: Engine) -> None:
    """Back at 0004 the single-region claims and alert states stay; named regions' go."""
    solo, eu = regional(engine, None), regional(engine, "eu")
    assert solo.claim_slot("ep", "under", 1000, "solo", ttl=60)
    assert eu.claim_slot("ep", "under", 1000, "eu-0", ttl=60)
    solo.save_alert_states([leak_alert()])
    eu.save_alert_states([leak_alert()])
    downgrade_engine(engine, "0004")
    keys = inspect(engine)
    assert "region" not in {c["name"] for c in keys.get_columns("probe_slots")}
    with engine.connect() as c:
        assert c.execute(text("SELECT replica FROM probe_slots")).scalars().all() == ["solo"]
        assert c.execute(text("SELECT count(*) FROM alert_states")).scalar() == 1
    upgrade_engine(engine)
    assert solo.load_alert_states() == [leak_alert()]
    assert eu.load_alert_states() == []
