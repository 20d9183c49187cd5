"""Token calibrations: what each endpoint's own counts taught an estimating tokenizer.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03

``token_calibrations`` keeps, per endpoint, tokenizer (``usage``, ``tiktoken:…``,
``hf:…``) and size class (octave of prompt sizes), the ratio of the engine's count to kvwatch's estimate and the estimate's typical
remaining error, so a restarted daemon or a one-shot probe sizes its first boundary canary
from what the last process learnt. A new table: existing rows are untouched. Types are spelled
out, so this revision keeps creating the same schema however the models evolve.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "token_calibrations",
        sa.Column("endpoint", sa.String(200), nullable=False),
        sa.Column("token_source", sa.String(300), nullable=False),
        sa.Column("size_class", sa.Integer(), nullable=False),
        sa.Column("ratio", sa.Float(), nullable=False),
        sa.Column("error", sa.Float(), nullable=False),
        sa.Column("observations", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "endpoint", "token_source", "size_class", name="pk_token_calibrations"
        ),
    )


def downgrade() -> None:
    # Only learnt state goes: the next process starts uncalibrated and learns it again from
    # the engine's reports (its first boundary probes keep the wide, uncalibrated margin).
    op.drop_table("token_calibrations")
