"""The event log's explicit Spark schema (docs/events.md, versions 1 and 2),
and stream ids as columns.

Reading with an explicit schema, rather than letting Spark infer one, is
what makes a torn or mistyped line cheap and harmless: Spark does not scan
the files twice, and a line whose fields do not fit lands in
:data:`CORRUPT` instead of widening a column to string for everybody.
Only fields with one clear type are declared; others (``docs`` of
``disconnect``) are ignored, so a change there can never mark lines corrupt.
"""

from __future__ import annotations

from enum import StrEnum

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, DataType, IntegerType, LongType, StringType, StructField, StructType

#: The event log versions the analysis reads. Version 2 only adds ``subject``
#: to ``connect`` (a version-1 log has no subjects: the column is null).
SCHEMA_VERSIONS = (1, 2)
#: Spark puts the raw text of a line it could not parse into this column.
CORRUPT = "_corrupt"
#: A stream id ``"<ms>-<seq>"`` maps to ``ms * SCORE_FACTOR + seq`` (yrelay.storage.offsets).
SCORE_FACTOR = 1000


class EventType(StrEnum):
    CONNECT = "connect"
    DISCONNECT = "disconnect"
    APPEND = "append"
    DELIVER = "deliver"
    ACK = "ack"
    RESEND = "resend"
    RESYNC = "resync"
    EVICT = "evict"
    SNAPSHOT = "snapshot"
    TRIM = "trim"
    DROPPED = "dropped"
    CONSUMER_ACK = "consumer_ack"
    REFUSE = "refuse"


def _fields(**types: DataType) -> list[StructField]:
    return [StructField(name, kind, nullable=True) for name, kind in types.items()]


#: Every field of every event type, as docs/events.md lists them.
EVENT_SCHEMA = StructType(
    _fields(
        v=IntegerType(),
        ts=LongType(),
        type=StringType(),
        process=StringType(),
        doc=StringType(),
        session=StringType(),
        resumed=BooleanType(),
        duration_ms=LongType(),
        offset=StringType(),
        clock=LongType(),
        bytes=LongType(),
        duplicate=BooleanType(),
        first=StringType(),
        last=StringType(),
        entries=LongType(),
        head=StringType(),
        reason=StringType(),
        mode=StringType(),
        stream_length=LongType(),
        group=StringType(),
        subject=StringType(),
    )
)
#: What the JSON reader is given: the schema plus the corrupt-record column.
READ_SCHEMA = StructType([*EVENT_SCHEMA.fields, StructField(CORRUPT, StringType(), nullable=True)])


def score(stream_id: Column | str) -> Column:
    """``ms * 1000 + seq`` of a ``"<ms>-<seq>"`` column; null for anything else.

    ``try_cast`` because Spark 4 runs in ANSI mode, where a plain cast of a
    malformed id would fail the whole job instead of yielding null.
    """
    ms = F.substring_index(stream_id, "-", 1).try_cast("long")
    seq = F.substring_index(stream_id, "-", -1).try_cast("long")
    well_formed = (F.instr(stream_id, "-") > 1) & (seq >= 0) & (seq < SCORE_FACTOR) & (ms >= 0)
    return F.when(well_formed, ms * SCORE_FACTOR + seq)


def score_ms(score_column: Column | str) -> Column:
    """The millisecond part of a score: the entry's time."""
    column = F.col(score_column) if isinstance(score_column, str) else score_column
    return F.floor(column / SCORE_FACTOR).cast("long")


def time_bucket(ts: Column | str, bucket_ms: int) -> Column:
    """The start of the ``bucket_ms`` wide bucket holding ``ts`` (ms), as a timestamp."""
    column = F.col(ts) if isinstance(ts, str) else ts
    return F.timestamp_millis(F.floor(column / bucket_ms).cast("long") * bucket_ms)
