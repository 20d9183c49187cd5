"""Indexes for reviewing history: per-endpoint timelines and confirmation look-ups.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03

The review pages and API list probes newest first by ``(started_at, id)``. With these
indexes every such query is one index range walk that stops after a page, whatever the
history's length: one endpoint's probes (all kinds; the index also covers its charts), one
endpoint's probes of one verdict, and the confirmation probes of a probe (which also keeps
pruning's ON DELETE SET NULL from scanning the table for each deleted row).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keyed by endpoint and time, and covering every column the timeline chart and the summary
# aggregate: a 30-day chart reads tens of thousands of rows from the index alone, never the
# table (SQLite has no INCLUDE, so the covered columns are trailing key columns on both).
HISTORY_COLUMNS = (
    "endpoint",
    "started_at",
    "id",
    "state",
    "kind",
    "verdict",
    "duration_seconds",
    "planned_prompt_tokens",
    "reported_prompt_tokens",
    "completion_tokens",
)


def upgrade() -> None:
    op.create_index("ix_probes_history", "probes", list(HISTORY_COLUMNS))
    op.create_index(
        op.f("ix_probes_endpoint_verdict_started_at_id"),
        "probes",
        ["endpoint", "verdict", "started_at", "id"],
    )
    op.create_index(op.f("ix_probes_confirms_probe_id"), "probes", ["confirms_probe_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_probes_confirms_probe_id"), table_name="probes")
    op.drop_index(op.f("ix_probes_endpoint_verdict_started_at_id"), table_name="probes")
    op.drop_index("ix_probes_history", table_name="probes")
