#!/bin/sh
# Runs once, when the PostgreSQL volume is first initialised (the image's docker-entrypoint-initdb.d):
# Prefect's database is POSTGRES_DB (with pg_trgm, which Prefect's server wants); alignflow's store gets its own
# database on the same server, owned by the same role. Tables are created by the migrations (`alignflow db upgrade`,
# run automatically by `alignflow serve`).
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<SQL
CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE DATABASE ${ALIGNFLOW_DB:-alignflow} OWNER "$POSTGRES_USER";
SQL
