"""Upserts as statements SQLAlchemy's compiled cache can hold.

SQLAlchemy does not cache dialect-specific ``INSERT … ON CONFLICT`` constructs: each
execution compiles them afresh. For the slot claim and the rollup that every probe runs, that
compiling cost more CPU than the statement itself, so they are compiled once per dialect here
and run as text with typed parameters (the same SQL; the parameters keep their column types,
so timestamps are still converted as the models say).
"""

from __future__ import annotations

import functools
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
    # PostgreSQL's casts (``:labels::JSONB`` for a JSON column) are escaped, or text() would
    # not take ``:labels`` for a parameter.
    return text(compiled.string.replace("::", r"\:\:")).bindparams(*binds)


def insert_for(dialect: str, model: Any) -> Any:
    """``INSERT`` into ``model`` with the dialect's ``ON CONFLICT`` clauses (both dialects
    offer them with the same interface)."""
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(model)


@functools.cache  # one entry per (model, dialect, key, columns): a few per database
def upsert_once(
    model: type[Any], dialect: str, key: tuple[str, ...], columns: tuple[str, ...]
) -> TextClause:
    """``INSERT … ON CONFLICT (key) DO UPDATE`` that sets each of ``columns`` outside ``key``
    to the new row's value, for ``dialect``, compiled once (:func:`compiled_once`).

    Built per call, such an upsert was compiled afresh each time (SQLAlchemy does not cache
    it), and its ``excluded`` alias copied every column of the table: the alert-state upsert
    left 179 objects a call in reference cycles to the cyclic garbage collector (issue 25)."""
    stmt = insert_for(dialect, model)
    upsert = stmt.on_conflict_do_update(
        index_elements=list(key), set_={c: stmt.excluded[c] for c in columns if c not in key}
    )
    return compiled_once(upsert, dialect, columns)
