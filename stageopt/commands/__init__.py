"""One module per CLI verb, ``<verb>_command.py``: ``add_parser(subparsers)`` and ``run(args) -> int``.

Owns argument parsing and printing: the top floor, which calls the packages
below it and holds no model of its own. ``stageopt.cli`` only dispatches.
"""
