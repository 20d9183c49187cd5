"""Cache reuse: each probe records the prompt tokens the engine served from its cache.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05

``probes.cached_prompt_tokens`` holds what the engine reported as read from its prefix cache
(``usage.prompt_tokens_details.cached_tokens``, Anthropic's ``cache_read_input_tokens``),
summed over a cache probe's steps. NULL when the engine did not report it (vLLM without
``--enable-prompt-tokens-details``, SGLang without ``--enable-cache-report``) and for probes
from before this revision: absent is not 0. A cache probe's steps are stored as entries of
the existing per-marker evidence (``depth_outcomes``), as a burst's requests are, so no
other column is needed. Types are spelled out, so this revision keeps creating the same
schema however the models evolve.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("probes") as batch:
        batch.add_column(sa.Column("cached_prompt_tokens", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # recreate="never": SQLite (3.35+) drops a plain column in place. A batch copy of
    # ``probes`` would drop the old table, and its ON DELETE CASCADE would empty ``markers``.
    with op.batch_alter_table("probes", recreate="never") as batch:
        batch.drop_column("cached_prompt_tokens")
