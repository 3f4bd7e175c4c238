"""Building the SparkSession every yrelay job and test uses."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession


def spark_session(master: str = "local[*]", app_name: str = "yrelay-analytics", **config: str) -> SparkSession:
    """A SparkSession on ``master`` (``local[*]``, ``spark://host:port``).

    Spark's Python workers must run this interpreter (pyarrow, yrelay), so
    ``PYSPARK_PYTHON`` is pinned to it. The UI is off and shuffles are small:
    these jobs run on a laptop-sized machine more often than on a cluster.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", config.pop("spark.sql.shuffle.partitions", "4"))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
    )
    for key, value in config.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
