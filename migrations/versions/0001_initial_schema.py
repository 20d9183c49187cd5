"""Initial schema: endpoints, probes, issued markers, alert states.

Revision ID: 0001
Revises:
Create Date: 2026-12-02

Types are spelled out here rather than imported from kvwatch.store so that this revision keeps
creating the same schema however the models evolve. ``UTCDateTime`` is a plain
``DateTime(timezone=True)`` underneath.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id() -> sa.types.TypeEngine[int]:
    # SQLite only auto-increments a column declared exactly INTEGER.
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _json() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _timestamp() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "endpoints",
        sa.Column("id", _id(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("flavour", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("context_window", sa.BigInteger(), nullable=True),
        sa.Column("kv_pool_tokens", sa.BigInteger(), nullable=True),
        sa.Column("labels", _json(), nullable=False),
        sa.Column("created_at", _timestamp(), nullable=False),
        sa.Column("updated_at", _timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_endpoints")),
        sa.UniqueConstraint("name", name=op.f("uq_endpoints_name")),
    )
    op.create_table(
        "probes",
        sa.Column("id", _id(), autoincrement=True, nullable=False),
        sa.Column("endpoint", sa.String(length=200), nullable=False),
        sa.Column("endpoint_id", _id(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("verdict", sa.String(length=32), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("started_at", _timestamp(), nullable=False),
        sa.Column("finished_at", _timestamp(), nullable=True),
        sa.Column("replica", sa.String(length=200), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("planned_prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("target_prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("reported_prompt_tokens", sa.BigInteger(), nullable=True),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=True),
        sa.Column("max_tokens", sa.Integer(), nullable=False),
        sa.Column("token_source", sa.Text(), nullable=False),
        sa.Column("tokenize_calls", sa.Integer(), nullable=False),
        sa.Column("marker", sa.String(length=64), nullable=False),
        sa.Column("marker_depth", sa.Float(), nullable=False),
        sa.Column("marker_found", sa.Boolean(), nullable=True),
        sa.Column("foreign_markers", _json(), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("finish_reason", sa.String(length=64), nullable=True),
        sa.Column("streamed", sa.Boolean(), nullable=False),
        sa.Column("answer_excerpt", sa.Text(), nullable=True),
        sa.Column("error_body", sa.Text(), nullable=True),
        sa.Column("error_detail", sa.Text(), nullable=True),
        sa.Column("ttfb_seconds", sa.Float(), nullable=True),
        sa.Column("duration_seconds", sa.Float(), nullable=True),
        sa.Column("confirms_probe_id", _id(), nullable=True),
        sa.CheckConstraint(
            "state IN ('running', 'done', 'interrupted')", name=op.f("ck_probes_state")
        ),
        sa.ForeignKeyConstraint(
            ["confirms_probe_id"],
            ["probes.id"],
            name=op.f("fk_probes_confirms_probe_id_probes"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["endpoint_id"], ["endpoints.id"], name=op.f("fk_probes_endpoint_id_endpoints")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_probes")),
        # Probe ids are permalinks: SQLite must never reuse the id of a pruned row.
        sqlite_autoincrement=True,
    )
    op.create_index(
        op.f("ix_probes_endpoint_kind_started_at"), "probes", ["endpoint", "kind", "started_at"]
    )
    op.create_index(op.f("ix_probes_started_at"), "probes", ["started_at"])
    op.create_index(op.f("ix_probes_state_replica"), "probes", ["state", "replica"])
    op.create_index(op.f("ix_probes_verdict_started_at"), "probes", ["verdict", "started_at"])
    op.create_table(
        "markers",
        sa.Column("marker", sa.String(length=12), nullable=False),
        sa.Column("probe_id", _id(), nullable=False),
        sa.Column("endpoint", sa.String(length=200), nullable=False),
        sa.Column("issued_at", _timestamp(), nullable=False),
        sa.ForeignKeyConstraint(
            ["probe_id"],
            ["probes.id"],
            name=op.f("fk_markers_probe_id_probes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("marker", name=op.f("pk_markers")),
    )
    op.create_index(op.f("ix_markers_probe_id"), "markers", ["probe_id"])
    op.create_table(
        "alert_states",
        sa.Column("id", _id(), autoincrement=True, nullable=False),
        sa.Column("alertname", sa.String(length=100), nullable=False),
        sa.Column("endpoint", sa.String(length=200), nullable=False),
        sa.Column("probe", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("passes", sa.Integer(), nullable=False),
        sa.Column("starts_at", _timestamp(), nullable=True),
        sa.Column("ends_at", _timestamp(), nullable=True),
        sa.Column("last_probe_id", _id(), nullable=True),
        sa.Column("labels", _json(), nullable=False),
        sa.Column("annotations", _json(), nullable=False),
        sa.Column("generator_url", sa.Text(), nullable=True),
        sa.Column("updated_at", _timestamp(), nullable=False),
        sa.CheckConstraint(
            "state IN ('inactive', 'pending', 'firing', 'resolved')",
            name=op.f("ck_alert_states_state"),
        ),
        sa.ForeignKeyConstraint(
            ["last_probe_id"],
            ["probes.id"],
            name=op.f("fk_alert_states_last_probe_id_probes"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_states")),
        sa.UniqueConstraint(
            "alertname", "endpoint", "probe", name=op.f("uq_alert_states_alertname_endpoint_probe")
        ),
    )


def downgrade() -> None:
    op.drop_table("alert_states")
    op.drop_index(op.f("ix_markers_probe_id"), table_name="markers")
    op.drop_table("markers")
    op.drop_index(op.f("ix_probes_verdict_started_at"), table_name="probes")
    op.drop_index(op.f("ix_probes_state_replica"), table_name="probes")
    op.drop_index(op.f("ix_probes_started_at"), table_name="probes")
    op.drop_index(op.f("ix_probes_endpoint_kind_started_at"), table_name="probes")
    op.drop_table("probes")
    op.drop_table("endpoints")
