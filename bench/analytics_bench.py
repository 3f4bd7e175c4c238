"""``yrelay analyze`` at 1M and 10M generated events: Spark (local[2]) against
DuckDB (2 threads) doing the same aggregations in the same run. Prints
markdown tables.

    .venv/bin/python bench/analytics_bench.py [--events 1000000 10000000] [--dir /tmp/yrelay-bench]

The logs come from yrelay_tools.analytics_data (100 documents, 4
readers each, plus the special readers of document 0). Per size it times:

1. the whole Spark job (every table, Parquet written, the dashboard);
2. the core aggregations in both engines, with identical semantics, each
   run to completion once (results are small: Spark collects them, DuckDB
   stores them in temporary tables):
   lag per ack and its last value per minute (lag.py), deliver->ack
   latency with exact p50/p95/p99 overall and per document (latency.py),
   per-document figures (documents.py);
   a. from the JSON lines: parse once into memory (Spark: the job's cached
      parse; DuckDB: a table), then the three aggregations;
   b. from Parquet (the same typed events, written once beforehand): the
      three aggregations read it directly.

Each is run twice: "first" is the first run in this process (DuckDB: a new
connection; Spark's JVM has already run the whole job, so it is not cold),
"warm" the second. Results are checked to agree between the engines.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from yrelay.spark_analytics.documents import document_figures
from yrelay.spark_analytics.events import read_events
from yrelay.spark_analytics.job import JobConfig, run
from yrelay.spark_analytics.lag import ack_lag, lag_over_time
from yrelay.spark_analytics.latency import delivery_latency, latency_summary
from yrelay.spark_analytics.session import spark_session
from yrelay_tools.analytics_data import Scenario, generate

DOCS, READERS, TICK_MS = 100, 4, 500
#: Events per document and tick: 2 appends, and a deliver and an ack per reader.
EVENTS_PER_DOC_TICK = 2 + 2 * READERS
BUCKET_MS = 60_000


def scenario_for(events: int) -> Scenario:
    ticks = max(40, events // (DOCS * EVENTS_PER_DOC_TICK))
    return Scenario(docs=DOCS, readers=READERS, seconds=ticks * TICK_MS // 1000, tick_ms=TICK_MS, record_acks=False)


# ------------------------------------------------------------------- Spark


def spark_queries(events: DataFrame, span_ms: int) -> dict[str, DataFrame]:
    return {
        "lag": lag_over_time(ack_lag(events), BUCKET_MS),
        "latency": latency_summary(delivery_latency(events)),
        "documents": document_figures(events, span_ms),
    }


def spark_run(spark: SparkSession, events: DataFrame) -> dict[str, object]:
    """Run the three aggregations to completion, each once: their results are
    small and collected (as DuckDB materializes its results into tables), and
    the figures compared with DuckDB's come from the collected rows."""
    bounds = events.agg(F.min("ts"), F.max("ts")).first()
    results = {name: frame.collect() for name, frame in spark_queries(events, bounds[1] - bounds[0]).items()}
    overall = next(row for row in results["latency"] if row["doc"] is None)
    return {
        "lag_entries": sum(row["lag_entries"] for row in results["lag"]),
        "percentiles": (overall["p50_ms"], overall["p95_ms"], overall["p99_ms"]),
        "appends": sum(row["appends"] for row in results["documents"]),
    }


# ------------------------------------------------------------------ DuckDB

DUCK_COLUMNS = (
    "{v: 'INTEGER', ts: 'BIGINT', type: 'VARCHAR', doc: 'VARCHAR', session: 'VARCHAR', "
    "\"offset\": 'VARCHAR', head: 'VARCHAR', \"last\": 'VARCHAR', entries: 'BIGINT', bytes: 'BIGINT', "
    "reason: 'VARCHAR', mode: 'VARCHAR', stream_length: 'BIGINT', duplicate: 'BOOLEAN'}"
)

DUCK_SCORE = """CREATE OR REPLACE MACRO score(x) AS CASE
    WHEN x LIKE '%-%' AND try_cast(split_part(x, '-', 2) AS BIGINT) BETWEEN 0 AND 999
    THEN try_cast(split_part(x, '-', 1) AS BIGINT) * 1000 + try_cast(split_part(x, '-', 2) AS BIGINT) END"""

DUCK_PARSE = """CREATE OR REPLACE TABLE ev AS
SELECT ts, type, doc, session, "offset", head, entries, bytes, reason, mode, stream_length,
       coalesce(duplicate, false) AS duplicate, score("offset") AS offset_score, score(head) AS head_score,
       score("last") AS last_score
FROM read_json('{path}', format = 'newline_delimited', ignore_errors = true, columns = {columns})
WHERE v = 1 AND ts IS NOT NULL AND type IS NOT NULL"""

DUCK_LAG = """CREATE OR REPLACE TEMP TABLE q_lag AS
WITH all_rows AS (
  SELECT doc, NULL::VARCHAR AS session, NULL::BIGINT AS ts, NULL::VARCHAR AS "offset", offset_score,
         offset_score AS head_score, 0 AS kind
  FROM {ev} WHERE type = 'append' AND NOT duplicate AND offset_score IS NOT NULL
  UNION ALL
  SELECT doc, session, ts, "offset", offset_score, head_score, 1 FROM {ev}
  WHERE type = 'ack' AND offset_score IS NOT NULL AND head_score IS NOT NULL),
ranked AS (
  SELECT *,
    sum((kind = 0)::BIGINT) OVER (PARTITION BY doc ORDER BY offset_score, kind
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS offset_rank,
    sum((kind = 0)::BIGINT) OVER (PARTITION BY doc ORDER BY head_score, kind
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS head_rank
  FROM all_rows),
lag AS (
  SELECT *, greatest(head_rank - offset_rank, 0) AS lag_entries,
         greatest(head_score // 1000 - offset_score // 1000, 0) AS lag_ms
  FROM ranked WHERE kind = 1)
SELECT doc, session, ts // {bucket} * {bucket} AS bucket,
       arg_max({{'lag_entries': lag_entries, 'lag_ms': lag_ms, 'offset': "offset"}},
               (ts, offset_score, head_score)) AS last,
       count(*) AS acks
FROM lag GROUP BY ALL"""

DUCK_LATENCY = """CREATE OR REPLACE TEMP TABLE q_latency AS
WITH flagged AS (
  SELECT doc, session, ts, offset_score,
         coalesce((offset_score < lag(offset_score) OVER (PARTITION BY doc, session ORDER BY ts, offset_score))::INT,
                  0) AS rewind
  FROM {ev} WHERE type = 'ack' AND offset_score IS NOT NULL),
acks AS (
  SELECT *, sum(rewind) OVER (PARTITION BY doc, session ORDER BY ts, offset_score
                              ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS run FROM flagged),
all_rows AS (
  SELECT doc, session, ts, last_score AS score, 0 AS kind, NULL::HUGEINT AS run FROM {ev}
  WHERE type = 'deliver' AND last_score IS NOT NULL AND doc IS NOT NULL
  UNION ALL SELECT doc, session, ts, offset_score, 1, run FROM acks),
timed AS (
  SELECT *, last_value(CASE WHEN kind = 1 THEN {{'run': run, 'ts': ts}} END IGNORE NULLS) OVER (
           PARTITION BY doc, session ORDER BY ts DESC, kind DESC, score DESC
           ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS by_time
  FROM all_rows),
runs AS (
  SELECT doc, session, ts, score, kind, by_time, CASE WHEN kind = 0 THEN by_time.run ELSE run END AS run FROM timed),
scored AS (
  SELECT *, last_value(CASE WHEN kind = 1 THEN {{'run': run, 'ts': ts}} END IGNORE NULLS) OVER (
           PARTITION BY doc, session ORDER BY run DESC NULLS LAST, score DESC, kind DESC, ts DESC
           ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS by_score
  FROM runs),
latency AS (
  SELECT doc, CASE WHEN by_score.run = by_time.run THEN greatest(by_time.ts, by_score.ts) - ts END AS latency_ms
  FROM scored WHERE kind = 0)
SELECT CASE WHEN grouping(doc) = 0 THEN doc END AS doc, count(*) AS deliveries, count(latency_ms) AS acked,
       quantile_cont(latency_ms, [0.5, 0.95, 0.99]) AS p, max(latency_ms) AS max_ms, avg(latency_ms) AS mean_ms
FROM latency GROUP BY ROLLUP (doc)"""

DUCK_DOCUMENTS = """CREATE OR REPLACE TEMP TABLE q_documents AS
WITH span AS (SELECT greatest(max(ts) - min(ts), 1) / 1000.0 AS s FROM {ev}),
traffic AS (
  SELECT doc, count(*) AS appends, sum(coalesce(bytes, 0)) AS bytes FROM {ev}
  WHERE type = 'append' AND NOT duplicate AND offset_score IS NOT NULL GROUP BY doc),
activity AS (
  SELECT doc, count(*) FILTER (WHERE type = 'deliver') AS deliveries,
         count(*) FILTER (WHERE type = 'resend') AS resends,
         count(*) FILTER (WHERE type = 'evict') AS evictions, count(*) FILTER (WHERE type = 'resync') AS resyncs,
         count(*) FILTER (WHERE type = 'trim') AS trims,
         sum(coalesce(entries, 0)) FILTER (WHERE type = 'trim') AS trimmed,
         arg_max(stream_length, (ts, offset_score)) FILTER (WHERE type = 'trim') AS last_length,
         max(ts) FILTER (WHERE type = 'trim') AS trim_ts
  FROM {ev} WHERE doc IS NOT NULL GROUP BY doc),
since AS (
  SELECT e.doc, count(*) FILTER (WHERE e.ts > a.trim_ts) AS since_trim FROM {ev} e JOIN activity a USING (doc)
  WHERE e.type = 'append' AND NOT e.duplicate AND e.offset_score IS NOT NULL AND a.trim_ts IS NOT NULL GROUP BY e.doc)
SELECT a.doc, coalesce(appends, 0) AS appends, coalesce(bytes, 0) AS bytes,
       coalesce(appends, 0) / span.s AS appends_per_s, coalesce(bytes, 0) / span.s AS bytes_per_s,
       deliveries, resends, resends / nullif(deliveries, 0) AS resend_ratio, evictions, resyncs, trims,
       coalesce(trimmed, 0) AS trimmed, coalesce(trimmed, 0) / nullif(appends, 0) AS trim_efficiency,
       last_length + coalesce(since_trim, 0) AS stream_length, trim_ts AS last_trim_ts
FROM activity a CROSS JOIN span LEFT JOIN traffic USING (doc) LEFT JOIN since USING (doc)"""


def duck_run(con: duckdb.DuckDBPyConnection, ev: str) -> dict[str, object]:
    for sql in (DUCK_LAG, DUCK_LATENCY, DUCK_DOCUMENTS):
        con.execute(sql.format(ev=ev, bucket=BUCKET_MS))
    p = con.execute("SELECT p FROM q_latency WHERE doc IS NULL").fetchone()[0]
    return {
        "lag_entries": con.execute("SELECT sum(last.lag_entries) FROM q_lag").fetchone()[0],
        "percentiles": tuple(p),
        "appends": con.execute("SELECT sum(appends) FROM q_documents").fetchone()[0],
    }


def duck_connection() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET threads = 2")
    con.execute(DUCK_SCORE)
    return con


# ------------------------------------------------------------------ timing


@dataclass
class Timing:
    first: float
    warm: float


def twice(action: Callable[[], dict[str, object]]) -> tuple[Timing, dict[str, object]]:
    times, result = [], {}
    for _ in range(2):
        start = time.perf_counter()
        result = action()
        times.append(time.perf_counter() - start)
    return Timing(*times), result


def spark_from_json(spark: SparkSession, events_dir: Path) -> dict[str, object]:
    log = read_events(spark, events_dir)
    try:
        return spark_run(spark, log.events)
    finally:
        log.release()


def agree(a: dict[str, object], b: dict[str, object]) -> bool:
    same_counts = a["lag_entries"] == b["lag_entries"] and a["appends"] == b["appends"]
    return same_counts and all(abs(x - y) < 1e-6 for x, y in zip(a["percentiles"], b["percentiles"], strict=True))


def measure(spark: SparkSession, events: int, root: Path) -> list[str]:
    events_dir, parquet = root / f"events-{events}", root / f"parquet-{events}"
    shutil.rmtree(root, ignore_errors=True)
    start = time.perf_counter()
    expected = generate(events_dir, scenario_for(events))
    size_mb = sum(path.stat().st_size for path in expected.files) / 1e6
    took = time.perf_counter() - start
    print(f"# {expected.events:,} events, {size_mb:,.0f} MB of JSON lines, generated in {took:.0f} s")

    start = time.perf_counter()
    run(spark, JobConfig(events_dir, root / "out"))
    job_s = time.perf_counter() - start
    print(f"  full Spark job: {job_s:.1f} s")

    log = read_events(spark, events_dir)
    log.events.write.mode("overwrite").parquet(str(parquet))
    log.release()

    spark_json, s_json = twice(lambda: spark_from_json(spark, events_dir))
    con = duck_connection()
    parse = DUCK_PARSE.format(path=f"{events_dir}/*.jsonl", columns=DUCK_COLUMNS)
    duck_json, d_json = twice(lambda: (con.execute(parse), duck_run(con, "ev"))[1])
    spark_pq, s_pq = twice(lambda: spark_run(spark, spark.read.parquet(str(parquet))))
    con = duck_connection()
    duck_pq, d_pq = twice(lambda: duck_run(con, f"read_parquet('{parquet}/*.parquet')"))
    checks = "yes" if agree(s_json, d_json) and agree(s_pq, d_pq) and agree(s_json, s_pq) else f"NO: {s_json} {d_json}"
    print(f"  engines agree: {checks}")
    return [
        _row(expected.events, "JSON lines (parse + 3 aggregations)", spark_json, duck_json, job_s),
        _row(expected.events, "Parquet (3 aggregations)", spark_pq, duck_pq, None),
    ]


def _row(events: int, what: str, spark: Timing, duck: Timing, job_s: float | None) -> str:
    job = f"{job_s:.1f}" if job_s is not None else ""
    return (
        f"| {events:,} | {what} | {spark.first:.1f} | {spark.warm:.1f} | {duck.first:.1f} | {duck.warm:.1f} | "
        f"{spark.warm / duck.warm:.1f}x | {job} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/yrelay-analytics-bench"))
    parser.add_argument("--driver-memory", default="4g", help="spark.driver.memory (local mode: the executor too)")
    args = parser.parse_args()
    spark = spark_session(
        "local[2]",
        "yrelay-analytics-bench",
        **{"spark.driver.memory": args.driver_memory, "spark.ui.showConsoleProgress": "false"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    rows = []
    try:
        for events in args.events:
            rows += measure(spark, events, args.dir)
    finally:
        spark.stop()
    print(
        "\n| events | input | Spark first s | Spark warm s | DuckDB cold s | DuckDB warm s | Spark/DuckDB warm "
        "| full Spark job s |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
