"""stageopt: find the best parallel plan (and hardware) for training an LLM, with simulators.

The command line is a thin shell: each subcommand lives in ``stageopt/commands/<name>_command.py`` and provides
``add_parser(subparsers)`` and ``run(args) -> int``. User errors
(:class:`stageopt.errors.StageoptError`) become one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from stageopt import __version__
from stageopt.errors import StageoptError

COMMANDS = [
    "inspect",
    "simulate",
    "presets",
    "validate_trace",
    "replay",
    "generate",
    "search",
    "calibrate",
    "report",
    "export",
    "serve",
]


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on usage errors already; keep its message to one line."""

    def error(self, message: str) -> None:  # noqa: D401 - argparse hook
        self.exit(2, f"stageopt: error: {message} (see 'stageopt {self.prog.split()[-1]} --help')\n"
                  if " " in self.prog else f"stageopt: error: {message} (see 'stageopt --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="stageopt", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"stageopt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMANDS:
        module = importlib.import_module(f"stageopt.commands.{name}_command")
        module.add_parser(sub)
    return parser


class _NoteHandler(logging.Handler):
    """Prints what the library logs on the ``stageopt`` logger (assumptions it made) as ``stageopt: note: ...``.

    Resolves ``sys.stderr`` at each record, so redirected or captured streams get the note.
    """

    def emit(self, record: logging.LogRecord) -> None:
        print(f"stageopt: note: {record.getMessage()}", file=sys.stderr)


def _show_notes() -> None:
    log = logging.getLogger("stageopt")
    if not any(isinstance(h, _NoteHandler) for h in log.handlers):
        log.addHandler(_NoteHandler(logging.INFO))
    log.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    _show_notes()
    try:
        args = build_parser().parse_args(argv)
        return int(args.run(args) or 0)
    except StageoptError as err:
        print(f"stageopt: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("stageopt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (stageopt ... | head): stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
