"""The ``stager`` command: ``main`` parses and dispatches, each subcommand importing its tool when used.

``main`` holds run, demo, slowfs, slurm, bench, catalog and clean;
``datasets`` the commands that write data (make-dataset, pack);
``insight`` the subcommands that say where the time goes (report, analyze,
whatif).

May import anything: it is the top floor.
"""

from .main import main

__all__ = ["main"]
