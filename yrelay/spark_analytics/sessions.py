"""Who a session is and whether it is still there at the end of the log.

A session's ``connect`` events (``hello`` answered, new or resumed) and
``disconnect`` events (its websocket closed) say whether it was connected
when the log ends: it *left* when its last ``disconnect`` is at or after its
last ``connect``. A session that resumes later (a ``connect`` after the
``disconnect``) is back. A session with no ``connect`` in the log (the log
starts after it connected) counts as connected unless it disconnected.

The subject comes from ``connect`` events of schema version 2 (hashed, plain
or absent, as the server's ``event_log_subject`` says); a version-1 log has
none, so ``subject`` is null.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from yrelay.spark_analytics.schema import EventType


def session_presence(events: DataFrame) -> DataFrame:
    """One row per session with a ``connect`` or ``disconnect``: its subject
    (the last one recorded) and ``left_ts``, the time it left for good (null:
    still connected at the end of the log)."""
    connect, disconnect = str(EventType.CONNECT), str(EventType.DISCONNECT)
    per_session = (
        events.filter(F.col("type").isin(connect, disconnect) & F.col("session").isNotNull())
        .groupBy("session")
        .agg(
            F.max(F.when(F.col("type") == connect, F.col("ts"))).alias("connect_ts"),
            F.max(F.when(F.col("type") == disconnect, F.col("ts"))).alias("disconnect_ts"),
            F.max_by(F.col("subject"), F.when(F.col("subject").isNotNull(), F.col("ts"))).alias("subject"),
        )
    )
    gone = F.col("disconnect_ts").isNotNull() & (
        F.col("connect_ts").isNull() | (F.col("disconnect_ts") >= F.col("connect_ts"))
    )
    return per_session.select("session", "subject", F.when(gone, F.col("disconnect_ts")).alias("left_ts"))
