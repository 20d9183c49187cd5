"""Upserts as statements SQLAlchemy's compiled cache can hold.

SQLAlchemy does not cache dialect-specific ``INSERT … ON CONFLICT`` constructs: each
execution compiles them afresh. For the slot claim and the rollup that every probe runs, that
compiling cost more CPU than the statement itself, so they are compiled once per dialect here
and run as text with typed parameters (the same SQL; the parameters keep their column types,
so timestamps are still converted as the models say).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import TextClause, bindparam, text
from sqlalchemy.dialects import postgresql, sqlite


def compiled_once(stmt: Any, dialect: str, column_keys: Sequence[str]) -> TextClause:
    """``stmt`` (an INSERT whose VALUES come at execution, as ``column_keys``) for
    ``dialect``, compiled now, as cacheable text."""
    named = (postgresql.dialect if dialect == "postgresql" else sqlite.dialect)(paramstyle="named")
    compiled = stmt.compile(dialect=named, column_keys=list(column_keys))
    binds = [
        bindparam(name, type_=param.type)
        if name in column_keys
        else bindparam(name, value=param.value, type_=param.type)  # a literal of the statement
        for param, name in compiled.bind_names.items()
    ]
    return text(compiled.string).bindparams(*binds)
