"""``python -m flows``: the full ``coevolve`` CLI (``flows/cli``), as the console script runs it."""

from flows.cli import main

main()
