"""What ``yrelay analyze`` shows in the terminal: progress while it runs, a summary after.

The progress bar starts before Spark does (a JVM takes seconds to start),
then counts the job's steps (reading, one per table, the dashboard); its
description names the step and, refreshed twice a second from Spark's
status tracker, the tasks done in the stages running now, so a long step
visibly moves. Spark's own log lines (log4j warnings, the JVM's start-up
chatter) go to a file, not the terminal: :func:`stderr_to`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table as RichTable

from yrelay.spark_analytics.tables import SEVERITY

if TYPE_CHECKING:  # pyspark is imported once the bar is on screen
    from pyspark import SparkContext

POLL_SECONDS = 0.5


class JobProgress:
    """A rich progress bar for :func:`yrelay.spark_analytics.job.run` (pass :meth:`step` as ``on_step``)."""

    def __init__(self, context: SparkContext | None = None, console: Console | None = None):
        self.context = context  # None until Spark has started
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=console,
        )
        self.task = self.progress.add_task("starting", total=1)
        self.step_name = "starting"
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="yrelay-analyze-progress", daemon=True)

    def __enter__(self) -> JobProgress:
        self.progress.start()
        self._poller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._poller.join(timeout=2)
        self.progress.stop()

    def step(self, what: str, done: int, total: int) -> None:
        self.step_name = what
        self.progress.update(self.task, description=what, completed=done, total=total)

    def _poll(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            self.progress.update(self.task, description=f"{self.step_name}{self._tasks()}")

    def _tasks(self) -> str:
        """`` (tasks 3/8)`` over the active stages, or nothing between jobs."""
        if self.context is None:
            return ""
        try:
            tracker = self.context.statusTracker()
            stages = [tracker.getStageInfo(stage) for stage in tracker.getActiveStageIds()]
        except Exception:  # noqa: BLE001 - py4j's or a closed context's errors alike: the context is stopping, and the bar is cosmetic
            return ""
        active = [stage for stage in stages if stage is not None]
        if not active:
            return ""
        done = sum(stage.numCompletedTasks for stage in active)
        return f" (tasks {done}/{sum(stage.numTasks for stage in active)})"


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Send this process's standard error (file descriptor 2) to ``path``
    while the block runs. The JVM Spark starts inherits it, so log4j's lines
    land in the file for the whole job, while the progress bar and the
    summary (standard output) stay on the terminal. Python's own errors are
    printed after the block, on the real standard error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with path.open("ab") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


#: The figures printed at the end, in the order an operator reads them (the rest is in the dashboard).
HEADLINE = [
    "sessions",
    "sessions_connected",
    *[f"status_{status.value.lower()}" for status in SEVERITY],
    "worst_lag_entries",
    "worst_lag_ms",
    "p99_last_5min_ms",
    "p99_ms",
    "blocked_documents",
    "groups_behind",
    "events",
    "span_s",
    "bucket_s",
    "corrupt_lines",
    "other_version_lines",
    "dropped_events",
]


def summary_table(summary: dict[str, Any], out: str) -> RichTable:
    """The headline figures, as the job returned them, with human labels."""
    from yrelay.spark_analytics.dashboard import SUMMARY_LABELS

    table = RichTable(title=f"yrelay analyze: {summary.get('events', 0):,} events")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name in HEADLINE:
        value = summary.get(name)
        shown = "-" if value is None else f"{value:,.3f}" if isinstance(value, float) else f"{value:,}"
        table.add_row(SUMMARY_LABELS.get(name, name), shown)
    return table
