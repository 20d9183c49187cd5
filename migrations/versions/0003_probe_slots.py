"""Slot claims, so that several replicas on one database run each probe slot once.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02

``probe_slots`` holds one claim per (endpoint, kind, slot); ``probes.slot`` ties a probe to
the slot it ran for, so a taken-over slot can interrupt the dead replica's probe row and
duplicates can be counted. Types are spelled out, as in 0001, so this revision keeps
creating the same schema however the models evolve.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("probes") as batch:
        batch.add_column(sa.Column("slot", sa.BigInteger(), nullable=True))
        batch.create_index("ix_probes_endpoint_kind_slot", ["endpoint", "kind", "slot"])
    op.create_table(
        "probe_slots",
        sa.Column("endpoint", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("slot", sa.BigInteger(), nullable=False),
        sa.Column("replica", sa.String(200), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("done", sa.Boolean(), nullable=False),
        sa.Column("probe_id", _ID, nullable=True),
        sa.ForeignKeyConstraint(
            ["probe_id"],
            ["probes.id"],
            name="fk_probe_slots_probe_id_probes",
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("endpoint", "kind", "slot", name="pk_probe_slots"),
    )
    op.create_index("ix_probe_slots_done_expires_at", "probe_slots", ["done", "expires_at"])


def downgrade() -> None:
    op.drop_index("ix_probe_slots_done_expires_at", table_name="probe_slots")
    op.drop_table("probe_slots")
    with op.batch_alter_table("probes") as batch:
        batch.drop_index("ix_probes_endpoint_kind_slot")
        batch.drop_column("slot")
