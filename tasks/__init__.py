"""Prefect tasks: one per pipeline step, each a thin adapter over one alignflow core function."""
