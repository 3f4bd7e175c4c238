"""``make test-busy``'s CPU hog (yrelay_tools/testing/busy.py)."""

from __future__ import annotations

import sys

from yrelay_tools.testing import busy


def test_the_command_runs_beside_the_hogs_and_its_status_is_returned(monkeypatch):
    started: list = []
    start = busy.start_hogs

    def recorded(count: int) -> list:
        started.extend(start(count))
        return started

    monkeypatch.setattr(busy, "start_hogs", recorded)
    command = [sys.executable, "-c", "import sys; sys.exit(3)"]
    assert busy.main(["--hogs", "2", "--", *command]) == 3
    assert len(started) == 2 and all(hog.returncode is not None for hog in started)  # stopped once it ended
