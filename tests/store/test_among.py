"""Reads for the endpoints probed now filter in the database, on both backends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from kvwatch.store import NewProbe
from kvwatch.store.among import name_among
from kvwatch.store.models import Endpoint
from kvwatch.store.records import CalibrationRecord, ServedWindowRecord
from tests.helpers.store import Store
from tests.store.test_alert_states import firing

NewProbeFactory = Callable[..., NewProbe]
AT = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
# Names a query built by string concatenation or LIKE would get wrong.
ODD = ["it's", 'say "hi"', "back\\slash", "50%_off", "ünïcödé-端点", "[1,2]"]


def _names_among(store: Store, names: set[str]) -> list[str]:
    with store.engine.connect() as c:
        where = name_among(Endpoint.name, names, c.dialect.name)
        return list(c.execute(select(Endpoint.name).where(where).order_by(Endpoint.name)).scalars())


def test_name_among_selects_exactly_the_named_rows(
    store: Store, new_probe: NewProbeFactory
) -> None:
    """Odd characters match themselves only; names never stored and an empty set add none."""
    for name in [*ODD, "plain", "other"]:
        new_probe(endpoint=name)
    assert _names_among(store, {*ODD, "never-stored"}) == sorted(ODD)
    assert _names_among(store, {"plain"}) == ["plain"]
    assert _names_among(store, set()) == []


def test_name_among_takes_more_names_than_sqlite_takes_parameters(
    store: Store, new_probe: NewProbeFactory
) -> None:
    """40,000 names are one parameter: SQLite's cap of 32,766 parameters would refuse an IN
    list of them."""
    new_probe(endpoint="ep-39999")
    new_probe(endpoint="not-listed")
    names = {f"ep-{i}" for i in range(40_000)}
    assert _names_among(store, names) == ["ep-39999"]


def test_served_windows_and_calibrations_among_names_leave_out_the_others(store: Store) -> None:
    """``among``: the endpoints probed now; a removed endpoint's stored rows are not read."""
    window = ServedWindowRecord(
        endpoint="kept",
        measured_at=AT,
        source="search",
        advertised_tokens=1_048_576,
        served_tokens=681_280,
        unserved_tokens=681_281,
        exact=True,
        probes=2,
        prompt_tokens=1_362_561,
        probe_id=None,
    )
    calibration = CalibrationRecord(
        endpoint="kept",
        token_source="usage",
        size_class=13,
        ratio=0.79,
        error=0.003,
        observations=12,
        updated_at=AT,
    )
    for endpoint in ("kept", "removed"):
        store.record_served_window(replace(window, endpoint=endpoint))
        store.save_calibrations([replace(calibration, endpoint=endpoint)])

    assert list(store.served_windows(among={"kept", "idle"})) == ["kept"]
    assert [c.endpoint for c in store.calibrations(among={"kept", "idle"})] == ["kept"]
    assert store.served_windows(among=set()) == {}
    assert sorted(store.served_windows()) == ["kept", "removed"]
    assert len(store.calibrations()) == 2


def test_the_listed_alert_states_are_the_active_and_the_recently_resolved(
    store: Store, new_probe: NewProbeFactory
) -> None:
    """Firing and pending rows, resolved ones since the cutoff (by end, else last update);
    neither inactive rows nor older resolutions."""
    since = AT - timedelta(hours=1)
    records = [
        firing(None, endpoint="firing"),
        firing(None, endpoint="pending", state="pending", starts_at=None),
        firing(None, endpoint="inactive", state="inactive", starts_at=None),
        firing(None, endpoint="resolved-late", state="resolved", ends_at=since),
        firing(None, endpoint="resolved-early", state="resolved", ends_at=since - timedelta(1)),
        firing(None, endpoint="resolved-no-end", state="resolved", ends_at=None, updated_at=AT),
    ]
    store.save_alert_states(records)
    listed = sorted(a.endpoint for a in store.listed_alert_states(since))
    assert listed == ["firing", "pending", "resolved-late", "resolved-no-end"]
