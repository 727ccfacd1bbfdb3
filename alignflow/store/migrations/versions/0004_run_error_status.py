"""runs can end `error`: a configuration or environment cause, not a failed alignment

Revision: 0004, revises: '0003'
Created: 2026-12-06 06:00:00

Written by hand (autogenerate sees no CHECK constraint values): a run stopped by a bad file, a preflight mismatch,
an unreachable host or data of another sha256 ends `error`, without a verdict, so that it is told from a run whose
step failed and is never taken for an alignment result (issue 40). The status check constraint of `runs` gains
the value; a downgrade records those runs as `failed`, as they were recorded before.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | Sequence[str] | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = "status IN ('running', 'completed', 'failed', 'cancelled', 'crashed', 'interrupted')"
NEW = "status IN ('running', 'completed', 'failed', 'error', 'cancelled', 'crashed', 'interrupted')"


def _replace(condition: str) -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('ck_runs_status'), type_='check')
        batch_op.create_check_constraint(batch_op.f('ck_runs_status'), sa.text(condition))


def upgrade() -> None:
    _replace(NEW)


def downgrade() -> None:
    op.execute("UPDATE runs SET status = 'failed' WHERE status = 'error'")
    _replace(OLD)
