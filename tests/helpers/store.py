"""The store as tests use it: kvwatch's :class:`~kvwatch.store.Store` with a synchronous
write for each operation of the probe path.

kvwatch itself writes those through the group writer (``Store.write_group``); a test that
sets up history, or checks one write's guarantees, calls them one at a time here.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvwatch.store import Store as _KvwatchStore
from kvwatch.store.records import AlertStateRecord, NewProbe, ProbeOutcome


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
