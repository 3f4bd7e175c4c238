"""The same job, unchanged, on a Spark standalone cluster: a master and one
worker started from the pyspark installation on 127.0.0.1, the ``yrelay
analyze`` CLI run against it in its own process (this test process already
holds a local SparkContext), and its Parquet tables equal to local mode's."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyspark
import pytest

from yrelay.spark_analytics.analysis import Options
from yrelay.spark_analytics.dashboard import DASHBOARD, read_table
from yrelay.spark_analytics.job import JobConfig, run
from yrelay.spark_analytics.tables import Table
from yrelay.storage.embedded import free_port
from yrelay_tools.analytics_data import Scenario, generate

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
START_TIMEOUT = 90.0


@dataclass
class Cluster:
    url: str
    ui: str
    work_dir: Path

    def state(self) -> dict:
        with urllib.request.urlopen(f"{self.ui}/json/", timeout=5) as response:
            return json.load(response)

    def alive_workers(self) -> int:
        """Workers registered with the master; 0 while its web UI is still starting (404, refused)."""
        try:
            return self.state().get("aliveworkers", 0)
        except (OSError, ValueError):
            return 0


def _env() -> dict[str, str]:
    """The worker's executors and the driver run this venv's Python, on loopback."""
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_HOME": str(SPARK_CLASS.parent.parent),
    }


def _start(args: list[str], log: Path) -> subprocess.Popen:
    with log.open("wb") as output:
        return subprocess.Popen(
            [str(SPARK_CLASS), *args], stdout=output, stderr=subprocess.STDOUT, env=_env(), start_new_session=True
        )


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _wait(what: str, ready, process: subprocess.Popen, log: Path) -> None:
    """Poll ``ready()`` until true; fail with the process's log if it died or never got there."""
    deadline = time.monotonic() + START_TIMEOUT
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{what} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster")
    port, ui_port, worker_ui = free_port(), free_port(), free_port()
    master = _start(
        [
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui_port),
        ],
        root / "master.log",
    )
    processes = [master]
    try:
        _wait("master", lambda: _listening(port) and _listening(ui_port), master, root / "master.log")
        cluster = Cluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}", root / "work")
        worker = _start(
            [
                "org.apache.spark.deploy.worker.Worker",
                cluster.url,
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--webui-port",
                str(worker_ui),
                "--work-dir",
                str(cluster.work_dir),
            ],
            root / "worker.log",
        )
        processes.append(worker)
        _wait("worker", lambda: cluster.alive_workers() == 1, worker, root / "worker.log")
        yield cluster
    finally:
        for process in reversed(processes):
            _stop(process)


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


@pytest.mark.timeout(300)
def test_the_cli_job_on_a_standalone_cluster_writes_the_local_tables(cluster, spark, tmp_path):
    generate(tmp_path / "events", Scenario(docs=2, readers=2, seconds=40))
    options = ["--bucket", "5", "--window", "10", "--top", "20"]
    command = [
        sys.executable,
        "-m",
        "yrelay",
        "analyze",
        "--events",
        str(tmp_path / "events"),
        "--out",
        str(tmp_path / "cluster"),
        "--master",
        cluster.url,
        *options,
    ]
    # The cluster's job runs in its own process while this one runs the local
    # job: neither waits for the other (the machine's cores are shared, not
    # the jobs' state).
    with (tmp_path / "cli.log").open("w+") as output:
        cli = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, text=True, env=_env())
        try:
            run(
                spark,
                JobConfig(
                    tmp_path / "events", tmp_path / "local", options=Options(bucket_seconds=5, window=10, top=20)
                ),
            )
            returncode = cli.wait(timeout=240)
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait()
        output.seek(0)
        assert returncode == 0, output.read()[-6000:]

    deadline = time.monotonic() + 60  # the master books the application completed once its driver is gone
    while not cluster.state()["completedapps"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [app["name"] for app in cluster.state()["completedapps"]] == ["yrelay-analyze"]
    assert list(cluster.work_dir.glob("app-*/*/stderr"))  # an executor of the worker did the work
    written = sorted(path.name for path in (tmp_path / "cluster").iterdir() if path.is_dir())
    assert written == sorted(path.name for path in (tmp_path / "local").iterdir() if path.is_dir())
    assert set(written) == set(Table.__members__[name.upper()].value for name in written)
    for name in written:
        on_cluster, local = (_sorted(read_table(tmp_path / where, Table(name))) for where in ("cluster", "local"))
        assert len(local) > 0, name
        pd.testing.assert_frame_equal(on_cluster, local, check_exact=True, obj=name)
    assert (tmp_path / "cluster" / DASHBOARD).stat().st_size > 3_000_000
