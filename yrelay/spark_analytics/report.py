"""What ``yrelay analyze`` shows in the terminal: progress while it runs, a summary after.

The progress bar counts the job's steps (reading, one per table, the
dashboard); its description names the step and, refreshed twice a second
from Spark's status tracker, the tasks done in the stages running now, so
a long step visibly moves.
"""

from __future__ import annotations

import threading
from typing import Any

from pyspark import SparkContext
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table as RichTable

POLL_SECONDS = 0.5


class JobProgress:
    """A rich progress bar for :func:`yrelay.spark_analytics.job.run` (pass :meth:`step` as ``on_step``)."""

    def __init__(self, context: SparkContext, console: Console | None = None):
        self.context = context
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=console)
        self.task = self.progress.add_task("starting", total=1)
        self.step_name = "starting"
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="yrelay-analyze-progress", daemon=True)

    def __enter__(self) -> "JobProgress":
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
        try:
            tracker = self.context.statusTracker()
            stages = [tracker.getStageInfo(stage) for stage in tracker.getActiveStageIds()]
        except Exception:  # the context is stopping; the bar is cosmetic
            return ""
        stages = [stage for stage in stages if stage is not None]
        if not stages:
            return ""
        done = sum(stage.numCompletedTasks for stage in stages)
        return f" (tasks {done}/{sum(stage.numTasks for stage in stages)})"


def summary_table(summary: dict[str, Any], out: str) -> RichTable:
    """The headline figures, as the job returned them."""
    table = RichTable(title=f"yrelay analyze: tables and dashboard in {out}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, value in summary.items():
        shown = "-" if value is None else f"{value:,.3f}" if isinstance(value, float) else f"{value:,}"
        table.add_row(name, shown)
    return table
