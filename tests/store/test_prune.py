"""Retention: old results go, recent ones, kept verdicts and running probes stay."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from kvwatch.canary.markers import canonical
from kvwatch.store import AlertStateRecord, NewProbe, ProbeOutcome
from tests.helpers.store import Store, get_probe

NewProbeFactory = Callable[..., NewProbe]
OutcomeFactory = Callable[..., ProbeOutcome]


def test_prune_deletes_old_results_and_their_markers_only(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory, t0: datetime
) -> None:
    """Old done and interrupted probes go in batches; kept verdicts, recent and running stay."""
    old, recent = t0 - timedelta(days=40), t0
    probes: dict[str, NewProbe] = {}
    ids: dict[str, int] = {}

    def add(key: str, started: datetime, verdict: str | None) -> None:
        probes[key] = new_probe(started_at=started)
        ids[key] = store.begin_probe(probes[key])
        if verdict is not None:
            store.finish_probe(ids[key], make_outcome(verdict))

    for n in range(5):
        add(f"old-pass-{n}", old, "pass")
    add("old-leak", old, "foreign_marker")
    add("old-interrupted", old, None)
    store.interrupt_running(probe_ids=[ids["old-interrupted"]], reason="crash")
    add("old-running", old, None)
    add("recent-pass", recent, "pass")
    confirmation = new_probe(started_at=recent, confirms_probe_id=ids["old-pass-0"])
    ids["confirmation"] = store.begin_probe(confirmation)
    store.save_alert_states(
        [
            AlertStateRecord(
                alertname="KVWatchContextNotHonored",
                endpoint="glm-prod",
                probe="under",
                state="resolved",
                severity="critical",
                updated_at=recent,
                last_probe_id=ids["old-pass-1"],
            )
        ]
    )

    deleted = store.prune(t0 - timedelta(days=30), keep_verdicts=["foreign_marker"], batch=2)

    assert deleted == 6
    remaining = {row.id for row in store.list_probes(limit=1000)}
    assert remaining == {ids[k] for k in ("old-leak", "old-running", "recent-pass", "confirmation")}
    issued = [canonical(p.marker) for p in probes.values()] + [canonical(confirmation.marker)]
    found = store.lookup_markers(issued)
    assert {m.probe_id for m in found.values()} == remaining
    kept_confirmation = get_probe(store, ids["confirmation"])
    assert kept_confirmation is not None and kept_confirmation.confirms_probe_id is None
    assert store.load_alert_states()[0].last_probe_id is None
    assert store.prune(t0 - timedelta(days=30), keep_verdicts=["foreign_marker"]) == 0


def test_pruned_probe_ids_are_never_handed_out_again(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory, t0: datetime
) -> None:
    """Probe ids are permalinks: after pruning the newest rows, new probes get fresh ids."""
    last = 0
    for _ in range(3):
        last = store.begin_probe(new_probe())
        store.finish_probe(last, make_outcome())
    assert store.prune(t0 + timedelta(days=1)) == 3
    assert store.begin_probe(new_probe()) > last
