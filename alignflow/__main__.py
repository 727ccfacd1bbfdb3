"""`python -m alignflow` = the `alignflow` command."""

from alignflow.cli import main

main()
