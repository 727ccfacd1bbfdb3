"""step runs can end cancelled

Revision: 0002, revises: 0001
Created: 2026-12-01 23:50:00

A step whose run was cancelled (the flow run cancelled, Ctrl-C, `alignflow cancel`) ends `cancelled`, not
`failed`: it did not fail, it was stopped. The status check constraint of `step_runs` gains the value.
"""

from collections.abc import Sequence

from alembic import op

revision: str = '0002'
down_revision: str | Sequence[str] | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BEFORE = "status IN ('pending', 'running', 'ran', 'cached', 'failed', 'skipped')"
AFTER = "status IN ('pending', 'running', 'ran', 'cached', 'failed', 'cancelled', 'skipped')"


def _replace(condition: str) -> None:
    with op.batch_alter_table('step_runs') as batch:
        batch.drop_constraint(op.f('ck_step_runs_status'), type_='check')
        batch.create_check_constraint(op.f('ck_step_runs_status'), condition)


def upgrade() -> None:
    _replace(AFTER)


def downgrade() -> None:
    op.execute("UPDATE step_runs SET status = 'failed' WHERE status = 'cancelled'")
    _replace(BEFORE)
