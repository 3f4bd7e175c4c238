"""Lag per ack, per time bucket, and at the end of the log.

An ``ack`` event carries the session's offset and the process's ``head``
at that moment, so every ack is one exact lag measurement. It follows the
tracker's rule: a session's own entries never hold it back (the server
never sends a session its own updates, and moves its tracked offset past
them, yrelay/app/core/acks.py):

- lag in entries = the ``append`` events of that document (duplicates not
  counted) whose offset is in ``(offset, head]``, less the session's own;
- lag in ms = head's ms - the ms of the session's *effective* offset: its
  offset, moved past the run of its own appends that directly follows it
  (a score's ms is ``score // 1000``). A writer whose last ack is followed
  by its own appends only is 0 behind, in entries and in ms.

Both are clamped at 0 (an offset can pass the head a process knew).

Counting appends in a range is done without a range join: appends and acks
are shuffled once, by document, into one list; sorted by the acks' offsets
(appends by their own, first on ties), a running count of appends gives each
ack the number of appends ``<=`` its offset; sorted again by the acks' heads,
the number ``<=`` its head. The same two running counts over the session's
own appends (one list per document and session) give the own entries to
take off; a walk in reverse offset order gives each ack the append that
follows its offset, and so the end of a run of its own.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from yrelay.spark_analytics.schema import EventType, score_ms, time_bucket

#: Columns of the lag table (one row per ack).
LAG_COLUMNS = ["doc", "session", "ts", "time", "offset", "head", "lag_entries", "lag_ms"]
#: Row kinds in the sorted list: appends sort before acks at the same score.
_APPEND, _ACK = 0, 1


def is_new_entry() -> Column:
    """An ``append`` event that added an entry (not a duplicate, with a valid id)."""
    return (F.col("type") == str(EventType.APPEND)) & ~F.col("duplicate") & F.col("offset_score").isNotNull()


def appends(events: DataFrame) -> DataFrame:
    """New stream entries: ``append`` events that were not duplicates."""
    return events.filter(is_new_entry())


def ack_lag(events: DataFrame, ack: EventType = EventType.ACK, who: str = "session") -> DataFrame:
    """One row per ack with ``lag_entries``, ``lag_ms``, ``offset_rank``
    (appends of the document at or before the acked offset),
    ``own_offset_rank`` (of them, the session's own) and ``effective_score``
    (the offset moved past its own appends right after it). ``ack`` and
    ``who``: a consumer group's acks (``consumer_ack``, by ``group``) are
    measured the same way, and keep ``who``'s name as their column; a group
    appends nothing, so nothing of it is its own."""
    own = who == "session"
    acks = events.filter(
        (F.col("type") == str(ack)) & F.col("offset_score").isNotNull() & F.col("head_score").isNotNull()
    ).select(
        "doc",
        F.col(who).alias("session"),
        "ts",
        "offset",
        "head",
        "offset_score",
        "head_score",
        F.lit(_ACK).alias("kind"),
    )
    authored = F.col("session") if own else F.lit(None).cast("string")
    entries = _with_run_ends(appends(events).select("doc", authored.alias("session"), "offset_score")).select(
        "doc",
        "session",
        "offset_score",
        F.col("offset_score").alias("head_score"),
        "run_end_score",
        F.lit(_APPEND).alias("kind"),
    )
    ranked = (
        entries.unionByName(acks, allowMissingColumns=True)  # an ack's fields are null in an append row
        .withColumn("offset_rank", _appends_up_to("offset_score"))
        .withColumn("head_rank", _appends_up_to("head_score"))
        .withColumn("own_offset_rank", _appends_up_to("offset_score", own=True))
        .withColumn("own_head_rank", _appends_up_to("head_score", own=True))
        .withColumn("next", _next_append())
        .filter(F.col("kind") == _ACK)
    )
    foreign = (F.col("head_rank") - F.col("offset_rank")) - (F.col("own_head_rank") - F.col("own_offset_rank"))
    effective = F.when(F.col("next.session") == F.col("session"), F.col("next.run_end_score")).otherwise(
        F.col("offset_score")
    )
    return ranked.withColumn("effective_score", effective).select(
        "doc",
        F.col("session").alias(who),
        "ts",
        F.timestamp_millis("ts").alias("time"),
        "offset",
        "head",
        F.greatest(foreign, F.lit(0)).alias("lag_entries"),
        F.greatest(score_ms("head_score") - score_ms("effective_score"), F.lit(0)).alias("lag_ms"),
        "offset_score",
        "head_score",
        "offset_rank",
        "own_offset_rank",
        "effective_score",
    )


def _appends_up_to(score: str, own: bool = False) -> Column:
    """Appends of the row's document (``own``: by the row's session) whose score is ``<=`` the row's ``score``."""
    keys = ["doc", "session"] if own else ["doc"]
    order = Window.partitionBy(*keys).orderBy(score, "kind").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return F.sum((F.col("kind") == _APPEND).cast("long")).over(order)


def _with_run_ends(entries: DataFrame) -> DataFrame:
    """Each append's ``run_end_score``: the last append of the run of the
    same session's appends it belongs to, in the document's order."""
    forward = Window.partitionBy("doc").orderBy("offset_score")
    backward = (
        Window.partitionBy("doc")
        .orderBy(F.col("offset_score").desc())
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    ends_run = F.coalesce(~F.lead("session").over(forward).eqNullSafe(F.col("session")), F.lit(True))
    return entries.withColumn("ends_run", ends_run).withColumn(
        "run_end_score", F.last(F.when(F.col("ends_run"), F.col("offset_score")), ignorenulls=True).over(backward)
    )


def _next_append() -> Column:
    """The first append after the row's offset (its author and run end), by a
    walk in reverse order: at an equal score the ack comes first, so an
    append at its very offset (one it holds) is not "next"."""
    backward = (
        Window.partitionBy("doc")
        .orderBy(F.col("offset_score").desc(), F.col("kind").desc())
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    append = F.when(F.col("kind") == _APPEND, F.struct("session", "run_end_score"))
    return F.last(append, ignorenulls=True).over(backward)


def lag_over_time(lag: DataFrame, bucket_ms: int) -> DataFrame:
    """Per doc, session and bucket: the lag of the bucket's last ack, and the number of acks."""
    last = F.max_by(F.struct("lag_entries", "lag_ms", "offset"), F.struct("ts", "offset_score", "head_score"))
    return (
        lag.groupBy("doc", "session", time_bucket("ts", bucket_ms).alias("bucket"))
        .agg(last.alias("last"), F.count(F.lit(1)).alias("acks"))
        .select("doc", "session", "bucket", "last.lag_entries", "last.lag_ms", "last.offset", "acks")
    )


#: Row kinds of the timeline's walks: in a bucket, a document's head, a
#: session's own appends and its acks come before its sample.
_HEAD, _OWN, _ACKED, _SAMPLE = 0, 1, 2, 3


def lag_timeline(lag: DataFrame, events: DataFrame, presence: DataFrame, end_ts: int, bucket_ms: int) -> DataFrame:
    """Each session's lag at the end of every bucket from its first ack until
    it left (or the log ends), whether it acked in that bucket or not: a
    session that stops acking grows on the chart as others append.

    At a bucket's end, a session holds what its last ack so far held; the
    document's head is its last append so far. The lag is measured between
    them as for an ack (lag.py): other sessions' appends in between, and the
    head's ms minus the effective offset's ms. ``acks``: its acks in the bucket.
    """

    def bucket(column: str) -> Column:
        return (F.floor(F.col(column) / bucket_ms) * bucket_ms).cast("long")

    held = F.max_by(
        F.struct("offset_rank", "own_offset_rank", "effective_score"), F.struct("ts", "offset_score", "head_score")
    )
    acked = lag.groupBy("doc", "session", bucket("ts").alias("b")).agg(
        held.alias("held"), F.count(F.lit(1)).alias("acks")
    )
    until = bucket("until")
    spans = (
        acked.groupBy("doc", "session")
        .agg(F.min("b").alias("first_b"))
        .join(presence.select("session", "left_ts"), "session", "left")
        .withColumn("until", F.coalesce("left_ts", F.lit(end_ts)))
    )
    samples = spans.select(
        "doc",
        "session",
        F.explode(F.sequence("first_b", F.greatest(until, F.col("first_b")), F.lit(bucket_ms))).alias("b"),
    )
    written = appends(events)
    own = written.groupBy("doc", "session", bucket("ts").alias("b")).agg(F.count(F.lit(1)).alias("own_n"))
    # One walk per session over its own appends, its acks and its samples of
    # each bucket, in that order: the samples carry what the walk has seen.
    walk = Window.partitionBy("doc", "session").orderBy("b", "kind")
    so_far = walk.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    rows = (
        own.withColumn("kind", F.lit(_OWN))
        .unionByName(acked.withColumn("kind", F.lit(_ACKED)), allowMissingColumns=True)
        .unionByName(samples.withColumn("kind", F.lit(_SAMPLE)), allowMissingColumns=True)
    )
    acked_here = F.when(
        (F.lag("kind").over(walk) == _ACKED) & (F.lag("b").over(walk) == F.col("b")), F.lag("acks").over(walk)
    )
    sampled = (
        rows.withColumns(
            {
                "held": F.last("held", ignorenulls=True).over(so_far),
                "own_so_far": F.sum(F.coalesce("own_n", F.lit(0))).over(so_far),
                "acks": F.coalesce(acked_here, F.lit(0)),
            }
        )
        .filter(F.col("kind") == _SAMPLE)
        .select(
            "doc",
            "session",
            "b",
            "held",
            "own_so_far",
            "acks",
            "kind",
        )
    )
    by_doc = Window.partitionBy("doc").orderBy("b").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    per_bucket = written.groupBy("doc", bucket("ts").alias("b")).agg(
        F.count(F.lit(1)).alias("n"), F.max("offset_score").alias("top")
    )
    heads = per_bucket.select(
        "doc",
        "b",
        F.struct(F.sum("n").over(by_doc).alias("rank"), F.max("top").over(by_doc).alias("score")).alias("head"),
        F.lit(_HEAD).alias("kind"),
    )
    as_of = Window.partitionBy("doc").orderBy("b", "kind").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    joined = (
        heads.unionByName(sampled, allowMissingColumns=True)
        .withColumn("head", F.last("head", ignorenulls=True).over(as_of))
        .filter(F.col("kind") == _SAMPLE)
    )
    foreign = (F.coalesce("head.rank", F.lit(0)) - F.col("held.offset_rank")) - (
        F.col("own_so_far") - F.col("held.own_offset_rank")
    )
    behind_ms = F.coalesce(score_ms("head.score") - score_ms("held.effective_score"), F.lit(0))
    return joined.select(
        "doc",
        "session",
        F.timestamp_millis("b").alias("bucket"),
        F.greatest(foreign, F.lit(0)).alias("lag_entries"),
        F.greatest(behind_ms, F.lit(0)).alias("lag_ms"),
        "acks",
    )


def document_heads(events: DataFrame) -> DataFrame:
    """Per document: appends in the log and the last appended score (its head at the end)."""
    return (
        appends(events)
        .groupBy("doc")
        .agg(F.count(F.lit(1)).alias("appended"), F.max("offset_score").alias("end_head_score"))
    )


def own_appends(events: DataFrame) -> DataFrame:
    """Per document and session: the appends it wrote (never part of its own lag)."""
    return appends(events).groupBy("doc", "session").agg(F.count(F.lit(1)).alias("own_appended"))


def lag_at_end(last_ack: DataFrame, heads: DataFrame, own: DataFrame) -> DataFrame:
    """The lag of each session's last ack measured against the end of the log:
    other sessions' appends after its offset, and the last append's ms minus
    its effective offset's ms."""
    joined = last_ack.join(heads, "doc", "left").join(own, ["doc", "session"], "left")
    later = F.coalesce(F.col("appended"), F.lit(0)) - F.col("offset_rank")
    own_later = F.coalesce(F.col("own_appended"), F.lit(0)) - F.col("own_offset_rank")
    return joined.withColumns(
        {
            "current_lag_entries": F.greatest(later - own_later, F.lit(0)),
            "current_lag_ms": F.greatest(
                F.coalesce(score_ms("end_head_score") - score_ms("effective_score"), F.lit(0)), F.lit(0)
            ),
        }
    ).drop("appended", "end_head_score", "own_appended")


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
        F.max_by(F.struct("lag_entries", "lag_ms"), F.struct("ts", "offset_score")).alias("last")
    )
    ends = last.groupBy("group").agg(
        F.sum("last.lag_entries").alias("last_lag_entries"),
        F.max("last.lag_ms").alias("last_lag_ms"),
        F.count(F.lit(1)).alias("documents"),
    )
    over = group_lag.groupBy("group").agg(
        F.count(F.lit(1)).alias("acks"),
        F.max("lag_ms").alias("max_lag_ms"),
        F.percentile_approx("lag_ms", 0.95).alias("p95_lag_ms"),
    )
    return over.join(ends, "group").orderBy("group")
