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
    """A session's health, after Burrow's consumer statuses (rules: status.py)."""

    OK = "OK"
    WARN = "WARN"
    STALL = "STALL"
    STOP = "STOP"
    REWIND = "REWIND"
    ERR = "ERR"
