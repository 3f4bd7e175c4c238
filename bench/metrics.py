"""Cost of the Prometheus metrics on the websocket path: the load of
bench/event_log.py through a server with ``YRELAY_METRICS`` on and off
(the event log on in both), alternating, in one run; then the cost of one
``emit`` with and without the metrics sink, in-process.

    .venv/bin/python bench/metrics.py [--writers 4 --readers 4 --updates 1500 --rounds 3]
"""

from __future__ import annotations

import tempfile
import timeit
from pathlib import Path

from event_log import compare, load_arguments

from yrelay.app.metrics import Metrics
from yrelay.observability.eventlog import EventLog
from yrelay.observability.events import Events

CALLS = 200_000


def emit_cost() -> None:
    """Microseconds per emit of a deliver and an append event."""
    with tempfile.TemporaryDirectory() as tmp:
        log = EventLog(Path(tmp), capacity=10 * CALLS)  # not started: the hot path only (deque append)
        rows = []
        for label, events in (("event log", Events(log)), ("event log + metrics", Events(log, Metrics()))):

            def deliver() -> None:
                events.emit(  # noqa: B023 - timed within this iteration
                    "deliver",
                    "doc",
                    "s",
                    first="1700000000000-0",
                    last="1700000000000-3",
                    entries=4,
                    bytes=120,
                    head="1700000000000-3",
                )

            def append() -> None:
                events.emit("append", "doc", "s", offset="1700000000000-0", clock=1, bytes=30, duplicate=False)  # noqa: B023 - timed within this iteration

            for name, call in (("deliver", deliver), ("append", append)):
                log._queue.clear()
                seconds = min(timeit.repeat(call, number=CALLS, repeat=3))
                rows.append((label, name, seconds / CALLS * 1e6))
    print("\n| sinks | event | µs per emit |\n| --- | --- | ---: |")
    for label, name, micros in rows:
        print(f"| {label} | {name} | {micros:.2f} |")


def main() -> None:
    compare("YRELAY_METRICS", "metrics", load_arguments())
    emit_cost()


if __name__ == "__main__":
    main()
