"""One call reports what happened, and every consumer hears it.

The server reports connects, appends, deliveries, acks, resends, resyncs,
evictions, snapshots and trims with ``events.emit(type, doc, session,
**fields)`` (the types and fields: docs/events.md). :class:`Events` hands
each call to its sinks in order: the event log (:mod:`yrelay.observability.eventlog`)
and the Prometheus metrics (:mod:`yrelay.app.metrics`). A sink must never block
or raise.
"""

from __future__ import annotations

from typing import Any, Protocol

from yrelay.observability.eventlog import EventLog


class EventSink(Protocol):
    def emit(self, type: str, doc: str | None = None, session: str | None = None, **fields: Any) -> None: ...


class Events:
    """The event log plus any other sinks, behind the event log's ``emit``."""

    def __init__(self, log: EventLog, *sinks: EventSink):
        self.log = log
        self._sinks: tuple[EventSink, ...] = (log, *sinks)

    def emit(self, type: str, doc: str | None = None, session: str | None = None, **fields: Any) -> None:
        for sink in self._sinks:
            sink.emit(type, doc, session, **fields)

    def stop(self) -> None:
        """Flush and close the event log (the other sinks hold no resources)."""
        self.log.stop()
