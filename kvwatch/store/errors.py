"""The one exception the store raises, so callers catch a single type."""

from __future__ import annotations


class StoreError(Exception):
    """The database is unreachable, misconfigured, or refused an operation."""


class StoreUnavailable(StoreError):
    """The database could not be reached (or dropped the connection): worth retrying later.

    Anything else (a constraint, a row in the wrong state) is a :class:`StoreError` that a
    retry would only repeat.
    """
