"""runs: the controller that drives each run, and the `interrupted` status

Revision: 0003, revises: '0002'
Created: 2026-12-01 23:50:00

Written by hand (autogenerate sees neither CHECK constraints nor their values): `runs.controller` (JSON, NULL for
runs recorded before) names the process that drives a run, so that a run whose controller died can be marked
`interrupted` instead of staying `running` forever (alignflow/store/interruptions.py).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0003'
down_revision: str | Sequence[str] | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
OLD = "status IN ('running', 'completed', 'failed', 'cancelled', 'crashed')"
NEW = "status IN ('running', 'completed', 'failed', 'cancelled', 'crashed', 'interrupted')"


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('controller', JSON, nullable=True))
        batch_op.drop_constraint(batch_op.f('ck_runs_status'), type_='check')
        batch_op.create_check_constraint(batch_op.f('ck_runs_status'), sa.text(NEW))


def downgrade() -> None:
    op.execute("UPDATE runs SET status = 'failed' WHERE status = 'interrupted'")
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('ck_runs_status'), type_='check')
        batch_op.create_check_constraint(batch_op.f('ck_runs_status'), sa.text(OLD))
        batch_op.drop_column('controller')
