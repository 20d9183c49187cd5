"""Cross-tenant canaries: probes and issued markers record their tenant.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03

``probes.tenant`` and ``markers.tenant`` hold the *name* of the tenant (``endpoints[].tenants``)
whose credentials a probe was sent with, never its key; NULL when it used the endpoint's own
``api_key``, which is what every existing row did. A marker found in an answer is looked up in
``markers``, so the tenant there is what names whose data leaked to whom. Types are spelled
out, so this revision keeps creating the same schema however the models evolve.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TENANT = sa.String(63)


def upgrade() -> None:
    with op.batch_alter_table("probes") as batch:
        batch.add_column(sa.Column("tenant", _TENANT, nullable=True))
    with op.batch_alter_table("markers") as batch:
        batch.add_column(sa.Column("tenant", _TENANT, nullable=True))


def downgrade() -> None:
    # The tenant names go; every probe and marker stays, as if sent with the endpoint's key.
    # recreate="never": SQLite (3.35+) drops a plain column in place. A batch copy of
    # ``probes`` would drop the old table, and its ON DELETE CASCADE would empty ``markers``.
    with op.batch_alter_table("markers", recreate="never") as batch:
        batch.drop_column("tenant")
    with op.batch_alter_table("probes", recreate="never") as batch:
        batch.drop_column("tenant")
