"""Progress (tqdm) on a terminal and in a log, and the tabulate tables."""

from __future__ import annotations

import fcntl
import io
import os
import re
import select
import struct
import termios

from stageopt.console import progress, render_rows


def test_log_mode_prints_whole_lines_with_count_rate_and_eta():
    out = io.StringIO()
    with progress(4, "writing traces", unit="rank", stream=out, log_interval_s=0, quiet_s=0) as bar:
        for _ in range(4):
            bar.update()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0].startswith("writing traces: 0/4 rank (0%)")
    assert [re.search(r"(\d)/4 rank \((\d+)%\)", line).groups() for line in lines[1:]] == [
        ("1", "25"), ("2", "50"), ("3", "75"), ("4", "100")]  # one line per update, the last one not repeated
    assert all(re.search(r"left \d\d:\d\d, [\d.]+rank/s$", line) for line in lines[1:])


def test_log_mode_is_periodic_not_per_update():
    out = io.StringIO()
    with progress(1000, "replaying", unit="rank", stream=out, log_interval_s=3600, quiet_s=0) as bar:
        for _ in range(1000):
            bar.update()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "0/1000" in lines[0] and "1000/1000 rank (100%)" in lines[1]


def test_unknown_total_shows_count_and_rate():
    out = io.StringIO()
    with progress(None, "loading", unit="node", stream=out, log_interval_s=3600, quiet_s=0) as bar:
        bar.update(5000)
    assert re.search(r"loading: 5000 node, elapsed 00:00, [\d.]+node/s", out.getvalue().splitlines()[-1])


def test_terminal_gets_a_live_bar():
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    with os.fdopen(slave, "w") as tty:
        with progress(3, "sims", unit="plan", stream=tty, leave=True, quiet_s=0) as bar:
            bar.update(3)
        tty.flush()
        shown = b""
        while select.select([master], [], [], 0.2)[0]:
            shown += os.read(master, 65536)
    os.close(master)
    text = shown.decode()
    assert "\r" in text and "3/3" in text and "plan/s" in text and "100%|" in text


def test_short_work_stays_silent_in_a_log():
    out = io.StringIO()
    with progress(100, "writing traces", unit="rank", stream=out, log_interval_s=3600) as bar:
        bar.update(100)
    assert out.getvalue() == ""


def test_disabled_writes_nothing():
    out = io.StringIO()
    with progress(10, "quiet", stream=out, enabled=False) as bar:
        bar.update(10)
    assert out.getvalue() == ""


def test_table_columns_fit_their_widest_cell():
    text = render_rows(["#", "time s", "plan"], [["1", "7.364", "tp=8 pp=1"], ["2", "10.125", "tp=4"]],
                       align=["right", "right", "left"])
    head, rule, first, second = text.splitlines()
    assert rule.split() == ["-" * 3, "-" * 8, "-" * 9]  # widest cell, or header + tabulate's padding of 2
    assert first.index("7.364") + len("7.364") == second.index("10.125") + len("10.125")  # right-aligned numbers
    assert second.rstrip().endswith("tp=4") and first.index("tp=8") == second.index("tp=4")  # left-aligned text
