"""Prefect flows: the alignment flow, the nightly regression flow, and their deployments."""
