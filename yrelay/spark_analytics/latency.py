"""Ack latency: from each ``deliver`` to the ack that covers it.

A delivery's latency is the time from its ``deliver`` event to the first
later ``ack`` of the same document and session whose offset is ``>=`` the
delivery's ``last`` id ("later": at the same ms or after; acks are ordered
by time, then offset). A delivery no ack covers has no latency (it counts
in ``deliveries``, not in ``acked``).

One exception, on purpose: the search stops at a rewind. Acks of a session
split into runs at every ack whose offset is below the previous one; a
delivery is matched only within the run of the first ack after it. A
client that went back to an older state has not acknowledged what it was
sent before; the redelivery after the rewind is measured instead.

Within a run offsets never decrease, so the covering ack is the later of
two acks that plain running windows find: the first ack after the delivery
in time, and the first ack of that run whose offset is ``>=`` ``last``
(searched in offset order). Both are "last non-null so far" windows over
reversed orders, which Spark computes in one pass (a frame that grows;
never one that runs to the end of the partition, which Spark recomputes
for every row).

Percentiles are exact: Spark SQL's ``percentile`` (all values, linear
interpolation between the two nearest ranks, like numpy's default), not
``percentile_approx``.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from yrelay.spark_analytics.schema import EventType

PERCENTILES = (0.5, 0.95, 0.99)
#: Lower bounds (ms) of the latency histogram's bins.
HISTOGRAM_EDGES = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000)

_DELIVER, _ACK = 0, 1


def delivery_latency(events: DataFrame) -> DataFrame:
    """One row per ``deliver`` event: doc, session, ts, and ``latency_ms`` (null if never covered).

    Delivers and acks go through one shuffle (by doc and session) and two
    sorts of it: reverse time order (runs, and the next ack), then reverse
    offset order within runs (the covering ack).
    """
    delivers = events.filter(
        (F.col("type") == str(EventType.DELIVER)) & F.col("last_score").isNotNull() & F.col("doc").isNotNull()
    ).select("doc", "session", "ts", F.col("last_score").alias("score"), F.lit(_DELIVER).alias("kind"))
    acks = events.filter((F.col("type") == str(EventType.ACK)) & F.col("offset_score").isNotNull()).select(
        "doc", "session", "ts", F.col("offset_score").alias("score"), F.lit(_ACK).alias("kind")
    )
    covered = _first_covering_in_run(_runs_and_next_ack(delivers.unionByName(acks)))
    found = F.col("by_score.run") == F.col("by_time.run")
    return covered.filter(F.col("kind") == _DELIVER).select(
        "doc",
        "session",
        "ts",
        F.when(found, F.greatest("by_time.ts", "by_score.ts") - F.col("ts")).alias("latency_ms"),
    )


def _session_window(*order: Column, up_to: int = Window.currentRow) -> WindowSpec:
    """Rows of one doc and session in ``order``, from the first up to ``up_to`` (0: the current row)."""
    return Window.partitionBy("doc", "session").orderBy(*order).rowsBetween(Window.unboundedPreceding, up_to)


def _runs_and_next_ack(rows: DataFrame) -> DataFrame:
    """Walking a session backwards in time: each ack's run, and each row's next ack (``by_time``).

    Backwards, the ack seen just before an ack is the one after it in time;
    if that one goes below it, a rewind follows. ``run`` = minus the
    rewinds after the ack: it is equal within a run and grows with time,
    which is all the matching needs.
    """
    backwards = [F.col("ts").desc(), F.col("kind").desc(), F.col("score").desc()]
    is_ack = F.col("kind") == _ACK
    next_score = F.last(F.when(is_ack, F.col("score")), ignorenulls=True).over(_session_window(*backwards, up_to=-1))
    rewind_next = F.coalesce((is_ack & (next_score < F.col("score"))).cast("int"), F.lit(0))
    with_runs = rows.withColumn("rewind_next", rewind_next).withColumn(
        "run", F.when(is_ack, -F.sum("rewind_next").over(_session_window(*backwards)))
    )
    timed = with_runs.withColumn("by_time", _last_ack_so_far(*backwards))
    return timed.withColumn("run", F.when(F.col("kind") == _DELIVER, F.col("by_time.run")).otherwise(F.col("run")))


def _last_ack_so_far(*order: Column) -> Column:
    """The nearest ack at or before each row in ``order`` (run and ts): in a reversed order, the next one."""
    ack = F.when(F.col("kind") == _ACK, F.struct("run", "ts"))
    return F.last(ack, ignorenulls=True).over(_session_window(*order))


def _first_covering_in_run(rows: DataFrame) -> DataFrame:
    """Each delivery gets the first ack of its run whose offset is ``>=`` its ``last``."""
    return rows.withColumn(
        "by_score",
        _last_ack_so_far(
            F.col("run").desc_nulls_last(), F.col("score").desc(), F.col("kind").desc(), F.col("ts").desc()
        ),
    )


def latency_summary(latency: DataFrame) -> DataFrame:
    """Deliveries, acked, exact p50/p95/p99, max and mean: all documents (doc null), then per document.

    One ``rollup`` pass: the input (a chain of windows) is computed once,
    not once for the total and once for the documents.
    """
    summary = latency.rollup("doc").agg(
        F.grouping("doc").alias("all"),
        F.count(F.lit(1)).alias("deliveries"),
        F.count("latency_ms").alias("acked"),
        F.percentile("latency_ms", list(PERCENTILES)).alias("p"),
        F.max("latency_ms").alias("max_ms"),
        F.try_divide(F.sum("latency_ms"), F.count("latency_ms")).alias("mean_ms"),
    )
    return summary.select(
        F.when(F.col("all") == 0, F.col("doc")).alias("doc"),
        "deliveries",
        "acked",
        *[F.col("p")[i].alias(f"p{round(p * 100)}_ms") for i, p in enumerate(PERCENTILES)],
        "max_ms",
        "mean_ms",
    )


def latency_histogram(latency: DataFrame) -> DataFrame:
    """Acked deliveries per bin; a bin is named by its lower bound in ms."""
    edges = ", ".join(f"{edge}L" for edge in HISTOGRAM_EDGES)
    lower = F.expr(f"aggregate(array({edges}), 0L, (acc, edge) -> if(latency_ms >= edge, edge, acc))")
    return (
        latency.filter(F.col("latency_ms").isNotNull())
        .groupBy(lower.alias("bin_ms"))
        .agg(F.count(F.lit(1)).alias("deliveries"))
    )
