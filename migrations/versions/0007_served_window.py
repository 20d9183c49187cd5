"""The true served window: bisect probes linked to their trigger, and measured windows.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03

``probes.trigger_probe_id`` links a ``bisect`` probe to the failing probe that started the
search (NULL for every other probe, so existing rows keep their meaning). ``served_windows``
keeps one row per measurement of what an endpoint really serves; the latest row of an
endpoint is its current served window. Types are spelled out, so this revision keeps
creating the same schema however the models evolve.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_PROBES = {"sqlite_autoincrement": True}


def upgrade() -> None:
    # On SQLite, adding the foreign key rebuilds ``probes`` (batch mode); kvwatch runs
    # migrations with foreign keys off there, so the rebuild fires no ON DELETE action, and
    # the copy keeps AUTOINCREMENT (a pruned probe's id, a permalink, is never reused).
    with op.batch_alter_table("probes", table_kwargs=_PROBES) as batch:
        batch.add_column(sa.Column("trigger_probe_id", _ID, nullable=True))
        batch.create_foreign_key(
            "fk_probes_trigger_probe_id_probes",
            "probes",
            ["trigger_probe_id"],
            ["id"],
            ondelete="SET NULL",
        )
    op.create_table(
        "served_windows",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("endpoint", sa.String(200), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("advertised_tokens", sa.BigInteger(), nullable=False),
        sa.Column("served_tokens", sa.BigInteger(), nullable=False),
        sa.Column("unserved_tokens", sa.BigInteger(), nullable=True),
        sa.Column("exact", sa.Boolean(), nullable=False),
        sa.Column("probes", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column(
            "probe_id",
            _ID,
            sa.ForeignKey(
                "probes.id", name="fk_served_windows_probe_id_probes", ondelete="SET NULL"
            ),
            nullable=True,
        ),
        sa.CheckConstraint("source IN ('search', 'recovered')", name="ck_served_windows_source"),
        sa.PrimaryKeyConstraint("id", name="pk_served_windows"),
    )
    op.create_index(
        "ix_served_windows_endpoint_measured_at_id",
        "served_windows",
        ["endpoint", "measured_at", "id"],
    )


def downgrade() -> None:
    op.drop_index("ix_served_windows_endpoint_measured_at_id", table_name="served_windows")
    op.drop_table("served_windows")
    with op.batch_alter_table("probes", table_kwargs=_PROBES) as batch:
        batch.drop_constraint("fk_probes_trigger_probe_id_probes", type_="foreignkey")
        batch.drop_column("trigger_probe_id")
