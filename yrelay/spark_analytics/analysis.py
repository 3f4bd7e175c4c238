"""Every table of ``yrelay analyze``, from one parsed event log.

:class:`Analysis` names each output table and computes it on demand, once:
tables that others are built from (lag per ack, statuses, latencies,
documents) are cached the first time they are asked for, so writing all
tables reads the log's cache a handful of times, not once per table. The
module that computes a figure says exactly how (lag.py, status.py,
latency.py, documents.py, current.py); this one only composes them and
builds the one-row summary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, IntegerType, LongType, StructField, StructType

from yrelay.spark_analytics.current import current_lag, stream_lengths
from yrelay.spark_analytics.documents import document_figures, events_over_time, resyncs_by_reason
from yrelay.spark_analytics.events import EventLog
from yrelay.spark_analytics.lag import (
    GROUP_LAG_COLUMNS,
    LAG_COLUMNS,
    ack_lag,
    document_heads,
    group_ack_lag,
    group_lag_summary,
    lag_over_time,
    lag_timeline,
    own_appends,
)
from yrelay.spark_analytics.latency import delivery_latency, latency_histogram, latency_summary
from yrelay.spark_analytics.schema import EventType
from yrelay.spark_analytics.sessions import session_presence
from yrelay.spark_analytics.status import session_status
from yrelay.spark_analytics.tables import Status, Table

#: Bucket widths (s) the automatic choice picks from: the smallest that cuts
#: the log's span into at most :data:`MAX_BUCKETS` buckets.
BUCKET_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
MAX_BUCKETS = 120
#: The "now" of the headline figures: the last 5 minutes of the log.
RECENT_MS = 5 * 60 * 1000


def bucket_for(span_ms: int) -> int:
    """Seconds per time bucket for a log spanning ``span_ms``: enough points
    to see a trend (a 6-minute run gets 5 s buckets, a day 15 min ones), few
    enough to keep the charts and the lag timeline small."""
    for step in BUCKET_STEPS:
        if span_ms <= step * 1000 * MAX_BUCKETS:
            return step
    return -(-span_ms // (1000 * MAX_BUCKETS))


@dataclass(frozen=True)
class Options:
    bucket_seconds: int | None = None  # width of the time buckets (None: chosen from the log's span)
    window: int = 10  # acks in a session's status window
    top: int = 20  # rows of top_lagging and hottest_documents


#: The options of an :class:`Analysis` when none are given (frozen: shared safely).
DEFAULT_OPTIONS = Options()


@dataclass(frozen=True)
class Bounds:
    """The log's first and last event (ms) and the events its writers lost."""

    start_ts: int
    end_ts: int
    dropped_events: int

    @property
    def span_ms(self) -> int:
        return self.end_ts - self.start_ts


class Analysis:
    """The tables of one event log (and, optionally, of Redis now)."""

    def __init__(
        self,
        spark: SparkSession,
        log: EventLog,
        options: Options = DEFAULT_OPTIONS,
        redis: tuple[DataFrame, DataFrame] | None = None,
    ):
        self.spark = spark
        self.log = log
        self.options = options
        self.redis = redis
        self._cached: list[DataFrame] = []

    def steps(self) -> list[tuple[Table, Callable[[], DataFrame]]]:
        """Every table, in an order where the cached ones come before their users."""
        steps: list[tuple[Table, Callable[[], DataFrame]]] = [
            (Table.LAG, lambda: self.lag.select(*LAG_COLUMNS)),
            (Table.LAG_OVER_TIME, lambda: lag_over_time(self.lag, self.bucket_ms)),
            (
                Table.LAG_TIMELINE,
                lambda: lag_timeline(self.lag, self.log.events, self.presence, self.bounds.end_ts, self.bucket_ms),
            ),
            (Table.STATUS, lambda: self.status),
            (Table.ACK_LATENCY, lambda: self.latency_summary),
            (Table.LATENCY_HISTOGRAM, lambda: latency_histogram(self.latency)),
            (Table.DOCUMENTS, lambda: self.documents),
            (Table.RESYNCS, lambda: resyncs_by_reason(self.log.events)),
            (Table.EVENTS_OVER_TIME, lambda: events_over_time(self.log.events, self.bucket_ms)),
            (Table.TOP_LAGGING, self.top_lagging),
            (Table.HOTTEST_DOCUMENTS, self.hottest_documents),
            (Table.GROUP_LAG, lambda: self.group_lag.select(*GROUP_LAG_COLUMNS)),
            (Table.GROUPS, lambda: self.groups),
        ]
        if self.redis is not None:
            entries, tracker = self.redis
            steps += [
                (Table.CURRENT_LAG, lambda: current_lag(tracker)),
                (Table.STREAMS, lambda: stream_lengths(entries)),
            ]
        return steps + [(Table.SUMMARY, self.summary_table)]

    @cached_property
    def bucket_seconds(self) -> int:
        return self.options.bucket_seconds or bucket_for(self.bounds.span_ms)

    @property
    def bucket_ms(self) -> int:
        return self.bucket_seconds * 1000

    def _keep(self, frame: DataFrame) -> DataFrame:
        self._cached.append(frame.persist())
        return frame

    def release(self) -> None:
        for frame in self._cached:
            frame.unpersist()
        self.log.release()

    # ------------------------------------------------------------ shared parts

    @cached_property
    def bounds(self) -> Bounds:
        dropped = F.when(F.col("type") == str(EventType.DROPPED), F.coalesce("entries", F.lit(0)))
        row = self.log.events.agg(F.min("ts"), F.max("ts"), F.sum(dropped)).first()
        start, end, lost = row if row is not None else (None, None, None)
        return Bounds(start or 0, end or 0, lost or 0)

    @cached_property
    def lag(self) -> DataFrame:
        return self._keep(ack_lag(self.log.events))

    @cached_property
    def group_lag(self) -> DataFrame:
        return self._keep(group_ack_lag(self.log.events))

    @cached_property
    def groups(self) -> DataFrame:
        return self._keep(group_lag_summary(self.group_lag))

    @cached_property
    def presence(self) -> DataFrame:
        return self._keep(session_presence(self.log.events))

    @cached_property
    def status(self) -> DataFrame:
        heads, own = document_heads(self.log.events), own_appends(self.log.events)
        return self._keep(
            session_status(
                self.lag, self.log.events, heads, own, self.presence, self.bounds.end_ts, self.options.window
            )
        )

    @cached_property
    def latency(self) -> DataFrame:
        return self._keep(delivery_latency(self.log.events))

    @cached_property
    def latency_summary(self) -> DataFrame:
        return self._keep(latency_summary(self.latency))

    @cached_property
    def documents(self) -> DataFrame:
        return self._keep(document_figures(self.log.events, self.bounds.span_ms))

    # ------------------------------------------------------------ small tables

    def top_lagging(self) -> DataFrame:
        """The sessions furthest behind at the end of the log (ms, then entries); lag 0 is not listed,
        nor a session that left (it has no current lag)."""
        behind = (F.col("current_lag_ms") > 0) | (F.col("current_lag_entries") > 0)
        ranked = self.status.filter(behind).orderBy(
            F.col("current_lag_ms").desc(), F.col("current_lag_entries").desc(), "doc", "session"
        )
        return self._ranked(ranked)

    def hottest_documents(self) -> DataFrame:
        """The documents with most appends (then bytes)."""
        return self._ranked(self.documents.orderBy(F.col("appends").desc(), F.col("bytes").desc(), "doc"))

    def _ranked(self, ordered: DataFrame) -> DataFrame:
        """The first ``top`` rows with a 1-based ``rank`` (few rows: built on the driver)."""
        rows = ordered.limit(self.options.top).collect()
        schema = StructType([StructField("rank", IntegerType(), False), *ordered.schema.fields])
        return self.spark.createDataFrame([(rank, *row) for rank, row in enumerate(rows, 1)], schema)

    @cached_property
    def summary(self) -> dict[str, Any]:
        """The headline figures of the whole log, as one dict."""
        documents = self.documents.agg(
            *[
                F.sum(name).alias(name)
                for name in ("appends", "bytes", "deliveries", "resends", "evictions", "resyncs", "trimmed")
            ],
            F.count(F.lit(1)).alias("documents"),
        ).first()
        assert documents is not None  # an aggregate without grouping has one row
        overall = self.latency_summary.filter(F.col("doc").isNull()).first()
        statuses = {row["status"]: row["count"] for row in self.status.groupBy("status").count().collect()}
        totals = {name: value or 0 for name, value in documents.asDict().items()}
        groups = self.groups.agg(F.count(F.lit(1)), F.max("last_lag_ms")).first()
        return {
            "start_ts": self.bounds.start_ts,
            "end_ts": self.bounds.end_ts,
            "span_s": self.bounds.span_ms / 1000,
            "events": self.log.valid_lines,
            "corrupt_lines": self.log.corrupt_lines,
            "other_version_lines": self.log.other_version_lines,
            "dropped_events": self.bounds.dropped_events,
            **totals,
            "sessions": sum(statuses.values()),
            "consumer_groups": groups[0] if groups else 0,
            "worst_group_lag_ms": (groups[1] if groups else None) or 0,  # 0 without groups: a long column
            "acked_deliveries": overall["acked"] if overall else 0,
            "resend_ratio": totals["resends"] / totals["deliveries"] if totals["deliveries"] else None,
            "trim_efficiency": totals["trimmed"] / totals["appends"] if totals["appends"] else None,
            **{name: overall[name] if overall else None for name in ("p50_ms", "p95_ms", "p99_ms", "max_ms")},
            **{f"status_{status.value.lower()}": statuses.get(status.value, 0) for status in Status},
            **self.headline,
        }

    @cached_property
    def headline(self) -> dict[str, Any]:
        """What an operator reads first: the worst lag now (sessions still
        connected), p99 ack latency over the log's last 5 minutes, documents
        with refused (blocked) updates, consumer groups behind, and the
        bucket the charts use."""
        connected = self.status.filter(F.col("left_ts").isNull())
        worst = connected.agg(F.max("current_lag_entries"), F.max("current_lag_ms"), F.count(F.lit(1))).first()
        recent = self.latency.filter(F.col("ts") >= self.bounds.end_ts - RECENT_MS)
        p99 = recent.agg(F.percentile("latency_ms", 0.99)).first()
        blocked = self.log.events.filter(F.col("type") == str(EventType.REFUSE)).agg(F.countDistinct("doc")).first()
        behind = self.groups.filter((F.col("last_lag_entries") > 0) | (F.col("last_lag_ms") > 0)).count()
        return {
            "bucket_s": self.bucket_seconds,
            "sessions_connected": worst[2] if worst else 0,
            "worst_lag_entries": (worst[0] if worst else None) or 0,
            "worst_lag_ms": (worst[1] if worst else None) or 0,
            "p99_last_5min_ms": p99[0] if p99 else None,
            "blocked_documents": (blocked[0] if blocked else None) or 0,
            "groups_behind": behind,
        }

    def summary_table(self) -> DataFrame:
        return self.spark.createDataFrame([self.summary], schema=_summary_schema(self.summary))


#: Summary columns that are fractions or averages; every other one is a count or ms since the epoch.
_DOUBLE_FIELDS = {"span_s", "resend_ratio", "trim_efficiency", "p50_ms", "p95_ms", "p99_ms", "p99_last_5min_ms"}


def _summary_schema(summary: dict[str, Any]) -> StructType:
    return StructType(
        [StructField(name, DoubleType() if name in _DOUBLE_FIELDS else LongType(), True) for name in summary]
    )
