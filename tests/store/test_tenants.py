"""The store keeps each probe's and each issued marker's tenant (a name, never a key)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from sqlalchemy import inspect, text

from kvwatch.canary.model import ForeignMarker
from kvwatch.store import ProbeOutcome
from kvwatch.store.migrate import downgrade_engine, upgrade_engine
from kvwatch.store.queries import HistoryQueries, ProbeFilter
from kvwatch.store.records import foreign_marker_from_json, foreign_marker_to_json
from tests.helpers.store import Store, get_probe
from tests.store.test_regions import T0, probe_on

ACME_MARKER = "KVW-AAAA-BBBB-CCCC"
GLOBEX_MARKER = "KVW-DDDD-EEEE-FFFF"


def _endpoint(store: Store) -> int:
    return store.upsert_endpoint("ep", "http://x/v1", "vllm", "m", 4096, None, {})


def test_an_issued_marker_is_looked_up_with_its_tenant(store: Store) -> None:
    """The origin lookup names the tenant the leaked marker was issued under."""
    endpoint_id = _endpoint(store)
    acme = store.begin_probe(probe_on(endpoint_id, marker=ACME_MARKER, tenant="acme"))
    store.begin_probe(probe_on(endpoint_id, marker=GLOBEX_MARKER, tenant=None))
    found = store.lookup_markers(["AAAABBBBCCCC", "DDDDEEEEFFFF"])
    assert found["AAAABBBBCCCC"] == ForeignMarker(ACME_MARKER, acme, "ep", T0, tenant="acme")
    assert found["DDDDEEEEFFFF"].tenant is None


def test_a_probe_keeps_its_tenant_and_its_cross_tenant_evidence(store: Store) -> None:
    """The probe row names its tenant, and a foreign marker keeps the tenant it came from."""
    endpoint_id = _endpoint(store)
    source = store.begin_probe(probe_on(endpoint_id, marker=ACME_MARKER, tenant="acme"))
    leak = ForeignMarker(ACME_MARKER, source, "ep", T0, tenant="acme")
    victim = store.begin_probe(
        probe_on(endpoint_id, marker=GLOBEX_MARKER, tenant="globex", started_at=T0)
    )
    store.finish_probe(
        victim,
        ProbeOutcome(
            verdict="cross_tenant_leak",
            reason="leak",
            finished_at=T0 + timedelta(seconds=1),
            foreign_markers=[leak],
        ),
    )
    row = get_probe(store, victim)
    assert row is not None
    assert row.tenant == "globex"
    assert row.foreign_markers == (leak,)
    page = HistoryQueries(store).probes(ProbeFilter(tenant="globex"))
    assert [p.id for p in page.probes] == [victim]


def test_foreign_marker_json_without_a_tenant_reads_as_the_endpoint_key() -> None:
    """Evidence stored before tenants existed has no tenant key: it reads as None."""
    marker = ForeignMarker(ACME_MARKER, 7, "ep", T0)
    data = foreign_marker_to_json(marker)
    assert "tenant" not in data
    assert foreign_marker_from_json(data) == marker
    named = replace(marker, tenant="acme")
    assert foreign_marker_from_json(foreign_marker_to_json(named)) == named


def test_downgrading_0006_drops_the_tenant_columns_and_keeps_the_probes(store: Store) -> None:
    """Back at 0005 every probe and marker stays, without its tenant."""
    endpoint_id = _endpoint(store)
    store.begin_probe(probe_on(endpoint_id, marker=ACME_MARKER, tenant="acme"))
    engine = store._engine
    downgrade_engine(engine, "0005")
    columns = inspect(engine)
    assert "tenant" not in {c["name"] for c in columns.get_columns("probes")}
    assert "tenant" not in {c["name"] for c in columns.get_columns("markers")}
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM markers")).scalar() == 1
    upgrade_engine(engine)
    assert store.lookup_markers(["AAAABBBBCCCC"])["AAAABBBBCCCC"].tenant is None
