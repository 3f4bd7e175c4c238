"""Reading the event log once: parsed, typed, stream ids scored, cached.

Every table of the analysis is computed from the same events, and parsing
JSON is the most expensive step of the job, so the log is parsed exactly
once into a slim cached DataFrame (stream ids turned into scores, which are
what every comparison needs). Lines that are not version-1 events are
counted and dropped here (versions 1 and 2 are read alike: 2 only adds
``subject`` to ``connect``), so nothing downstream sees them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from yrelay.spark_analytics.schema import CORRUPT, READ_SCHEMA, SCHEMA_VERSIONS, score

#: How the reader classifies a line (the ``line`` column of the raw cache).
VALID, CORRUPT_LINE, OTHER_VERSION = "valid", "corrupt", "other_version"


@dataclass(frozen=True)
class EventLog:
    """The valid events, and how many lines were dropped on the way."""

    events: DataFrame
    valid_lines: int
    corrupt_lines: int  # torn, not JSON, a field of the wrong type, or no ts/type
    other_version_lines: int  # well-formed, but of a schema version it does not know

    def release(self) -> None:
        """Drop the cached events (the job calls it when every table is written)."""
        self.events.unpersist()


def event_files(events_dir: Path) -> list[Path]:
    """The ``*.jsonl`` files the job reads; an empty list is the caller's error to raise."""
    return sorted(Path(events_dir).glob("*.jsonl"))


def read_events(spark: SparkSession, events_dir: Path) -> EventLog:
    """Parse every ``events_dir/*.jsonl`` (PERMISSIVE: bad lines are kept aside,
    never fatal), cache the typed events, and count what was dropped."""
    raw = (
        spark.read.schema(READ_SCHEMA)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
        .option("pathGlobFilter", "*.jsonl")  # a directory plus a filter: no glob-path lookups
        .json(str(Path(events_dir).resolve()))
    )
    typed = raw.select(_line_kind(raw).alias("line"), *_event_columns()).persist()
    counts = {row["line"]: row["count"] for row in typed.groupBy("line").count().collect()}
    return EventLog(
        events=typed.filter(F.col("line") == VALID).drop("line"),
        valid_lines=counts.get(VALID, 0),
        corrupt_lines=counts.get(CORRUPT_LINE, 0),
        other_version_lines=counts.get(OTHER_VERSION, 0),
    )


def _line_kind(raw: DataFrame) -> Column:
    broken = F.col(CORRUPT).isNotNull() | F.col("ts").isNull() | F.col("type").isNull()
    return (
        F.when(broken, F.lit(CORRUPT_LINE))
        .when(~F.col("v").isin(*SCHEMA_VERSIONS), F.lit(OTHER_VERSION))
        .otherwise(F.lit(VALID))
    )


def _event_columns() -> list[Column | str]:
    """What the analysis uses, with ids as scores (null when absent or malformed)."""
    return [
        "ts",
        "type",
        "doc",
        "session",
        "offset",
        "head",
        "entries",
        "bytes",
        "reason",
        "mode",
        "stream_length",
        "group",
        "subject",
        F.coalesce(F.col("duplicate"), F.lit(False)).alias("duplicate"),
        score("offset").alias("offset_score"),
        score("head").alias("head_score"),
        score("last").alias("last_score"),
    ]
