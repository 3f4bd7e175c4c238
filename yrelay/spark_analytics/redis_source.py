"""yrelay's Redis as Spark tables: the ``yrelay`` Python data source (Spark 4).

::

    spark.read.format("yrelay").option("url", "redis://localhost:6379/0")
        .option("kind", "entries")          # or "tracker"
        .option("docs", "a,b")              # default: every registered document
        .option("docsPerPartition", "100")
        .option("cluster", "true")          # url is a seed node of a Redis Cluster
        .load()

Planning (listing the documents, cutting them into groups) runs once in a
Python worker beside the driver; each group becomes one Spark partition whose
task opens its own Redis connection and streams Arrow batches. Options are in
:mod:`.redis_options`, the tables in :mod:`.redis_rows`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from yrelay.spark_analytics.redis_connection import connected
from yrelay.spark_analytics.redis_options import Kind, SourceOptionError, SourceOptions
from yrelay.spark_analytics.redis_pages import registered_documents
from yrelay.spark_analytics.redis_rows import arrow_schema, table_batches

NAME = "yrelay"


class YrelayDataSource(DataSource):
    """``spark.read.format("yrelay")``: options are checked on construction,
    which Spark does at ``load()``, so a bad option fails before any job runs."""

    def __init__(self, options: Mapping[str, str]):
        super().__init__(dict(options))
        self.source = SourceOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return spark_schema(self.source)

    def reader(self, schema: StructType) -> YrelayReader:
        expected = spark_schema(self.source)
        if schema != expected:
            raise SourceOptionError(
                f"the yrelay {self.source.kind.value} table has a fixed schema "
                f"({expected.simpleString()}); do not pass .schema(...)"
            )
        return YrelayReader(self.source)


class YrelayReader(DataSourceReader):
    """Plans document groups, then reads one group per task."""

    def __init__(self, source: SourceOptions):
        self.source = source

    def partitions(self) -> list[InputPartition]:
        """One group per ``docsPerPartition`` documents (one empty group for
        none): a partition's ``value`` is the tuple of ids its task reads.

        Connects even when the documents are given, so an unreachable Redis is
        reported while planning, not as a failed task.
        """
        with connected(self.source.url, self.source.cluster) as client:
            docs = list(self.source.docs if self.source.docs is not None else registered_documents(client))
        size = self.source.docs_per_partition
        return [InputPartition(tuple(docs[start : start + size])) for start in range(0, len(docs), size)] or [
            InputPartition(())
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        docs = getattr(partition, "value", None)
        if not docs:
            return
        with connected(self.source.url, self.source.cluster) as client:
            yield from table_batches(client, self.source, docs)


def spark_schema(source: SourceOptions) -> StructType:
    """The Spark schema of the table ``source`` selects (from its Arrow schema)."""
    return from_arrow_schema(arrow_schema(source))


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("yrelay")`` available on ``spark`` (once: a
    second registration would only replace the class with itself, and log a
    warning saying so)."""
    if not _registered(spark):
        spark.dataSource.register(YrelayDataSource)


def _registered(spark: SparkSession) -> bool:
    """Whether ``spark`` knows a data source named ``yrelay`` already.

    Asks the JVM's data source manager: PySpark has no public lookup. Where
    that is unavailable (Spark Connect), answers False and registration runs.
    """
    try:
        return bool(spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists(NAME))
    except Exception:  # noqa: BLE001 - any failure only means "register to be sure"
        return False


def redis_tables(
    spark: SparkSession, url: str, docs: list[str] | None = None, cluster: bool = False
) -> tuple[DataFrame, DataFrame]:
    """The (entries, tracker) DataFrames of yrelay's Redis at ``url``.

    ``docs``: those documents only (``[]`` reads none); None: every registered
    document. The URL and ids are checked and Redis is pinged here, in the
    driver, so mistakes raise a plain Python error rather than a Spark one.
    """
    options = {"url": url} if docs is None else {"url": url, "docs": ",".join(docs)}
    if cluster:
        options["cluster"] = "true"
    SourceOptions.parse(options)
    with connected(url, cluster):
        pass
    register(spark)
    return _load(spark, options, Kind.ENTRIES), _load(spark, options, Kind.TRACKER)


def _load(spark: SparkSession, options: dict[str, str], kind: Kind) -> DataFrame:
    return spark.read.format(NAME).options(**options, kind=kind.value).load()
