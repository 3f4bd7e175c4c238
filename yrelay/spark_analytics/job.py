"""The ``yrelay analyze`` job: event log (and Redis) in, Parquet tables and a dashboard out.

The same function runs under ``local[*]`` and on a standalone cluster
(``spark://host:port``): it uses no Python UDFs, so executors need no
Python for the log itself (only the Redis data source runs Python on
executors), and every path is made absolute, since executors do not share
the driver's working directory. ``--events`` and ``--out`` must therefore
be visible at the same path on every machine of a cluster (a shared mount).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from yrelay.spark_analytics.analysis import Analysis, Options
from yrelay.spark_analytics.current import RedisReader, read_redis
from yrelay.spark_analytics.dashboard import render
from yrelay.spark_analytics.events import event_files, read_events
from yrelay.spark_analytics.tables import Table

#: ``(what is starting, steps done, steps in all)``, called before each step.
OnStep = Callable[[str, int, int], None]
#: Tables that grow with the log; the others are written as a single file.
LARGE_TABLES = {Table.LAG, Table.LAG_OVER_TIME, Table.GROUP_LAG}


@dataclass(frozen=True)
class JobConfig:
    events_dir: Path
    out_dir: Path
    redis_url: str | None = None
    options: Options = field(default_factory=Options)


def run(
    spark: SparkSession, config: JobConfig, *, on_step: OnStep | None = None, redis_reader: RedisReader = read_redis
) -> dict[str, Any]:
    """Analyse ``config.events_dir``, write every table and the dashboard; return the summary."""
    events_dir, out_dir = Path(config.events_dir).resolve(), Path(config.out_dir).resolve()
    if not event_files(events_dir):
        raise FileNotFoundError(f"no *.jsonl event files in {events_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    # Standard Parquet timestamps (UTC-adjusted micros), which pandas, DuckDB and Arrow read as UTC.
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    report = on_step or (lambda what, done, total: None)
    context = spark.sparkContext
    redis = redis_reader(spark, config.redis_url) if config.redis_url else None  # a bad URL fails before the parse
    report("reading the event log", 0, 1)
    context.setJobDescription("yrelay analyze: reading the event log")
    log = read_events(spark, events_dir)
    analysis = Analysis(spark, log, config.options, redis)
    try:
        steps = analysis.steps()
        total = len(steps) + 2
        _remove_stale(out_dir, {table for table, _ in steps})
        for done, (table, build) in enumerate(steps, 1):
            report(f"table {table}", done, total)
            context.setJobDescription(f"yrelay analyze: table {table}")
            write_table(build(), out_dir / table.value, single_file=table not in LARGE_TABLES)
        report("dashboard", total - 1, total)
        render(out_dir)
        report("done", total, total)
        return analysis.summary
    finally:
        context.setJobDescription(None)  # type: ignore[arg-type]  # None clears it (SparkContext passes it to Java); the stub says str only
        analysis.release()


def write_table(frame: DataFrame, path: Path, *, single_file: bool) -> None:
    """Replace the Parquet directory at ``path``."""
    (frame.coalesce(1) if single_file else frame).write.mode("overwrite").parquet(str(path))


def _remove_stale(out_dir: Path, written: set[Table]) -> None:
    """Tables of an earlier run that this run does not write (current_lag without --redis-url)."""
    for table in set(Table) - written:
        shutil.rmtree(out_dir / table.value, ignore_errors=True)
