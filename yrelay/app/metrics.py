"""The Prometheus metrics of one server, in a registry of its own.

Three kinds of source, cheapest first (every metric: docs/operations.md):

- **Events.** :class:`Metrics` is a sink of :class:`yrelay.observability.events.Events`:
  the same ``emit`` calls that write the event log move the counters and
  histograms (one dict lookup and a counter increment per event). Nothing is
  labelled by document or session, so the number of series stays fixed.
- **Direct calls**, where no event exists: rejected frames by error code,
  append latency (frame received to ``appended`` sent), GC passes.
- **At scrape time**, from the server's own state (open subscriptions,
  documents with subscribers, unacked entries, presence, event log drops)
  and two Redis counts; the hot path pays nothing for these.

Each app builds its own :class:`Metrics` (never the global default
registry), so several servers in one process do not collide.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from yrelay import __version__
from yrelay.consumers.stats import GroupStats, group_stats
from yrelay.consumers.webhook_stats import WebhookCollector
from yrelay.observability.loop_metrics import LoopMetrics
from yrelay.protocol import ErrorCode, ResyncReason
from yrelay.storage.listing import registry_counts
from yrelay.tasks import RESTARTS

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from yrelay.gc import PassSummary

log = logging.getLogger(__name__)

#: Seconds: appends and other round trips of a healthy server are milliseconds.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Seconds: from a live delivery (milliseconds) to a catch-up after an hour away.
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0)
GC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONNECTION_BUCKETS = (1.0, 10.0, 60.0, 300.0, 1800.0, 3600.0, 4 * 3600.0, 24 * 3600.0)
EVICTION_MODES = ("relative", "absolute", "operator")
GC_TRIGGERS = ("loop", "ops")
#: The events :class:`Metrics` counts, each by its method of the same name (``_connect``, ...).
COUNTED_EVENTS = (
    "connect",
    "disconnect",
    "append",
    "deliver",
    "ack",
    "resend",
    "resync",
    "evict",
    "snapshot",
    "trim",
    "consumer_evict",
)


@dataclass(frozen=True)
class ServerFigures:
    """What a scrape reads of a running server's own state, this process only."""

    #: Documents with a subscriber (a fan-out feed).
    documents_active: int
    #: Subscriptions (connection x document).
    subscriptions_open: int
    #: Entries sent to the subscribers and not acked yet.
    unacked_entries: int
    #: Presence members (connection x document).
    presence_members: int
    #: Presence (awareness) updates received from clients.
    presence_updates: int
    #: Awareness frames queued to local connections.
    presence_frames_relayed: int
    #: Websockets closed (1013) at ``max_receiving_bytes``.
    receiving_closes: int
    #: Bytes of websocket messages being received.
    receiving_bytes: int
    #: Events the event log could not write.
    event_log_dropped_events: int


class ServerState(Protocol):
    """A server whose state a scrape reports (:class:`yrelay.app.context.ServerContext`):
    the metrics name the figures they need, so they never import the server
    that imports them."""

    def scrape_figures(self) -> ServerFigures: ...


def _ms(stream_id: str) -> int:
    """The millisecond part of a stream id ``"<ms>-<seq>"``."""
    return int(stream_id.partition("-")[0])


class Metrics:
    """Counters, gauges and histograms of one server; an event sink."""

    def __init__(self, *, process_metrics: bool = True):
        self.registry = registry = CollectorRegistry()
        counter, gauge = partial(Counter, registry=registry), partial(Gauge, registry=registry)
        histogram = partial(Histogram, registry=registry)
        if process_metrics:  # RSS, CPU, open fds; the Python version; Python's GC
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
        gauge("yrelay_build_info", "Version of the running server (always 1).", ["version"]).labels(__version__).set(1)

        self.connections_open = gauge("yrelay_connections_open", "Websockets past their hello.")
        connections = counter(
            "yrelay_connections", "Handshakes answered, by whether the session was resumed.", ["resumed"]
        )
        self._connections = {flag: connections.labels(str(flag).lower()) for flag in (True, False)}
        self.connection_seconds = histogram(
            "yrelay_connection_duration_seconds", "How long websockets stayed open.", buckets=CONNECTION_BUCKETS
        )

        appends = counter(
            "yrelay_appends", "Updates acked (appended sent), by whether they were duplicates.", ["duplicate"]
        )
        self._appends = {flag: appends.labels(str(flag).lower()) for flag in (True, False)}
        self.appended_bytes = counter("yrelay_appended_bytes", "Update bytes acked (duplicates too).")
        self._append_latency = histogram(
            "yrelay_append_latency_seconds",
            "From an update frame received to its appended frame sent.",
            buckets=LATENCY_BUCKETS,
        )

        # Moved per delivery and per ack: lock-free (yrelay/observability/loop_metrics.py), same exposition.
        loop = LoopMetrics(registry)
        self.deliver_frames = loop.counter("yrelay_deliver_frames", "Deliver frames sent.")
        self.deliveries = loop.counter("yrelay_deliveries", "Entries sent in deliver frames (resent ones too).")
        self.delivered_bytes = loop.counter("yrelay_delivered_bytes", "Update bytes sent in deliver frames.")
        self.delivery_lag = loop.histogram(
            "yrelay_delivery_lag_seconds",
            "Per deliver frame: from the newest entry's append (its stream id time) to the frame being sent.",
            LAG_BUCKETS,
        )
        self.acks = loop.counter("yrelay_acks", "Ack frames received.")
        self.ack_lag = loop.histogram(
            "yrelay_ack_lag_seconds",
            "Per ack: the newest entry this process knows of the document minus the acked entry, in time.",
            LAG_BUCKETS,
        )
        self.resends = counter("yrelay_resends", "Rewinds: unacked entries sent again from the acked offset.")
        self.resent_entries = counter("yrelay_resent_entries", "Entries unacked when a resend rewound.")
        resyncs = counter("yrelay_resyncs", "resync_required frames sent, by reason.", ["reason"])
        self._resyncs = {reason.value: resyncs.labels(reason.value) for reason in ResyncReason}
        evictions = counter(
            "yrelay_evictions", "Sessions dropped from a tracker, by rule (GC) or by an operator.", ["mode"]
        )
        self._evictions = {mode: evictions.labels(mode) for mode in EVICTION_MODES}
        rejected = counter("yrelay_rejected_frames", "Error frames sent, by code.", ["code"])
        self._rejected = {code.value: rejected.labels(code.value) for code in ErrorCode}

        self._throttled = counter(
            "yrelay_throttled_seconds",
            "Seconds websockets were held back (read more slowly) by a rate, by limit.",
            ["limit"],
        )
        self._flooded = counter(
            "yrelay_flood_closes",
            "Websockets closed with 4429: held back by a rate for too long, by the limit that held them last.",
            ["limit"],
        )
        self.gc_runs = counter(
            "yrelay_gc_runs", "GC passes completed, by trigger (the loop, or POST /ops/gc).", ["trigger"]
        )
        self.gc_seconds = histogram("yrelay_gc_pass_seconds", "Duration of GC passes.", ["trigger"], buckets=GC_BUCKETS)
        self.gc_documents = counter("yrelay_gc_documents", "Documents collected by GC passes.")
        self.gc_errors = counter("yrelay_gc_errors", "Documents a GC pass failed to collect.")
        self.gc_last = gauge("yrelay_gc_last_pass_timestamp_seconds", "When the last GC pass ended (Unix time).")
        self.gc_snapshots = counter("yrelay_gc_snapshots", "Snapshots GC stored.")
        self.gc_folded = counter("yrelay_gc_folded_entries", "Entries GC folded into snapshots.")
        self.gc_trimmed = counter("yrelay_gc_trimmed_entries", "Entries GC removed from streams.")
        for trigger in GC_TRIGGERS:
            self.gc_runs.labels(trigger)
            self.gc_seconds.labels(trigger)

        self.documents = gauge("yrelay_documents", "Documents ever appended to (the Redis registry), at scrape time.")
        self.gc_due = gauge("yrelay_gc_due_documents", "Documents waiting for GC, at scrape time.")
        self.redis_up = gauge("yrelay_redis_up", "1 if Redis answered the last scrape's counts, else 0.")

        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            event: getattr(self, f"_{event}") for event in COUNTED_EVENTS
        }
        group_evictions = counter(
            "yrelay_consumer_group_evictions", "Consumer groups GC evicted from a document, by rule.", ["mode"]
        )
        self._group_evictions = {mode: group_evictions.labels(mode) for mode in ("abandoned", "live")}
        self._failed = False
        self._groups = _GroupState()
        registry.register(self._groups)
        self._webhooks = WebhookCollector()
        registry.register(self._webhooks)
        registry.register(_TaskRestarts())

    # --------------------------------------------------------- event sink

    def emit(self, type: str, doc: str | None = None, session: str | None = None, **fields: Any) -> None:
        handler = self._handlers.get(type)
        if handler is None:
            return
        try:
            handler(fields)
        except Exception:  # a metric must never break delivery
            if not self._failed:
                self._failed = True
                log.exception("metrics: could not count a %s event", type)

    def _connect(self, fields: dict[str, Any]) -> None:
        self.connections_open.inc()
        self._connections[bool(fields.get("resumed"))].inc()

    def _disconnect(self, fields: dict[str, Any]) -> None:
        self.connections_open.dec()
        self.connection_seconds.observe(fields["duration_ms"] / 1000)

    def _append(self, fields: dict[str, Any]) -> None:
        self._appends[bool(fields["duplicate"])].inc()
        self.appended_bytes.inc(fields["bytes"])

    def _deliver(self, fields: dict[str, Any]) -> None:
        self.deliver_frames.inc()
        self.deliveries.inc(fields["entries"])
        self.delivered_bytes.inc(fields["bytes"])
        self.delivery_lag.observe(max(0.0, time.time() - _ms(fields["last"]) / 1000))

    def _ack(self, fields: dict[str, Any]) -> None:
        self.acks.inc()
        self.ack_lag.observe(max(0, _ms(fields["head"]) - _ms(fields["offset"])) / 1000)

    def _resend(self, fields: dict[str, Any]) -> None:
        self.resends.inc()
        self.resent_entries.inc(fields["entries"])

    def _resync(self, fields: dict[str, Any]) -> None:
        self._resyncs[fields["reason"]].inc()

    def _evict(self, fields: dict[str, Any]) -> None:
        self._evictions[fields["mode"]].inc()

    def _snapshot(self, fields: dict[str, Any]) -> None:
        self.gc_snapshots.inc()
        self.gc_folded.inc(fields["entries"])

    def _trim(self, fields: dict[str, Any]) -> None:
        self.gc_trimmed.inc(fields["entries"])

    def _consumer_evict(self, fields: dict[str, Any]) -> None:
        self._group_evictions[fields["mode"]].inc()

    # ------------------------------------------------------- direct calls

    def appended(self, seconds: float) -> None:
        """An update was acked ``seconds`` after its frame arrived."""
        self._append_latency.observe(seconds)

    def rejected(self, code: str) -> None:
        """An error frame with ``code`` was sent."""
        counter = self._rejected.get(code)
        if counter is not None:
            counter.inc()

    def throttled(self, limit: str, seconds: float) -> None:
        """A websocket waits ``seconds`` for ``limit`` (yrelay/app/core/pacing.py)."""
        self._throttled.labels(limit).inc(seconds)

    def flooded(self, limit: str) -> None:
        """A websocket is closed with 4429, last held back by ``limit``."""
        self._flooded.labels(limit).inc()

    def gc_pass(self, summary: PassSummary, trigger: str = "loop") -> None:
        self.gc_runs.labels(trigger).inc()
        self.gc_seconds.labels(trigger).observe(summary.seconds)
        self.gc_documents.inc(summary.documents)
        self.gc_errors.inc(summary.errors)
        self.gc_last.set(time.time())

    # -------------------------------------------------------- scrape time

    def watch(self, server: ServerState) -> None:
        """Also report ``server``'s state (read at every scrape)."""
        self.registry.register(_ServerState(server))

    async def refresh(self, redis: Redis) -> None:
        """Read the counts that live in Redis (before rendering a scrape)."""
        try:
            documents, due = await registry_counts(redis)
        except Exception as exc:  # noqa: BLE001 - Redis failing in any way is redis_up 0, never a failed scrape
            log.debug("metrics: Redis counts not read: %s", exc)
            self.redis_up.set(0)
            return
        self.documents.set(documents)
        self.gc_due.set(due)
        self.redis_up.set(1)
        try:
            self._groups.stats = await group_stats(redis)
            await self._webhooks.refresh(redis, [stats.group for stats in self._groups.stats])
        except Exception as exc:  # noqa: BLE001 - the rest of the scrape stands
            log.debug("metrics: consumer groups not read: %s", exc)

    def render(self) -> bytes:
        """The Prometheus text format."""
        return generate_latest(self.registry)


def _count_nothing(self: Metrics, *args: Any, **kwargs: Any) -> None:
    """What each sink and direct call of :class:`NullMetrics` does."""


class NullMetrics(Metrics):
    """Metrics switched off (``YRELAY_METRICS=0``, for benchmarks): counts nothing."""

    def __init__(self) -> None:
        super().__init__(process_metrics=False)

    emit = appended = rejected = throttled = flooded = gc_pass = watch = _count_nothing


class _TaskRestarts(Collector):
    """Background loops restarted after a crash (:class:`yrelay.tasks.BackgroundTask`),
    by kind of loop; counted per process (every app of the process reports them)."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        family = CounterMetricFamily(
            "yrelay_background_restarts", "Background loops restarted after they crashed, by loop.", labels=["task"]
        )
        for kind, count in sorted(RESTARTS.items()):
            family.add_metric([kind], count)
        yield family


class _GroupState(Collector):
    """Consumer groups (docs/consumers.md), as read by the last refresh."""

    def __init__(self) -> None:
        self.stats: list[GroupStats] = []

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        families = [  # each named yrelay_consumer_group_<the GroupStats attribute>
            (GaugeMetricFamily, "members", "Live members of a consumer group."),
            (GaugeMetricFamily, "unacked_entries", "Entries handed to a group's members and not acked yet."),
            (GaugeMetricFamily, "lag_seconds", "Age of the oldest entry a group's members hold unacked."),
            (CounterMetricFamily, "rebalances", "Assignments a group's leaders wrote."),
            (CounterMetricFamily, "takeovers", "Documents moved from a member that lapsed or left."),
            (CounterMetricFamily, "elections", "Leader leases taken."),
            (
                CounterMetricFamily,
                "redelivered",
                "Entries read again after a takeover that the previous owner had read and not acked.",
            ),
            (CounterMetricFamily, "handovers", "Documents moved in two steps between live members (no duplicates)."),
        ]
        for kind, attribute, doc in families:
            family = kind(f"yrelay_consumer_group_{attribute}", doc, labels=["group"])
            for stats in self.stats:
                family.add_metric([stats.group], getattr(stats, attribute))
            yield family


class _ServerState(Collector):
    """Figures read from the server's state when scraped."""

    def __init__(self, server: ServerState):
        self.server = server

    def describe(self) -> list[Any]:
        return []  # unchecked: collect() needs a running server

    def collect(self) -> Iterator[Any]:
        figures = self.server.scrape_figures()
        families = [  # each named yrelay_<the ServerFigures attribute>
            (GaugeMetricFamily, "documents_active", "Documents with a subscriber on this process."),
            (GaugeMetricFamily, "subscriptions_open", "Subscriptions (connection x document) on this process."),
            (GaugeMetricFamily, "unacked_entries", "Entries sent to this process's subscribers, not acked yet."),
            (GaugeMetricFamily, "presence_members", "Presence members (connection x document) on this process."),
            (CounterMetricFamily, "presence_updates", "Presence (awareness) updates received from clients."),
            (CounterMetricFamily, "presence_frames_relayed", "Awareness frames queued to local connections."),
            (
                CounterMetricFamily,
                "receiving_closes",
                "Websockets closed (1013) because the messages being received by the process "
                "reached max_receiving_bytes.",
            ),
            (
                GaugeMetricFamily,
                "receiving_bytes",
                "Bytes of websocket messages being received (partial frames, unparsed reads) on this process.",
            ),
            (CounterMetricFamily, "event_log_dropped_events", "Events the event log could not write."),
        ]
        for kind, attribute, doc in families:
            yield kind(f"yrelay_{attribute}", doc, value=getattr(figures, attribute))
