"""``fedlink client``'s last line: what the client did, however it stopped."""

from __future__ import annotations

from fedlink.cli.client import closing_line
from fedlink.client.stats import SessionStats


def test_the_closing_line_names_clipped_secure_values_only_when_there_were_some() -> None:
    stats = SessionStats(tasks=2, accepted=2)
    assert "clipped" not in closing_line(stats, "run finished")
    stats.secure_values_clipped = 3
    line = closing_line(stats, "run finished")
    assert line.startswith("run finished; tasks 2, accepted 2")
    assert line.endswith(", secure values clipped 3")
