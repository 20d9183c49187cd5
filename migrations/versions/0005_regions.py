"""Multi-region mode: every region runs every slot and keeps its own alert states.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

``probes.region`` records the region of the replica that ran a probe (NULL without one).
``probe_slots`` and ``alert_states`` gain ``region`` in their keys, NOT NULL with "" for "no
region", so existing rows keep their meaning: a single-region deployment goes on claiming
and alerting exactly as before. SQLite cannot alter a key in place, so the key changes go
through batch mode (a copy of the table); PostgreSQL alters it directly. Types are spelled
out, so this revision keeps creating the same schema however the models evolve.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_REGION = sa.String(63)


def upgrade() -> None:
    with op.batch_alter_table("probes") as batch:
        batch.add_column(sa.Column("region", _REGION, nullable=True))
    with op.batch_alter_table("probe_slots") as batch:
        batch.add_column(sa.Column("region", _REGION, nullable=False, server_default=""))
        batch.drop_constraint("pk_probe_slots", type_="primary")
        batch.create_primary_key("pk_probe_slots", ["endpoint", "kind", "slot", "region"])
    with op.batch_alter_table("alert_states") as batch:
        batch.add_column(sa.Column("region", _REGION, nullable=False, server_default=""))
        batch.drop_constraint("uq_alert_states_alertname_endpoint_probe", type_="unique")
        batch.create_unique_constraint(
            "uq_alert_states_alertname_endpoint_probe_region",
            ["alertname", "endpoint", "probe", "region"],
        )


def downgrade() -> None:
    # Going back to one region per key: rows of named regions cannot all fit the old keys,
    # so only the regionless rows stay (the state of a single-region deployment).
    op.execute("DELETE FROM alert_states WHERE region <> ''")
    op.execute("DELETE FROM probe_slots WHERE region <> ''")
    with op.batch_alter_table("alert_states") as batch:
        batch.drop_constraint("uq_alert_states_alertname_endpoint_probe_region", type_="unique")
        batch.create_unique_constraint(
            "uq_alert_states_alertname_endpoint_probe", ["alertname", "endpoint", "probe"]
        )
        batch.drop_column("region")
    with op.batch_alter_table("probe_slots") as batch:
        batch.drop_constraint("pk_probe_slots", type_="primary")
        batch.create_primary_key("pk_probe_slots", ["endpoint", "kind", "slot"])
        batch.drop_column("region")
    with op.batch_alter_table("probes") as batch:
        batch.drop_column("region")
