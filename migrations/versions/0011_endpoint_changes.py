"""Endpoint changes: each endpoint's latest self-report fingerprint, and the changes seen.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05

``endpoint_fingerprints`` keeps the latest fingerprint of each endpoint's self-report (the
facts that identify its deployment: kvwatch.fingerprint), per region. ``endpoint_changes``
keeps every change with its before and after fields, and when its canaries may run or ran.
``probes.change_id`` links the canaries a change ran to it (NULL for scheduled probes and
for probes from before this revision). Types are spelled out, so this revision keeps creating
the same schema however the models evolve.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def json_type() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def UTCDateTime() -> sa.DateTime:  # noqa: N802 - named as the model's type it stands for
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "endpoint_fingerprints",
        sa.Column("endpoint", sa.String(200), nullable=False),
        sa.Column("region", sa.String(63), nullable=False, server_default=""),
        sa.Column("fields", json_type(), nullable=True),
        sa.Column("digest", sa.String(64), nullable=True),
        sa.Column("misses", sa.Integer(), nullable=False),
        sa.Column("seen_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("endpoint", "region", name="pk_endpoint_fingerprints"),
    )
    op.create_table(
        "endpoint_changes",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("endpoint", sa.String(200), nullable=False),
        sa.Column("region", sa.String(63), nullable=False, server_default=""),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("before", json_type(), nullable=False),
        sa.Column("after", json_type(), nullable=False),
        sa.Column("fields", json_type(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("due_at", UTCDateTime(), nullable=False),
        sa.Column("ran_at", UTCDateTime(), nullable=True),
        sa.Column("replica", sa.String(200), nullable=False),
        sa.CheckConstraint(
            "reason IN ('fingerprint', 'restart')", name="ck_endpoint_changes_reason"
        ),
        sa.CheckConstraint(
            "state IN ('due', 'held', 'ran', 'superseded', 'off')",
            name="ck_endpoint_changes_state",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_endpoint_changes"),
    )
    op.create_index("ix_endpoint_changes_endpoint_at", "endpoint_changes", ["endpoint", "at"])
    op.create_index("ix_endpoint_changes_state_due_at", "endpoint_changes", ["state", "due_at"])
    with op.batch_alter_table("probes") as batch:
        batch.add_column(sa.Column("change_id", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # recreate="never": SQLite (3.35+) drops a plain column in place. A batch copy of
    # ``probes`` would drop the old table, and its ON DELETE CASCADE would empty ``markers``.
    with op.batch_alter_table("probes", recreate="never") as batch:
        batch.drop_column("change_id")
    op.drop_index("ix_endpoint_changes_state_due_at", "endpoint_changes")
    op.drop_index("ix_endpoint_changes_endpoint_at", "endpoint_changes")
    op.drop_table("endpoint_changes")
    op.drop_table("endpoint_fingerprints")
