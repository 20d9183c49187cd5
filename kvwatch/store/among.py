"""``column`` is one of a set of names, as one bound parameter on either database.

The endpoints table keeps every endpoint ever registered, and so do the tables keyed by
endpoint (calibrations, served windows): under reloads and discovery they gain rows for good.
A read that only wants the endpoints probed now filters in the database, so what Python
builds per page view stays the size of the fleet, not of its history (issue 25: each view's
transient peak is memory the allocators keep). One parameter rather than an ``IN`` list of
one per name: the statement stays the same whatever the fleet's size (SQLAlchemy's compiled
cache holds one entry), and no list runs into SQLite's cap on parameters.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from sqlalchemy import ColumnElement, String, any_, bindparam, func, select
from sqlalchemy.dialects import postgresql


def name_among(column: Any, names: Collection[str], dialect: str) -> ColumnElement[bool]:
    """``column`` is in ``names``: ``= ANY(array)`` on PostgreSQL, a ``json_each`` of one
    JSON array on SQLite (its JSON functions are built in since 3.38; CPython's is newer)."""
    ordered = sorted(names)
    if dialect == "postgresql":
        return column == any_(bindparam(None, value=ordered, type_=postgresql.ARRAY(String)))  # type: ignore[no-any-return]
    listed = func.json_each(bindparam(None, value=json.dumps(ordered), type_=String))
    return column.in_(select(listed.table_valued("value").c.value))  # type: ignore[no-any-return]
