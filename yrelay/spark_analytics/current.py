"""Lag and stream lengths now, straight from Redis (``--redis-url``).

The event log says how lag evolved; Redis says where every session stands
this moment, including sessions quiet for longer than the log goes back.
The DataFrames come from :func:`yrelay.spark_analytics.redis_source.redis_tables`
(entries: doc, id, ms, seq, score, session, clock, bytes; tracker: doc,
session, offset, score, ms, lag_entries, lag_ms).
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

#: ``(spark, url) -> (entries, tracker)``; tests pass a fake.
RedisReader = Callable[[SparkSession, str], tuple[DataFrame, DataFrame]]


def read_redis(spark: SparkSession, url: str) -> tuple[DataFrame, DataFrame]:
    """The real reader: every registered document, through the yrelay data source."""
    from yrelay.spark_analytics.redis_source import redis_tables

    return redis_tables(spark, url, docs=None)


def current_lag(tracker: DataFrame) -> DataFrame:
    """Per doc and session: the tracked offset and its lag, as the tracker has it now."""
    return tracker.select("doc", "session", "offset", F.col("ms").alias("offset_ms"), "lag_entries", "lag_ms")


def stream_lengths(entries: DataFrame) -> DataFrame:
    """Per document: entries in its stream now, their bytes, and the first and last id's ms."""
    return entries.groupBy("doc").agg(
        F.count(F.lit(1)).alias("length"),
        F.sum(F.coalesce("bytes", F.lit(0)).cast("long")).alias("bytes"),
        F.min("ms").alias("first_ms"),
        F.max("ms").alias("last_ms"),
    )
