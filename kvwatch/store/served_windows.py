"""Served-window measurements, and the last size a probe proved served."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from sqlalchemy import (
    bindparam,
    func,
    select,
)

from kvwatch.store.among import name_among
from kvwatch.store.base import StoreBase
from kvwatch.store.models import (
    Probe,
    ServedWindow,
)
from kvwatch.store.records import (
    ServedWindowRecord,
)


class ServedWindows(StoreBase):
    def record_served_window(self, record: ServedWindowRecord) -> None:
        """Store one measurement of what an endpoint really serves."""
        with self._errors("could not record a served window"), self._write() as s:
            s.add(ServedWindow(**dataclasses.asdict(record)))

    def served_windows(
        self, endpoint: str | None = None, *, among: Collection[str] | None = None
    ) -> dict[str, ServedWindowRecord]:
        """The latest measurement of each endpoint (or of one, or of those in ``among``), by
        endpoint name."""
        query, params = (_LATEST, {}) if endpoint is None else (_LATEST_OF, {"name": endpoint})
        with self._errors("could not read served windows"), self._sessions() as s:
            if among is not None:
                dialect = s.get_bind().dialect.name
                query = query.where(name_among(ServedWindow.endpoint, among, dialect))
            return {row.endpoint: _served_window(row) for row in s.scalars(query, params)}

    def last_passing_size(self, endpoint: str, kinds: Sequence[str], below: int) -> int | None:
        """Prompt tokens of the latest passing probe of ``kinds`` smaller than ``below``: the
        size the served-window search may start from."""
        query = (
            select(Probe.planned_prompt_tokens)
            .where(
                Probe.endpoint == endpoint,
                Probe.kind.in_(list(kinds)),
                Probe.verdict == "pass",
                Probe.planned_prompt_tokens < below,
            )
            .order_by(Probe.started_at.desc(), Probe.id.desc())
            .limit(1)
        )
        with self._errors("could not read the last passing probe"), self._sessions() as s:
            return s.scalar(query)


# Built once: a subquery's columns are copied each time one is built, in reference cycles
# left to the cyclic garbage collector, and a served-window probe reads this every run.
_IDS = (
    select(ServedWindow.endpoint, func.max(ServedWindow.id).label("id"))
    .group_by(ServedWindow.endpoint)
    .subquery()
)
_LATEST = select(ServedWindow).join(_IDS, ServedWindow.id == _IDS.c.id)
_LATEST_OF = _LATEST.where(ServedWindow.endpoint == bindparam("name"))


def _served_window(row: ServedWindow) -> ServedWindowRecord:
    return ServedWindowRecord(
        endpoint=row.endpoint,
        measured_at=row.measured_at,
        source=row.source,
        advertised_tokens=row.advertised_tokens,
        served_tokens=row.served_tokens,
        unserved_tokens=row.unserved_tokens,
        exact=row.exact,
        probes=row.probes,
        prompt_tokens=row.prompt_tokens,
        probe_id=row.probe_id,
    )
