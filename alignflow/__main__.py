"""`python -m alignflow` = the `alignflow` command (the console script's entry point too).

The command line is imported inside `run`, so that a Ctrl-C while its modules load (a second or so: typer, rich,
every command module) ends with exit 130 and one line, not a traceback through whichever import it hit.
"""

import sys


def run() -> None:
    """The `alignflow` command: `alignflow.cli.main`, loaded here."""
    try:
        from alignflow.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    main()


if __name__ == "__main__":
    run()
