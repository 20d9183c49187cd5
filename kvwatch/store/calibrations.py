"""Token calibrations: what an endpoint's counts taught an estimating counter."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from sqlalchemy import (
    select,
)

from kvwatch.store.among import name_among
from kvwatch.store.base import StoreBase
from kvwatch.store.models import (
    TokenCalibration,
)
from kvwatch.store.records import (
    CalibrationRecord,
)
from kvwatch.store.statements import upsert_once


class TokenCalibrations(StoreBase):
    def save_calibrations(self, records: Sequence[CalibrationRecord]) -> None:
        """Replace an endpoint's calibrations for one tokenizer, size class by size class."""
        rows = [dataclasses.asdict(r) for r in records]
        if not rows:
            return
        key = ("endpoint", "token_source", "size_class")
        with self._errors("could not save a token calibration"), self._write() as s:
            dialect = s.get_bind().dialect.name
            s.execute(upsert_once(TokenCalibration, dialect, key, tuple(rows[0])), rows)

    def calibrations(
        self, endpoint: str | None = None, *, among: Collection[str] | None = None
    ) -> list[CalibrationRecord]:
        """Stored calibrations (of one endpoint, of those in ``among``, or all), by endpoint
        and tokenizer."""
        query = select(TokenCalibration).order_by(
            TokenCalibration.endpoint, TokenCalibration.token_source, TokenCalibration.size_class
        )
        if endpoint is not None:
            query = query.where(TokenCalibration.endpoint == endpoint)
        with self._errors("could not read token calibrations"), self._sessions() as s:
            if among is not None:
                dialect = s.get_bind().dialect.name
                query = query.where(name_among(TokenCalibration.endpoint, among, dialect))
            return [
                CalibrationRecord(
                    endpoint=row.endpoint,
                    token_source=row.token_source,
                    size_class=row.size_class,
                    ratio=row.ratio,
                    error=row.error,
                    observations=row.observations,
                    updated_at=row.updated_at,
                )
                for row in s.scalars(query)
            ]
