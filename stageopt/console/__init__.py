"""Owns what long commands show a person while they run, and the tables they print at the end.

Progress is tqdm (a live bar on a terminal, one status line every few seconds in
a log); tables are tabulate. Lives on a low floor so that any package (program
generation, the trace replay, the ASTRA-sim runner, the search loop) can report
progress the same way. Imports only ``stageopt.errors``.
"""

from stageopt.console.progress import LOG_INTERVAL_S, progress
from stageopt.console.tables import render_rows

__all__ = ["LOG_INTERVAL_S", "progress", "render_rows"]
