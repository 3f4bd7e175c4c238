"""Per-document traffic and GC figures, resyncs by reason, events over time.

Throughput is averaged over the whole log's span (first to last event of
any kind), not over each document's own active time, so documents compare
on one clock: ``appends_per_s = appends / span_s``.

Trim efficiency is entries removed by trims / entries appended, both as
the log saw them. The stream length is the ``stream_length`` of the
document's last ``trim`` plus the appends logged after that trim (an
estimate of now, exact if nothing else trimmed); documents never trimmed
have null.

Every figure but the last trim comes from one hash aggregation over the
events (numeric buffers only, so Spark never sorts the whole log for it);
the last trim is looked up among the few ``trim`` events.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from yrelay.spark_analytics.lag import appends, is_new_entry
from yrelay.spark_analytics.schema import EventType, time_bucket

DOCUMENT_COLUMNS = [
    "doc",
    "appends",
    "bytes",
    "appends_per_s",
    "bytes_per_s",
    "deliveries",
    "resends",
    "resend_ratio",
    "evictions",
    "resyncs",
    "trims",
    "trimmed",
    "trim_efficiency",
    "stream_length",
    "last_trim_ts",
]


def _count(kind: EventType) -> Column:
    return F.sum((F.col("type") == str(kind)).cast("long"))


def _ratio(numerator: str, denominator: str) -> Column:
    """A ratio that is null, not an error (Spark 4 is ANSI), when nothing was counted."""
    return F.try_divide(F.col(numerator).cast("double"), F.col(denominator).cast("double"))


def document_figures(events: DataFrame, span_ms: int) -> DataFrame:
    """One row per document that had any event."""
    is_trim = F.col("type") == str(EventType.TRIM)
    activity = (
        events.filter(F.col("doc").isNotNull())
        .groupBy("doc")
        .agg(
            F.sum(is_new_entry().cast("long")).alias("appends"),
            F.sum(F.when(is_new_entry(), F.coalesce("bytes", F.lit(0))).otherwise(0)).alias("bytes"),
            _count(EventType.DELIVER).alias("deliveries"),
            _count(EventType.RESEND).alias("resends"),
            _count(EventType.EVICT).alias("evictions"),
            _count(EventType.RESYNC).alias("resyncs"),
            _count(EventType.TRIM).alias("trims"),
            F.sum(F.when(is_trim, F.coalesce("entries", F.lit(0))).otherwise(0)).alias("trimmed"),
        )
    )
    last_trim = _last_trims(events)
    span_s = max(span_ms, 1) / 1000
    return (
        activity.join(F.broadcast(last_trim), "doc", "left")
        .join(_appends_since(appends(events), last_trim), "doc", "left")
        .withColumns(
            {
                "appends_per_s": F.col("appends") / F.lit(span_s),
                "bytes_per_s": F.col("bytes") / F.lit(span_s),
                "resend_ratio": _ratio("resends", "deliveries"),
                "trim_efficiency": _ratio("trimmed", "appends"),
                "stream_length": F.col("trim_length") + F.coalesce("since_trim", F.lit(0)),
            }
        )
        .select(*DOCUMENT_COLUMNS)
    )


def _last_trims(events: DataFrame) -> DataFrame:
    """Per trimmed document: the time and ``stream_length`` of its last trim (ties: highest offset)."""
    last = F.max_by(F.struct("ts", "stream_length"), F.struct("ts", "offset_score"))
    return (
        events.filter(F.col("type") == str(EventType.TRIM))
        .groupBy("doc")
        .agg(last.alias("last"))
        .select("doc", F.col("last.ts").alias("last_trim_ts"), F.col("last.stream_length").alias("trim_length"))
    )


def _appends_since(appended: DataFrame, last_trim: DataFrame) -> DataFrame:
    return (
        appended.join(F.broadcast(last_trim.select("doc", "last_trim_ts")), "doc")
        .groupBy("doc")
        .agg(F.sum((F.col("ts") > F.col("last_trim_ts")).cast("long")).alias("since_trim"))
    )


def resyncs_by_reason(events: DataFrame) -> DataFrame:
    return (
        events.filter(F.col("type") == str(EventType.RESYNC))
        .groupBy(F.coalesce("reason", F.lit("unknown")).alias("reason"))
        .agg(F.count(F.lit(1)).alias("resyncs"))
    )


def events_over_time(events: DataFrame, bucket_ms: int) -> DataFrame:
    """Events per time bucket and type (evictions, resends, ... over time)."""
    return events.groupBy(time_bucket("ts", bucket_ms).alias("bucket"), "type").agg(F.count(F.lit(1)).alias("events"))
