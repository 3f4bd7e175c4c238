"""A Burrow-style status per document and session, at the end of the log.

Burrow (LinkedIn's Kafka consumer lag checker) judges a consumer by a
sliding window of its last committed offsets rather than by one lag
figure, because a single number cannot tell "busy but keeping up" from
"stuck". Here the window is a session's last ``window`` acks of one
document (default 10), ordered by time then offset. "Lag" of an ack is its
lag in entries (lag.py); "current lag" is the lag of the last ack measured
against the end of the log (appends after its offset up to the log's last
append). "The end of the log" is the largest ``ts`` of any event.

Lag follows the tracker's rule (lag.py): the session's own appends never
count. A session that *left* (disconnected and never came back,
sessions.py) is not judged by its lag: it is not there to be behind.

The rules, first match wins:

1. **ERR**: an ``evict`` or ``resync`` event of this document and session
   at or after its last ack (or it never acked), while it was connected
   (at or before it left): the server dropped it or told it to start over,
   and it has not acked since. What GC does after a session left is its
   normal end, not an error.
2. **LEFT_UNACKED**: it left, and a ``deliver`` to it went past its last
   acked offset (or it never acked one): it left with entries unacked.
3. **LEFT**: it left with everything it was sent acked.
4. **OK**: current lag is 0: it holds everything others appended.
5. **STOP**: the time from its last ack to the end of the log is longer
   than the window spans (last ack's ts - first ack's ts); with a single
   ack in the window that span is 0, so any later event means STOP.
6. **OK**: lag was 0 at some ack in the window: it caught up recently.
7. **STALL**: at least two acks in the window, all with the same offset.
8. **REWIND**: an ack's offset is smaller than the one before it.
9. **WARN**: at least two acks, and the lag never decreased from one ack
   to the next (steady lag counts: it is not catching up).
10. **OK**: otherwise (lag > 0 but going down).

Sessions are those with at least one ack, evict or resync event. A session
that left has no current lag (null): what was appended after it left is
not its lag.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from yrelay.spark_analytics.lag import lag_at_end
from yrelay.spark_analytics.schema import EventType
from yrelay.spark_analytics.tables import Status

STATUS_COLUMNS = [
    "doc",
    "session",
    "status",
    "acks",
    "window_acks",
    "window_ms",
    "last_ack_ts",
    "offset",
    "lag_entries",
    "lag_ms",
    "current_lag_entries",
    "current_lag_ms",
    "evictions",
    "resyncs",
    "last_problem",
    "subject",
    "left_ts",
    "unacked",
]


def session_status(
    lag: DataFrame,
    events: DataFrame,
    heads: DataFrame,
    own: DataFrame,
    presence: DataFrame,
    end_ts: int,
    window: int = 10,
) -> DataFrame:
    """One row per doc and session: the status and the figures it was judged on."""
    judged = _with_rule_inputs(_windows(lag, window), end_ts)
    at_end = lag_at_end(judged, heads, own)
    both = (
        at_end.join(_problems(events, presence), ["doc", "session"], "full_outer")
        .join(presence, "session", "left")
        .join(_delivered(events), ["doc", "session"], "left")
    )
    left = F.col("left_ts").isNotNull()
    return (
        both.withColumns(
            {
                **{name: F.coalesce(F.col(name), F.lit(0)) for name in ("acks", "evictions", "resyncs")},
                "unacked": left
                & F.coalesce(F.col("delivered_score") > F.coalesce("offset_score", F.lit(-1)), F.lit(False)),
            }
        )
        .withColumn("status", _status())
        .withColumns({name: F.when(~left, F.col(name)) for name in ("current_lag_entries", "current_lag_ms")})
        .select(*STATUS_COLUMNS)
    )


#: An ack's figures in a window, in the order the window sorts acks by
#: (time, then offset and head); the rules read them, and the last ack's
#: figures (all but ts and head) are the session's.
_WINDOW_FIELDS = (
    "ts",
    "offset_score",
    "head_score",
    "lag_entries",
    "lag_ms",
    "offset",
    "offset_rank",
    "own_offset_rank",
    "effective_score",
)


def _windows(lag: DataFrame, window: int) -> DataFrame:
    """Per doc and session: every ack counted, the last ``window`` as an array in time order."""
    newest_first = Window.partitionBy("doc", "session").orderBy(
        F.col("ts").desc(), F.col("offset_score").desc(), F.col("head_score").desc()
    )
    point = F.struct(*_WINDOW_FIELDS)
    return (
        lag.withColumn("nth", F.row_number().over(newest_first))
        .groupBy("doc", "session")
        .agg(
            F.count(F.lit(1)).alias("acks"),
            F.array_sort(F.collect_list(F.when(F.col("nth") <= window, point))).alias("w"),
        )
    )


def _with_rule_inputs(windows: DataFrame, end_ts: int) -> DataFrame:
    """The window's facts the rules read, and the last ack's figures."""
    return windows.select(
        "doc",
        "session",
        "acks",
        F.size("w").alias("window_acks"),
        (_last("ts") - F.expr("w[0].ts")).alias("window_ms"),
        _last("ts").alias("last_ack_ts"),
        *[_last(name).alias(name) for name in _WINDOW_FIELDS if name not in ("ts", "head_score")],
        (F.lit(end_ts) - _last("ts")).alias("idle_ms"),
        F.expr("exists(w, a -> a.lag_entries = 0)").alias("caught_up"),
        F.expr("size(w) >= 2 and forall(w, a -> a.offset_score = w[0].offset_score)").alias("stalled"),
        F.expr(
            "size(w) >= 2 and exists(sequence(1, size(w) - 1), i -> w[i].offset_score < w[i - 1].offset_score)"
        ).alias("rewound"),
        F.expr(
            "size(w) >= 2 and forall(sequence(1, size(w) - 1), i -> w[i].lag_entries >= w[i - 1].lag_entries)"
        ).alias("not_decreasing"),
    )


def _last(field: str) -> Column:
    """A field of the window's last (newest) ack."""
    return F.expr(f"element_at(w, -1).{field}")


def _problems(events: DataFrame, presence: DataFrame) -> DataFrame:
    """Per doc and session: evictions, resyncs, the kind of the last of them,
    and ``problem_ts``, the time of the last one while it was connected."""
    kinds = [str(EventType.EVICT), str(EventType.RESYNC)]
    what = F.when(
        F.col("type") == str(EventType.EVICT), F.concat(F.lit("evict:"), F.coalesce("mode", F.lit("?")))
    ).otherwise(F.concat(F.lit("resync:"), F.coalesce("reason", F.lit("?"))))
    connected = F.col("left_ts").isNull() | (F.col("ts") <= F.col("left_ts"))
    return (
        events.filter(F.col("type").isin(kinds) & F.col("doc").isNotNull() & F.col("session").isNotNull())
        .join(presence.select("session", "left_ts"), "session", "left")
        .groupBy("doc", "session")
        .agg(
            F.sum((F.col("type") == str(EventType.EVICT)).cast("long")).alias("evictions"),
            F.sum((F.col("type") == str(EventType.RESYNC)).cast("long")).alias("resyncs"),
            F.max(F.when(connected, F.col("ts"))).alias("problem_ts"),
            F.max_by(what, F.struct("ts", what)).alias("last_problem"),
        )
    )


def _delivered(events: DataFrame) -> DataFrame:
    """Per doc and session: the highest ``last`` id it was ever delivered, as a score."""
    return (
        events.filter((F.col("type") == str(EventType.DELIVER)) & F.col("doc").isNotNull())
        .groupBy("doc", "session")
        .agg(F.max("last_score").alias("delivered_score"))
    )


def _status() -> Column:
    since_last_ack = F.col("last_ack_ts").isNull() | (F.col("problem_ts") >= F.col("last_ack_ts"))
    failed = F.col("problem_ts").isNotNull() & since_last_ack
    return (
        F.when(failed, F.lit(str(Status.ERR)))
        .when(F.col("unacked"), F.lit(str(Status.LEFT_UNACKED)))
        .when(F.col("left_ts").isNotNull(), F.lit(str(Status.LEFT)))
        .when(F.col("current_lag_entries") == 0, F.lit(str(Status.OK)))
        .when(F.col("idle_ms") > F.col("window_ms"), F.lit(str(Status.STOP)))
        .when(F.col("caught_up"), F.lit(str(Status.OK)))
        .when(F.col("stalled"), F.lit(str(Status.STALL)))
        .when(F.col("rewound"), F.lit(str(Status.REWIND)))
        .when(F.col("not_decreasing"), F.lit(str(Status.WARN)))
        .otherwise(F.lit(str(Status.OK)))
    )
