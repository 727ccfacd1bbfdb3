"""matrices and goldens: a run's switch matrix, and each side's versioned golden values

Revision: 0005, revises: 0004
Created: 2026-12-04 12:00:00

`matrices` holds the switch matrix of a run whose experiment has `variants:` (its verdict, rows and variants as
JSON, the report directory), once per run. `goldens` holds golden values of one side of one experiment — a matrix
variant is an experiment of its own (`demo-matrix/01_recompute`) — versioned 1, 2, ... per (experiment, side),
each from the run it names (alignflow/golden.py).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0005'
down_revision: str | Sequence[str] | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table('matrices',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.String(length=12), nullable=False),
    sa.Column('verdict', sa.String(length=40), nullable=False),
    sa.Column('summary', JSON, nullable=False),
    sa.Column('report', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_matrices_run_id_runs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_matrices')),
    sa.UniqueConstraint('run_id', name=op.f('uq_matrices_run_id'))
    )
    op.create_table('goldens',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('experiment_id', sa.Integer(), nullable=False),
    sa.Column('side', sa.String(length=40), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.String(length=12), nullable=False),
    sa.Column('step_run_id', sa.String(length=12), nullable=True),
    sa.Column('log_sha256', sa.String(length=64), nullable=False),
    sa.Column('values', JSON, nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['experiment_id'], ['experiments.id'], name=op.f('fk_goldens_experiment_id_experiments')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_goldens_run_id_runs')),
    sa.ForeignKeyConstraint(['step_run_id'], ['step_runs.id'], name=op.f('fk_goldens_step_run_id_step_runs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_goldens')),
    sa.UniqueConstraint('experiment_id', 'side', 'version', name=op.f('uq_goldens_experiment_id_side_version'))
    )
    op.create_index(op.f('ix_goldens_experiment_id'), 'goldens', ['experiment_id'], unique=False)
    op.create_index(op.f('ix_goldens_run_id'), 'goldens', ['run_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_goldens_run_id'), table_name='goldens')
    op.drop_index(op.f('ix_goldens_experiment_id'), table_name='goldens')
    op.drop_table('goldens')
    op.drop_table('matrices')
