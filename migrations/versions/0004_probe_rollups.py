"""Hourly rollups of finished probes; indexes of unfinished probes and of the latest ones.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03

``probe_rollups`` holds, per endpoint, UTC hour and verdict, what the 7- and 30-day charts
and summaries need from finished probes (counts, token sums, the slowest duration, planned
and reported prompt tokens of under probes, the durations for percentiles), so they read
hundreds of rows, not tens of thousands. The upgrade fills it from the probes already
stored. The SQL is spelled out here, not imported from the application, so this revision
keeps doing the same thing however the code evolves.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The UTC hour a probe started in, as epoch seconds (SQLite keeps naive UTC text).
_HOUR = {
    "postgresql": "(floor(extract(epoch FROM started_at) / 3600) * 3600)::bigint",
    "sqlite": "(CAST(strftime('%s', started_at) AS INTEGER) / 3600) * 3600",
}
# The durations as exact text: PostgreSQL prints the shortest exact form of a double;
# SQLite's CAST keeps only 15 digits and its printf 16 unless given '!', so it is printed
# with 17 (every double reads back exactly).
_DURATIONS = {
    "postgresql": "coalesce(string_agg(duration_seconds::text, ' '), '')",
    "sqlite": "coalesce(group_concat(CASE WHEN duration_seconds IS NOT NULL "
    "THEN printf('%!.17g', duration_seconds) END, ' '), '')",
}

_BACKFILL = """
INSERT INTO probe_rollups (
    endpoint, hour, verdict, probes, timed, max_duration_seconds, prompt_tokens,
    completion_tokens, max_planned_under, min_reported_under, durations
)
SELECT endpoint, {hour}, verdict, count(*), count(duration_seconds), max(duration_seconds),
       coalesce(sum(reported_prompt_tokens), 0), coalesce(sum(completion_tokens), 0),
       max(CASE WHEN kind = 'under' THEN planned_prompt_tokens END),
       min(CASE WHEN kind = 'under' THEN reported_prompt_tokens END), {durations}
FROM probes
WHERE state = 'done' AND verdict IS NOT NULL
GROUP BY endpoint, {hour}, verdict
"""


def upgrade() -> None:
    op.create_table(
        "probe_rollups",
        sa.Column("endpoint", sa.String(200), nullable=False),
        sa.Column("hour", sa.BigInteger(), nullable=False),
        sa.Column("verdict", sa.String(32), nullable=False),
        sa.Column("probes", sa.Integer(), nullable=False),
        sa.Column("timed", sa.Integer(), nullable=False),
        sa.Column("max_duration_seconds", sa.Float(), nullable=True),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("max_planned_under", sa.BigInteger(), nullable=True),
        sa.Column("min_reported_under", sa.BigInteger(), nullable=True),
        sa.Column("durations", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("endpoint", "hour", "verdict", name="pk_probe_rollups"),
        sqlite_with_rowid=False,
    )
    # Only unfinished probes (few at any time): a summary counts them from here, and no
    # other query can pick this index by mistake.
    unfinished = sa.text("state <> 'done'")
    op.create_index(
        "ix_probes_unfinished",
        "probes",
        ["endpoint", "started_at"],
        sqlite_where=unfinished,
        postgresql_where=unfinished,
    )
    # The latest finished probe of an endpoint and kind is the first entry under one key,
    # whatever plan a prepared statement settles on.
    op.create_index("ix_probes_latest", "probes", ["endpoint", "kind", "state", "started_at", "id"])
    dialect = op.get_bind().dialect.name
    op.execute(_BACKFILL.format(hour=_HOUR[dialect], durations=_DURATIONS[dialect]))


def downgrade() -> None:
    op.drop_index("ix_probes_latest", table_name="probes")
    op.drop_index("ix_probes_unfinished", table_name="probes")
    op.drop_table("probe_rollups")
