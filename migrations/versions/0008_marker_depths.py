"""Marker depths: one marker per configured depth, and what became of each (issue 12).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03

``probes.depth_outcomes`` holds, for a probe whose prompt carried one marker per depth, each
marker with its depth and outcome (``found``, ``missing``, ``foreign``; null until judged):
the evidence of which part of the prompt the engine lost. NULL for the usual single-marker
probe, so existing rows keep their meaning. The extra markers go to ``markers`` like the
first, which needs no schema change. The type is spelled out, so this revision keeps
creating the same schema however the models evolve.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("probes") as batch:
        batch.add_column(sa.Column("depth_outcomes", _JSON, nullable=True))


def downgrade() -> None:
    # The per-depth evidence goes; each probe keeps its first marker, depth and verdict
    # (whose reason already says which part was lost), and every issued marker stays in
    # ``markers``, so a leaked one is still traced to its probe.
    with op.batch_alter_table("probes") as batch:
        batch.drop_column("depth_outcomes")
