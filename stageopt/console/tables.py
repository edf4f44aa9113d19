"""Plain-text tables with tabulate: columns sized to their contents, numbers aligned right.

Cells arrive formatted (``"54.1%"``, ``"1,139,096"``): the caller owns units and
precision, tabulate owns widths and alignment, so no column width is hard-coded.
"""

from __future__ import annotations

from collections.abc import Sequence

from tabulate import tabulate


def render_rows(headers: Sequence[str], rows: Sequence[Sequence[object]], align: Sequence[str] | None = None,
                rule: bool = True) -> str:
    """``rows`` under ``headers``; ``align`` per column is ``"right"``, ``"left"`` or ``"center"`` (default right).

    ``rule=False`` leaves out the dashed line under the header (one line per row, header first).
    """
    colalign = tuple(align) if align is not None else ("right",) * len(headers)
    return tabulate([[str(c) for c in row] for row in rows], headers=list(headers),
                    tablefmt="simple" if rule else "plain", colalign=colalign, disable_numparse=True)
