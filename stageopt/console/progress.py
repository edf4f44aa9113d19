"""Progress with a rate and an ETA for long work: tqdm's bar on a terminal, periodic lines in a log.

Why not tqdm alone: on a pipe (CI, ``nohup``, ``ray job submit``) tqdm redraws its
line with carriage returns, which logs show as one ever-growing line or not at
all until the end. Here the same tqdm object writes, when the stream is not a
terminal, one plain line at most every ``log_interval_s`` seconds (and a last
one when the work ends). Callers get the tqdm object and use its own API:
``update(n)``, ``set_postfix_str(text)``, ``total``.

Usage::

    with progress(len(ranks), "writing traces", unit="rank") as bar:
        for rank in ranks:
            ...
            bar.update()
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from tqdm import tqdm

LOG_INTERVAL_S = 15.0  # seconds between status lines when the stream is not a terminal
TERMINAL_QUIET_S = 0.5  # a live bar appears only for work that lasts longer
_LOG_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit} ({percentage:.0f}%) elapsed {elapsed}, left {remaining}, {rate_fmt}{postfix}"
_LOG_FORMAT_OPEN = "{desc}: {n_fmt} {unit}, elapsed {elapsed}, {rate_fmt}{postfix}"


class _LineStream:
    """A stream for tqdm that turns each carriage-return redraw into one finished line (repeats dropped)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._last = ""

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line and line != self._last:
            self.stream.write(line + "\n")
            self._last = line

    def flush(self) -> None:
        self.stream.flush()


def is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


@contextmanager
def progress(total: int | None, desc: str, *, unit: str = "it", enabled: bool = True, stream: TextIO | None = None,
             log_interval_s: float = LOG_INTERVAL_S, leave: bool = False, quiet_s: float | None = None) -> Iterator[tqdm]:
    """A tqdm bar for ``total`` units of work (``None``: unknown), closed when the block ends.

    ``enabled=False`` gives a bar whose calls do nothing (for ``--json``). On a
    terminal the bar redraws live (``leave``: keep it after the end); elsewhere it
    prints a line at most every ``log_interval_s`` seconds and one at the end.
    Nothing is shown for work that ends within ``quiet_s`` seconds (default: 0.5 s
    on a terminal, ``log_interval_s`` in a log), so short runs stay silent.
    """
    out = sys.stderr if stream is None else stream
    terminal = is_terminal(out)
    delay = quiet_s if quiet_s is not None else (TERMINAL_QUIET_S if terminal else log_interval_s)
    if not enabled:
        bar = tqdm(total=total, disable=True)
    elif terminal:
        sized = _columns(out) > 0  # a terminal that reports no width (some ptys) gets a fixed one
        bar = tqdm(total=total, desc=desc, unit=unit, file=out, leave=leave, dynamic_ncols=sized,
                   ncols=None if sized else 100, mininterval=0.1, delay=delay)
    else:
        fmt = _LOG_FORMAT if total else _LOG_FORMAT_OPEN
        bar = tqdm(total=total, desc=desc, unit=unit, file=_LineStream(out), leave=True, bar_format=fmt,
                   mininterval=log_interval_s, maxinterval=float("inf"), miniters=1, ascii=True, delay=delay)
    try:
        yield bar
    finally:
        if not bar.disable and not is_terminal(out) and bar.last_print_n == bar.n:
            bar.leave = False  # the last line printed already shows the end state
        bar.close()
