"""Trace context: each probe records the trace id its requests carried.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04

``probes.trace_id`` holds the 32 hex digits of the W3C ``traceparent`` (or B3) trace every
request of the probe was sent with, so a failed canary links to the engine's own spans. NULL
for probes from before this revision and with ``trace: {format: off}``: existing rows stay as
they are. Types are spelled out, so this revision keeps creating the same schema however the
models evolve.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("probes") as batch:
        batch.add_column(sa.Column("trace_id", sa.String(32), nullable=True))


def downgrade() -> None:
    # recreate="never": SQLite (3.35+) drops a plain column in place. A batch copy of
    # ``probes`` would drop the old table, and its ON DELETE CASCADE would empty ``markers``.
    with op.batch_alter_table("probes", recreate="never") as batch:
        batch.drop_column("trace_id")
