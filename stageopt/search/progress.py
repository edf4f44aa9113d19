"""Progress of long loops (the census, simulations): a live bar on a terminal, a status line elsewhere.

Why both: on a TTY tqdm shows rate and ETA in place; in a log file or CI a bar's
carriage returns are noise, so every ``interval_s`` one plain line says done/total,
rate and ETA. Library callers pass ``enabled=False`` (the default) and see nothing.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``with Progress(total, "census", "plans", enabled=True) as bar: bar.update(n)``."""

    def __init__(self, total: int, desc: str, unit: str, *, enabled: bool = False, stream: TextIO | None = None,
                 interval_s: float = 10.0) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.interval_s = interval_s
        self.done = 0
        self._started = self._last = time.monotonic()
        self._bar = None
        if enabled and self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=f" {unit}", file=self.stream, dynamic_ncols=True,
                             leave=False, unit_scale=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if self.enabled and now - self._last >= self.interval_s:
            self._last = now
            self.stream.write(self.status() + "\n")
            self.stream.flush()

    def status(self) -> str:
        """``census: 40,000/100,000 plans (12,345/s, ETA 5 s)``."""
        elapsed = max(time.monotonic() - self._started, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        return f"{self.desc}: {self.done:,}/{self.total:,} {self.unit} ({rate:,.0f}/s, ETA {eta:,.0f} s)"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
