"""Alembic environment for kvwatch.

kvwatch builds its Alembic config in code (:mod:`kvwatch.store.migrate`) and passes an open
connection in ``config.attributes["connection"]``, so the app and the tests migrate exactly the
engine they use. Without one (the ``alembic`` CLI), the ``sqlalchemy.url`` option is used.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from kvwatch.store.engine import create_engine_for
from kvwatch.store.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no connection passed and no sqlalchemy.url configured")
    engine = create_engine_for(url)
    try:
        with engine.connect() as new_connection:
            _configure(new_connection)
            new_connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
