"""The names of what ``yrelay analyze`` writes, and the statuses it assigns.

Pure Python (no pyspark), so the dashboard and tests can read the output
without Spark. Each table is one Parquet directory under ``--out``;
docs/operations.md#analytics lists their columns.
"""

from __future__ import annotations

from enum import StrEnum


class Table(StrEnum):
    """One Parquet directory under the output directory each."""

    SUMMARY = "summary"  # one row: the headline figures of the whole log
    LAG = "lag"  # one row per ack: lag in entries and ms
    LAG_OVER_TIME = "lag_over_time"  # last lag per doc, session and time bucket
    LAG_TIMELINE = "lag_timeline"  # lag at the end of every bucket a session was there, acking or not
    STATUS = "status"  # Burrow-style status per doc and session at the end of the log
    ACK_LATENCY = "ack_latency"  # deliver -> ack percentiles, all documents and per document
    LATENCY_HISTOGRAM = "latency_histogram"  # deliveries per latency bin
    DOCUMENTS = "documents"  # per document: throughput, resends, evictions, resyncs, trims
    RESYNCS = "resyncs"  # resyncs by reason
    EVENTS_OVER_TIME = "events_over_time"  # events per type and time bucket
    TOP_LAGGING = "top_lagging"  # the sessions furthest behind at the end of the log
    HOTTEST_DOCUMENTS = "hottest_documents"  # the documents with most appends
    GROUP_LAG = "group_lag"  # one row per consumer group ack: lag in entries and ms
    GROUPS = "groups"  # per consumer group: acks, worst and p95 lag, lag at the end of the log
    CURRENT_LAG = "current_lag"  # with --redis-url: every tracked session's lag now
    STREAMS = "streams"  # with --redis-url: every stream's length now


class Status(StrEnum):
    """A session's health, after Burrow's consumer statuses (rules: status.py),
    plus the two ends of a session that disconnected and did not come back."""

    OK = "OK"
    WARN = "WARN"
    STALL = "STALL"
    STOP = "STOP"
    REWIND = "REWIND"
    ERR = "ERR"
    LEFT = "LEFT"  # disconnected with nothing unacked (whatever GC did later)
    LEFT_UNACKED = "LEFT_UNACKED"  # disconnected with deliveries it never acked, and never came back


#: What an operator reads for each status, worst first: failed, silent while
#: behind, stuck, going back, not catching up; then sessions that left (with
#: unacked entries first), then healthy ones.
STATUS_LABELS = {
    Status.ERR: "ERR: evicted or told to resync, not acked since",
    Status.STOP: "STOP: connected, stopped acking while behind",
    Status.STALL: "STALL: acks without moving",
    Status.REWIND: "REWIND: went back",
    Status.WARN: "WARN: behind, not catching up",
    Status.LEFT_UNACKED: "LEFT_UNACKED: left with unacked deliveries",
    Status.LEFT: "LEFT: left with everything acked",
    Status.OK: "OK",
}
#: The statuses, worst first (:data:`STATUS_LABELS`'s order).
SEVERITY = list(STATUS_LABELS)
