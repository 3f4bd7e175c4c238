"""Shared fixtures: a real redis-server, an in-process server, clients."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
import redis
import uvicorn
from hypothesis import settings
from redis.asyncio import Redis

from yrelay.app import create_app
from yrelay.client import Backoff, YrelayClient
from yrelay.config import Settings
from yrelay.storage.embedded import RedisProcess, free_port
from yrelay.storage.reads import DocumentStore

# Hypothesis's per-example deadline (200 ms) is a wall-clock bound: a busy
# machine missed it (test_offsets, 256 ms then 79 ms on the retry: "Unreliable
# test timings", issue 31) while no property here is about time.
settings.register_profile("yrelay", deadline=None)
settings.load_profile("yrelay")

if TYPE_CHECKING:  # imported by the fixture itself: only the cluster tests pay for it
    from yrelay_tools.testing.redis_cluster import LocalCluster

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


#: Seconds the shared SparkSession may take to start. It is started before
#: the first test that needs it, outside that test's pytest-timeout (a JVM
#: and its Python workers start in ~10 s on a quiet 2-core machine, and took
#: more than the 120 s test timeout on a busy one). The deadline is for a
#: start that hangs, not for a slow one.
SPARK_START_DEADLINE = 600.0

_spark: dict[str, object] = {}


def _start_spark() -> None:
    """Start the run's one local SparkSession (once), in a thread joined with
    :data:`SPARK_START_DEADLINE`: what went wrong is kept for the ``spark``
    fixture to report in each test that needs the session."""
    if _spark:
        return
    import threading

    def start() -> None:
        from yrelay.spark_analytics.session import spark_session

        try:
            _spark["session"] = spark_session("local[2]", **{"spark.ui.showConsoleProgress": "false"})
        except BaseException as error:  # noqa: BLE001 - reported by the fixture
            _spark["error"] = f"the SparkSession did not start: {error!r} (its output: {_spark['log']})"

    _spark["starting"] = True
    # The JVM (and the Python workers it starts) inherit stdout and stderr:
    # started between tests, outside pytest's capture, they would print
    # Spark's log and progress bars among the test results for the rest of
    # the run. They write to a file instead.
    _spark["log"] = log = Path(tempfile.gettempdir()) / f"yrelay-tests-spark-{os.getpid()}.log"
    saved = [os.dup(1), os.dup(2)]
    with open(log, "ab") as output:
        os.dup2(output.fileno(), 1)
        os.dup2(output.fileno(), 2)
    try:
        thread = threading.Thread(target=start, name="spark-start", daemon=True)
        thread.start()
        thread.join(SPARK_START_DEADLINE)
    finally:
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)
    if thread.is_alive():
        _spark["error"] = f"the SparkSession did not start within {SPARK_START_DEADLINE:.0f} s (its output: {log})"


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """The SparkSession starts before the timer of the first test that needs
    it (pytest-timeout's timer is set in its own, inner, wrapper of this
    hook), so no test is charged with the JVM's start-up."""
    if "spark" in getattr(item, "fixturenames", ()):
        _start_spark()
    yield
    if "spark" in getattr(item, "fixturenames", ()) and item.stash.get(_FAILED, False):
        _reset_py4j_connection()


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    if outcome.get_result().failed:
        item.stash[_FAILED] = True


def _reset_py4j_connection() -> None:
    """Close this thread's py4j connection after a failed Spark test.

    pytest-timeout fails a test by raising from a signal handler; inside a
    py4j call that leaves the answer of the interrupted command unread on the
    thread's connection (py4j recovers from an Exception, not from pytest's
    BaseException), and the failed test's traceback keeps the connection
    alive. Every later Spark call then read the answer of the call before
    it: "org.apache.spark.sql.classic.SparkSession does not exist in the
    JVM", or ``KeyError: 'c'`` (a class reference read as a value) in tests
    that had nothing wrong with them. A closed connection is replaced by a
    fresh one on the next call."""
    session = _spark.get("session")
    if session is None:
        return
    client = session.sparkContext._gateway._gateway_client  # type: ignore[attr-defined]
    connection = client.get_thread_connection()
    if connection is not None:
        connection.close(reset=True)


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole test run (starting one costs
    seconds): started by :func:`pytest_runtest_protocol` before the first
    test that needs it, stopped when the run ends."""
    _start_spark()  # already done, unless a test asks for the fixture indirectly
    if "error" in _spark:
        pytest.fail(str(_spark["error"]), pytrace=False)
    return _spark["session"]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    spark_session = _spark.pop("session", None)
    stopped = True
    if spark_session is not None:
        # A JVM already gone (killed, or out of memory on a crowded machine)
        # refuses the stop: a traceback out of this hook used to replace the
        # run's summary and its list of failures, so say so and go on.
        try:
            spark_session.stop()  # type: ignore[attr-defined]
        except Exception as error:  # noqa: BLE001 - reported; the tests' results stand
            stopped = False
            print(
                f"\nthe SparkSession could not be stopped (was its JVM gone?): {error!r}; "
                f"its output: {_spark.get('log')}",
                file=sys.stderr,
            )
    if "log" in _spark and exitstatus == 0 and stopped:
        Path(_spark["log"]).unlink(missing_ok=True)  # type: ignore[arg-type]


#: A test module that uses the ``spark`` fixture, in a test or in a
#: fixture of its own, as its source says it: how the xdist controller (which
#: collects nothing) knows which modules share the SparkSession's worker.
#: Collection checks the scan against the fixtures pytest resolved.
_USES_SPARK = re.compile(r"^\s*(?:async\s+)?def \w+\([^)]*\bspark\b", re.M)
TESTS_DIR = Path(__file__).resolve().parent


def spark_modules() -> frozenset[str]:
    """The test modules that use the SparkSession, as node id prefixes."""
    return frozenset(
        f"{TESTS_DIR.name}/{path.name}" for path in TESTS_DIR.glob("test_*.py") if _USES_SPARK.search(path.read_text())
    )


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """How ``make test`` shares the suite between its pytest-xdist workers
    (``-n 2``): a module's tests stay on one worker, so its module-scoped
    servers start once, and the modules that use the SparkSession all go to
    one worker, so the run still starts one (xdist's ``loadgroup`` would do
    it with marks, but it renames node ids in a way pytest 9 ignores). That
    group is handed out first, being the longest (~3 minutes, with the
    standalone-cluster test), while the other worker takes the many short
    modules. ``--dist each`` or ``worksteal`` keep xdist's own schedulers."""
    if config.getvalue("dist") not in {"load", "loadscope", "loadfile", "loadgroup"}:
        return None
    from xdist.scheduler import LoadScopeScheduling

    spark = spark_modules()

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "spark" if module in spark else module

    return ModuleScheduling(config, log)  # type: ignore[arg-type]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Check :func:`spark_modules`' scan against the fixtures pytest
    resolved (a module it missed would start a second SparkSession on the
    other worker); in an xdist worker, put the Spark modules first, so the
    longest work unit is handed out first."""
    using = {item.nodeid.split("::")[0] for item in items if "spark" in getattr(item, "fixturenames", ())}
    missed = using - spark_modules()
    if missed:
        raise pytest.UsageError(
            f"tests/conftest.py's spark_modules() missed {sorted(missed)}: name the "
            "`spark` fixture in a def's parameters of that module"
        )
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.nodeid.split("::")[0] not in using)  # stable: modules keep their order


@pytest.fixture(autouse=True)
def _root_logger_kept() -> Iterator[None]:
    """The root logger's handlers and level as they were before each test.

    A test that runs a CLI command in process (``CliRunner().invoke(cli,
    ["serve", ...])``) has ``yrelay.observability.logs.configure`` put a handler on the
    root logger that writes to the runner's stderr, closed once the command
    returns, and set the root level to INFO: every INFO record of every
    later test, and of the interpreter's shutdown (py4j closing its
    connections), went through it to "--- Logging error --- ValueError: I/O
    operation on closed file". pytest's own capture handlers come and go with
    each phase of a test and are left to pytest."""
    root = logging.getLogger()

    def own(handler: logging.Handler) -> bool:
        return not type(handler).__module__.startswith("_pytest")

    level, handlers = root.level, [handler for handler in root.handlers if own(handler)]
    yield
    for handler in [handler for handler in root.handlers if own(handler) and handler not in handlers]:
        root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def redis_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """One redis-server (AOF on) for the whole run; tests flush it."""
    with RedisProcess(tmp_path_factory.mktemp("redis")) as process:
        yield process


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
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


@pytest.fixture
async def store(redis_client: Redis) -> DocumentStore:
    """A document store on the test's redis-server, its scripts loaded."""
    store = DocumentStore(redis_client)
    await store.load_scripts()
    return store


#: The /ops token of the ``ops`` server, and the header that presents it.
OPS_TOKEN = "ops-secret-for-tests"
OPS_AUTH = {"Authorization": f"Bearer {OPS_TOKEN}"}


@pytest.fixture
async def ops(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on a running server whose /ops endpoints take ``OPS_AUTH``."""
    async with running_server(redis_url, ops_token=OPS_TOKEN, gc_interval=0) as ws_url:
        base = ws_url.replace("ws://", "http://").removesuffix("/ws")
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            yield client


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
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options))  # type: ignore[arg-type]
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

    from yrelay.yjs import crdt

    async with running_server(redis_url, gc_interval=0, data_dir=data_dir, ops_token="t") as url:
        writer, reader = await make_client(url), await make_client(url)
        wdoc, rdoc = await writer.subscribe(doc), await reader.subscribe(doc)
        for i in range(edits):
            crdt.insert_text(wdoc.ydoc, 0, f"<{i}>")
        await writer.wait_idle()
        await eventually(lambda: rdoc.text == wdoc.text)
        async with httpx.AsyncClient(base_url=url.replace("ws://", "http://").removesuffix("/ws")) as ops:
            response = await ops.delete(
                f"/ops/docs/{doc}/sessions/{reader.session}", headers={"Authorization": "Bearer t"}
            )
            assert response.status_code == 204
        await writer.close()
        await reader.close()
    return writer.session, reader.session
