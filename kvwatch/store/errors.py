"""The one exception the store raises, so callers catch a single type."""

from __future__ import annotations


class StoreError(Exception):
    """The database is unreachable, misconfigured, or refused an operation."""
