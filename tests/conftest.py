"""Shared fixtures: a real redis-server, an in-process server, clients."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import uvicorn
from redis.asyncio import Redis

from yrelay.app import create_app
from yrelay.client import Backoff, YrelayClient
from yrelay.config import Settings
from yrelay.redis_server import RedisProcess, free_port

FAST_BACKOFF = Backoff(base=0.05, max_delay=0.5, max_attempts=30)


@pytest.fixture(scope="session", autouse=True)
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Servers started by tests keep their data (event log) in a temporary
    directory, never in the checkout."""
    path = tmp_path_factory.mktemp("data")
    previous = os.environ.get("YRELAY_DATA_DIR")
    os.environ["YRELAY_DATA_DIR"] = str(path)
    # Servers in tests (in process and child processes) run without
    # authentication unless a test turns it on (tests/test_auth.py).
    os.environ.setdefault("YRELAY_INSECURE_NO_AUTH", "1")
    yield path
    if previous is None:
        os.environ.pop("YRELAY_DATA_DIR", None)
    else:
        os.environ["YRELAY_DATA_DIR"] = previous


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole test run (starting one costs seconds)."""
    from yrelay.spark_analytics.session import spark_session

    # py4j logs each closed gateway connection at INFO, through a root handler
    # a test that configured yrelay's logging left on a closed capture stream.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    session = spark_session("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def redis_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """One redis-server (AOF on) for the whole run; tests flush it."""
    with RedisProcess(tmp_path_factory.mktemp("redis")) as process:
        yield process


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator["LocalCluster"]:
    """A Redis Cluster (3 masters, a replica each) for a test module; its
    tests flush it (tests/clusterutil.py)."""
    from yrelay_tools.testing.redis_cluster import LocalCluster

    cluster = LocalCluster(tmp_path_factory.mktemp("cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_url(redis_process: RedisProcess) -> str:
    redis.Redis.from_url(redis_process.url).flushall()
    return redis_process.url


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


@contextlib.asynccontextmanager
async def running_server(redis_url: str, port: int | None = None, **overrides: object) -> AsyncIterator[str]:
    """An app served by uvicorn inside the test's event loop; yields its ws URL."""
    port = port or free_port()
    settings = Settings.from_env(**{"resend_after": 0.5, "resend_check_interval": 0.1, "port": port, **overrides})
    async with serving(create_app(settings, redis_url), port, **settings.uvicorn_options()):
        yield f"ws://127.0.0.1:{port}/ws"


@contextlib.asynccontextmanager
async def serving(app: object, port: int, **options: object) -> AsyncIterator[None]:
    """Any ASGI app served by uvicorn on ``port`` inside the test's event loop."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           **options))  # type: ignore[arg-type]
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


@pytest.fixture
async def server_url(redis_url: str) -> AsyncIterator[str]:
    async with running_server(redis_url) as url:
        yield url


@pytest.fixture
async def make_client() -> AsyncIterator:
    clients: list[YrelayClient] = []

    async def make(url: str, **kwargs: object) -> YrelayClient:
        client = YrelayClient(url, backoff=kwargs.pop("backoff", FAST_BACKOFF), **kwargs)  # type: ignore[arg-type]
        clients.append(client)
        return await client.connect()

    yield make
    for client in clients:
        await client.close()


async def eventually(predicate, timeout: float = 10.0, interval: float = 0.02) -> None:
    """Poll ``predicate`` until it is true; fail with its last value otherwise."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval)


async def edit_then_evict_reader(redis_url: str, make_client, data_dir: Path, doc: str, edits: int) -> tuple[str, str]:
    """A served scenario the event-log and analytics tests share: a writer
    types ``edits`` tokens, a reader receives them all, an operator evicts the
    reader through the ops endpoint, and the server stops (its log flushed).
    Returns the (writer, reader) session ids."""
    import httpx

    from yrelay import crdt

    async with running_server(redis_url, gc_interval=0, data_dir=data_dir, ops_token="t") as url:
        writer, reader = await make_client(url), await make_client(url)
        wdoc, rdoc = await writer.subscribe(doc), await reader.subscribe(doc)
        for i in range(edits):
            crdt.insert_text(wdoc.ydoc, 0, f"<{i}>")
        await writer.wait_idle()
        await eventually(lambda: rdoc.text == wdoc.text)
        async with httpx.AsyncClient(base_url=url.replace("ws://", "http://").removesuffix("/ws")) as ops:
            response = await ops.delete(f"/ops/docs/{doc}/sessions/{reader.session}",
                                        headers={"Authorization": "Bearer t"})
            assert response.status_code == 204
        await writer.close()
        await reader.close()
    return writer.session, reader.session
