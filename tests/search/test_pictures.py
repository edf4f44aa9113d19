"""The search's plots: written by the plain install (matplotlib is a core dependency), HTML that opens
offline (plotly.js beside the pages, no network script), and a files: line that lists what was written."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from stageopt.cli import main


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    runs = tmp_path_factory.mktemp("runs")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["search", "--budget", "20", "--seed", "1", "--runs-dir", str(runs), "--study-name", "pics"]) == 0
    return runs / "pics", out.getvalue()


def test_files_line_lists_what_was_written(searched):
    run_dir, out = searched
    (line,) = [ln for ln in out.splitlines() if ln.startswith("files: ")]
    listed = re.search(r"\((.*)\)", line).group(1).split(", ")
    assert {"best.json", "trials.csv", "history.png", "pareto.png", "breakdown.png"} <= set(listed)
    assert all((run_dir / name).is_file() and (run_dir / name).stat().st_size > 0 for name in listed)
    on_disk = {p.name for p in run_dir.iterdir() if p.suffix in (".png", ".html", ".js", ".csv", ".json")}
    assert on_disk == set(listed)  # nothing claimed that is absent, nothing written that is unlisted


def test_html_plots_load_no_script_from_the_network(searched):
    pytest.importorskip("plotly", reason="HTML plots need the plots extra (plotly)")
    run_dir, _ = searched
    pages = sorted(run_dir.glob("*.html"))
    assert pages
    for page in pages:
        sources = re.findall(r'<script[^>]*\ssrc="([^"]+)"', page.read_text())
        assert sources == ["plotly.min.js"], (page.name, sources)
    assert (run_dir / "plotly.min.js").stat().st_size > 1_000_000  # the whole library, not a loader stub
