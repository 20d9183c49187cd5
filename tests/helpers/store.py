"""The store as tests use it: kvwatch's :class:`~kvwatch.store.Store` with a synchronous
write for each operation of the probe path, and reads that only tests make.

kvwatch itself writes those through the group writer (``Store.write_group``); a test that
sets up history, or checks one write's guarantees, calls them one at a time here. The reads
(:func:`get_probe`, :func:`latest_per_endpoint`) are functions, so they work on any store,
the daemon's too.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kvwatch.canary.model import ProbeState
from kvwatch.store import Store as _KvwatchStore
from kvwatch.store.models import Probe
from kvwatch.store.probes import probe_row
from kvwatch.store.records import AlertStateRecord, NewProbe, ProbeOutcome, ProbeRow


class Store(_KvwatchStore):
    def begin_probe(self, p: NewProbe) -> int:
        """Record a probe as running, with its issued marker, before its request goes out."""
        return self._write_one(self.begin_probe_op(p))

    def claim_and_begin(self, p: NewProbe, ttl: float) -> int | None:
        """Claim ``p``'s slot for ``p.replica`` (as :meth:`claim_slot`) and record ``p`` as
        running, in one transaction; None, with nothing written, if another replica has it.

        One transaction instead of two per scheduled probe: the claim still decides between
        racing replicas (the loser writes no row), and the row still exists before anything
        is sent, so a SIGKILL leaves it to be marked interrupted.
        """
        return self._write_one(self.claim_and_begin_op(p, ttl))

    def finish_probe(
        self,
        probe_id: int,
        r: ProbeOutcome,
        alert_states: Sequence[AlertStateRecord] = (),
        *,
        complete_slot: bool = False,
    ) -> None:
        """Store a probe's verdict and evidence, and the alert states it caused, atomically;
        with ``complete_slot``, mark the probe's slot done (as :meth:`complete_slot`) in the
        same transaction.

        Only a running probe can be finished: a row that was interrupted (its replica was
        presumed dead) or already finished raises :class:`StoreError` and nothing is written.
        """
        self._write_one(
            self.finish_probe_op(probe_id, r, alert_states, complete_slot=complete_slot)
        )

    def record_probe(
        self,
        p: NewProbe,
        r: ProbeOutcome,
        alert_states: Sequence[AlertStateRecord] = (),
        *,
        complete_slot: bool = False,
    ) -> int:
        """Write a whole probe at once, when its start could not be recorded (the database
        was unreachable): the done row, its marker and the alert states in one transaction,
        and with ``complete_slot`` the completion of its slot."""
        return self._write_one(
            self.record_probe_op(p, r, alert_states, complete_slot=complete_slot)
        )


def get_probe(store: _KvwatchStore, probe_id: int) -> ProbeRow | None:
    """One probe by id, or None."""
    with Session(store.engine) as s:
        row = s.get(Probe, probe_id)
        return None if row is None else probe_row(row)


def latest_per_endpoint(store: _KvwatchStore) -> dict[tuple[str, str], ProbeRow]:
    """The latest finished probe of each (endpoint, kind)."""
    latest = (
        select(func.max(Probe.id).label("id"))
        .where(Probe.state == ProbeState.DONE.value)
        .group_by(Probe.endpoint, Probe.kind)
        .subquery()
    )
    query = select(Probe).join(latest, Probe.id == latest.c.id)
    with Session(store.engine) as s:
        return {(row.endpoint, row.kind): probe_row(row) for row in s.scalars(query)}
