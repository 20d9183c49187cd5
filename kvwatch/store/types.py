"""Column types that behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware.

    PostgreSQL keeps the zone in ``timestamptz``; SQLite keeps only the digits, so values are
    normalised to UTC on the way in and tagged as UTC on the way out. Naive datetimes are
    refused: guessing their zone is how off-by-hours history happens.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value.isoformat()} given; pass an aware datetime")
        utc = value.astimezone(UTC)
        # SQLite's text storage would keep no offset anyway; storing naive UTC keeps
        # comparisons plain string comparisons of one format.
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def json_type() -> TypeEngine[Any]:
    """JSON everywhere, JSONB on PostgreSQL (indexable, compact)."""
    return JSON().with_variant(JSONB(), "postgresql")
