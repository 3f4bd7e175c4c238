"""Lag per ack, per time bucket, and at the end of the log.

An ``ack`` event carries the session's offset and the process's ``head``
at that moment, so every ack is one exact lag measurement:

- lag in entries = the ``append`` events of that document (duplicates not
  counted) whose offset is in ``(offset, head]``;
- lag in ms = head's ms - offset's ms (a score's ms is ``score // 1000``).

Both are clamped at 0 (an offset can pass the head a process knew).

Counting appends in a range is done without a range join: appends and acks
are shuffled once, by document, into one list; sorted by the acks' offsets
(appends by their own, first on ties), a running count of appends gives each
ack the number of appends ``<=`` its offset; sorted again by the acks' heads,
the number ``<=`` its head. The entries lag is the difference. Two sorts of
the same partitions, one shuffle, whatever the number of acks.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .schema import EventType, score_ms, time_bucket

#: Columns of the lag table (one row per ack).
LAG_COLUMNS = ["doc", "session", "ts", "time", "offset", "head", "lag_entries", "lag_ms"]
#: Row kinds in the sorted list: appends sort before acks at the same score.
_APPEND, _ACK = 0, 1
#: An ack's fields an append row leaves null.
_ACK_FIELDS = {"session": "string", "ts": "long", "offset": "string", "head": "string"}


def is_new_entry() -> Column:
    """An ``append`` event that added an entry (not a duplicate, with a valid id)."""
    return (F.col("type") == str(EventType.APPEND)) & ~F.col("duplicate") & F.col("offset_score").isNotNull()


def appends(events: DataFrame) -> DataFrame:
    """New stream entries: ``append`` events that were not duplicates."""
    return events.filter(is_new_entry())


def ack_lag(events: DataFrame, ack: EventType = EventType.ACK, who: str = "session") -> DataFrame:
    """One row per ack with ``lag_entries``, ``lag_ms`` and ``offset_rank``
    (appends of the document at or before the acked offset). ``ack`` and
    ``who``: a consumer group's acks (``consumer_ack``, by ``group``) are
    measured the same way, and keep ``who``'s name as their column."""
    acks = events.filter(
        (F.col("type") == str(ack)) & F.col("offset_score").isNotNull() & F.col("head_score").isNotNull()
    ).select("doc", F.col(who).alias("session"), "ts", "offset", "head", "offset_score", "head_score",
             F.lit(_ACK).alias("kind"))
    entries = appends(events).select(
        "doc", *[F.lit(None).cast(kind).alias(name) for name, kind in _ACK_FIELDS.items()],
        "offset_score", F.col("offset_score").alias("head_score"),
        F.lit(_APPEND).alias("kind"),
    )
    ranked = (
        entries.unionByName(acks)
        .withColumn("offset_rank", _appends_up_to("offset_score"))
        .withColumn("head_rank", _appends_up_to("head_score"))
        .filter(F.col("kind") == _ACK)
    )
    return ranked.select(
        "doc", F.col("session").alias(who), "ts", F.timestamp_millis("ts").alias("time"), "offset", "head",
        F.greatest(F.col("head_rank") - F.col("offset_rank"), F.lit(0)).alias("lag_entries"),
        F.greatest(score_ms("head_score") - score_ms("offset_score"), F.lit(0)).alias("lag_ms"),
        "offset_score", "head_score", "offset_rank",
    )


def _appends_up_to(score: str) -> Column:
    """Appends of the row's document whose score is ``<=`` the row's ``score`` column."""
    order = Window.partitionBy("doc").orderBy(score, "kind").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return F.sum((F.col("kind") == _APPEND).cast("long")).over(order)


def lag_over_time(lag: DataFrame, bucket_ms: int) -> DataFrame:
    """Per doc, session and bucket: the lag of the bucket's last ack, and the number of acks."""
    last = F.max_by(F.struct("lag_entries", "lag_ms", "offset"), F.struct("ts", "offset_score", "head_score"))
    return (
        lag.groupBy("doc", "session", time_bucket("ts", bucket_ms).alias("bucket"))
        .agg(last.alias("last"), F.count(F.lit(1)).alias("acks"))
        .select("doc", "session", "bucket", "last.lag_entries", "last.lag_ms", "last.offset", "acks")
    )


def document_heads(events: DataFrame) -> DataFrame:
    """Per document: appends in the log and the last appended score (its head at the end)."""
    return appends(events).groupBy("doc").agg(
        F.count(F.lit(1)).alias("appended"), F.max("offset_score").alias("end_head_score")
    )


def lag_at_end(last_ack: DataFrame, heads: DataFrame) -> DataFrame:
    """The lag of each session's last ack measured against the end of the log:
    appends after its offset, and the last append's ms minus its offset's ms."""
    joined = last_ack.join(heads, "doc", "left")
    return joined.withColumns({
        "current_lag_entries": F.greatest(F.coalesce(F.col("appended"), F.lit(0)) - F.col("offset_rank"), F.lit(0)),
        "current_lag_ms": F.greatest(
            F.coalesce(score_ms("end_head_score") - score_ms("offset_score"), F.lit(0)), F.lit(0)
        ),
    }).drop("appended", "end_head_score")


#: Columns of the group lag table (one row per group ack).
GROUP_LAG_COLUMNS = ["doc", "group", "ts", "time", "offset", "head", "lag_entries", "lag_ms"]


def group_ack_lag(events: DataFrame) -> DataFrame:
    """One row per ``consumer_ack``: how far the group was behind the
    document's newest entry (the head its member last read) when it acked,
    in entries (appends of the document in the log) and in ms."""
    return ack_lag(events, EventType.CONSUMER_ACK, "group")


def group_lag_summary(group_lag: DataFrame) -> DataFrame:
    """Per group: acks, documents, the lag of the last ack of each document
    summed (entries) and at worst (ms), and the worst and p95 lag over the log."""
    last = group_lag.groupBy("group", "doc").agg(
        F.max_by(F.struct("lag_entries", "lag_ms"), F.struct("ts", "offset_score")).alias("last"))
    ends = last.groupBy("group").agg(F.sum("last.lag_entries").alias("last_lag_entries"),
                                     F.max("last.lag_ms").alias("last_lag_ms"),
                                     F.count(F.lit(1)).alias("documents"))
    over = group_lag.groupBy("group").agg(
        F.count(F.lit(1)).alias("acks"), F.max("lag_ms").alias("max_lag_ms"),
        F.percentile_approx("lag_ms", 0.95).alias("p95_lag_ms"))
    return over.join(ends, "group").orderBy("group")
