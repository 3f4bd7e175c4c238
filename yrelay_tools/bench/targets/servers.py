"""The four servers under test."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from yrelay.storage.embedded import RedisProcess
from yrelay_tools.bench.drivers import Y_WEBSOCKET, YRELAY, YWS
from yrelay_tools.bench.targets.base import Target
from yrelay_tools.testing.processes import ServerProcess
from yrelay_tools.testing.redis_cluster import LocalCluster

#: Where bench/node (package.json, npm ci) lives in a checkout.
NODE_DIR = Path(os.environ.get("YRELAY_BENCH_NODE_DIR", Path(__file__).resolve().parents[3] / "bench" / "node"))

IN_MEMORY = "in memory, at most once"


#: The generator is one address sending far past any person's rate, so the
#: per-client limits (docs/operations.md#limits, tested in test_limits.py)
#: would measure themselves; they are off (0) unless a target sets them.
PER_CLIENT_LIMITS_OFF = {
    "YRELAY_UPDATES_PER_SECOND": "0",
    "YRELAY_ADMISSION_RATE": "0",
    "YRELAY_MAX_CONNECTIONS_PER_ADDRESS": "0",
    "YRELAY_SUBJECT_UPDATES_PER_SECOND": "0",
    "YRELAY_MAX_SUBSCRIPTIONS_PER_SUBJECT": "0",
    "YRELAY_SUBJECT_PRESENCE_PER_SECOND": "0",
    "YRELAY_PRESENCE_PER_SECOND": "0",
    "YRELAY_FRAMES_PER_SECOND": "0",
    "YRELAY_CONTROL_PER_SECOND": "0",
    "YRELAY_ANSWER_BYTES_PER_SECOND": "0",
    "YRELAY_SUBJECT_ANSWER_BYTES_PER_SECOND": "0",
}


class YrelayTarget(Target):
    """``yrelay serve`` (defaults: event log and GC on) on a fresh redis-server
    with appendonly yes, appendfsync always: every ack is durable."""

    name = "yrelay"
    protocol = YRELAY
    note = "durable acks (appendfsync always)"
    #: What ``python -m`` runs with ``serve --port ... --redis-url ...``.
    module = "yrelay"

    def __init__(
        self, work_dir: Path, env: dict[str, str] | None = None, tree: str | None = None, fsync: str = "always"
    ):
        """``tree``: run the server from another checkout (PYTHONPATH), to
        compare two builds in one run (``--targets yrelay,yrelay@../main``);
        ``fsync``: Redis's ``appendfsync``."""
        super().__init__(work_dir)
        self.fsync = fsync
        self.env = {**(env or {}), **({"PYTHONPATH": str(Path(tree).resolve())} if tree else {})}
        #: ``python -m`` imports from its working directory before PYTHONPATH:
        #: without this, every tree ran the checkout the bench started in.
        self.cwd = Path(tree).resolve() if tree else None
        if tree:
            self.name = f"yrelay@{tree}"
        self.redis: RedisProcess | None = None
        self.server: ServerProcess | None = None

    def start(self) -> YrelayTarget:
        self.redis = RedisProcess(self.work_dir / f"redis-{self.port}", fsync=self.fsync).start()
        return self._serve(self.redis.url)

    def _serve(self, redis_url: str) -> YrelayTarget:
        self.server = ServerProcess(
            redis_url,
            self.work_dir,
            port=self.port,
            env={"YRELAY_DATA_DIR": str(self.work_dir / f"data-{self.port}"), **PER_CLIENT_LIMITS_OFF, **self.env},
            cwd=self.cwd,
            module=self.module,
        )
        self.server.start(timeout=60)
        self.process = self.server.process
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self._stop_redis()
        self.process = None

    def _stop_redis(self) -> None:
        if self.redis is not None:
            self.redis.stop()

    def pids(self) -> dict[str, int]:
        """The server and Redis; with YRELAY_WORKERS > 1 the server is a
        supervisor, and its worker servers are counted too (their own
        validators are not, as a single server's are not)."""
        assert self.server is not None and self.server.process and self.redis is not None and self.redis.process
        workers = self.env.get("YRELAY_WORKERS", os.environ.get("YRELAY_WORKERS", "1")) not in ("", "1")
        children = _children(self.server.process.pid) if workers else []
        return {
            "server": self.server.process.pid,
            **{f"worker{i}": pid for i, pid in enumerate(children)},
            "redis": self.redis.process.pid,
        }

    def helper_pids(self) -> tuple[int, ...]:
        """A single server's validator and engine worker processes (the
        update's engine work; issue 32 compares one engine there with two)."""
        assert self.server is not None and self.server.process
        workers = self.env.get("YRELAY_WORKERS", os.environ.get("YRELAY_WORKERS", "1")) not in ("", "1")
        return () if workers else tuple(_children(self.server.process.pid))

    @property
    def redis_url(self) -> str | None:
        return self.redis.url if self.redis else None


class PycrdtTarget(Target):
    """pycrdt-websocket (PyPI) under uvicorn + uvloop: rooms in memory.

    Seen with 0.16.5: concurrent first connections to one room can split it,
    and a server whose earlier rooms were cleaned up may stop delivering; so
    it is started fresh for every run and connections open one at a time."""

    name = "pycrdt-websocket"
    protocol = Y_WEBSOCKET
    note = IN_MEMORY + "; fresh per run, connections one at a time"
    parallel_connects = 1

    def start(self) -> PycrdtTarget:
        self._spawn([sys.executable, "-m", "yrelay_tools.bench.targets.pycrdt_server", "--port", str(self.port)])
        return self


class NodeYWebsocketTarget(Target):
    """The reference server of y-websocket 1.5.4 (bin/server.js) on Node."""

    name = "y-websocket 1.5.4 (Node)"
    protocol = Y_WEBSOCKET
    note = IN_MEMORY

    def start(self) -> NodeYWebsocketTarget:
        script = NODE_DIR / "node_modules" / "y-websocket" / "bin" / "server.js"
        node = shutil.which("node")
        if node is None or not script.is_file():
            raise RuntimeError(f"needs node and `npm ci` in {NODE_DIR}")
        self._spawn([node, str(script)], env={"HOST": self.host, "PORT": str(self.port)})
        return self


class BroadcastTarget(Target):
    """A bare uvicorn websocket app that relays every message to its room:
    what the Python web stack costs, with nothing stored or decoded."""

    name = "bare uvicorn broadcast"
    protocol = Y_WEBSOCKET
    note = "relays bytes, keeps nothing (ceiling of the web stack)"

    def start(self) -> BroadcastTarget:
        self._spawn([sys.executable, "-m", "yrelay_tools.bench.targets.broadcast", "--port", str(self.port)])
        return self


class YrelayEmbeddedTarget(YrelayTarget):
    """The same relay embedded in a FastAPI host app (``relay.install``),
    under uvicorn: :mod:`.embedded`."""

    name = "yrelay embedded"
    module = "yrelay_tools.bench.targets.embedded"


class YrelayYwsTarget(YrelayTarget):
    """The same server, driven with the y-websocket protocol on ``/yws``:
    appends as durable, no acks (the client protocol has none)."""

    name = "yrelay /yws"
    protocol = YWS
    note = "y-websocket protocol on /yws: durable appends, no acks"


class YrelayClusterTarget(YrelayTarget):
    """``yrelay serve --redis-cluster`` on a fresh Redis Cluster of ``masters``
    shards, a replica each (appendfsync everysec, as a cluster is run:
    durability from the replica, ``ack_replicas`` 0 by default). Every
    node's CPU counts (``redisN`` masters, ``replicaN`` replicas)."""

    note = "Redis Cluster, appendfsync everysec, ack_replicas 0"

    def __init__(self, work_dir: Path, masters: int, env: dict[str, str] | None = None):
        super().__init__(work_dir, env={"YRELAY_REDIS_CLUSTER": "1", **(env or {})})
        self.masters = masters
        self.name = f"yrelay, {masters}-shard cluster"
        self.cluster: LocalCluster | None = None

    def start(self) -> YrelayClusterTarget:
        self.cluster = LocalCluster(self.work_dir / f"cluster-{self.port}", masters=self.masters).start()
        self._serve(self.cluster.url)
        return self

    def _stop_redis(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()

    def pids(self) -> dict[str, int]:
        assert self.server is not None and self.server.process and self.cluster is not None
        topology = self.cluster.topology()
        masters = {f"redis{i}": self.cluster.node(port) for i, port in enumerate(topology)}
        replicas = {f"replica{i}": self.cluster.node(port) for i, port in enumerate(topology.values()) if port}
        return {
            "server": self.server.process.pid,
            **{name: node.process.pid for name, node in {**masters, **replicas}.items() if node.process},
        }

    @property
    def redis_url(self) -> str | None:
        return None  # one node's used_memory is not the cluster's: not measured


TARGETS: dict[str, type[Target]] = {
    "yrelay": YrelayTarget,
    "yrelay-yws": YrelayYwsTarget,
    "yrelay-embedded": YrelayEmbeddedTarget,
    "pycrdt": PycrdtTarget,
    "node": NodeYWebsocketTarget,
    "broadcast": BroadcastTarget,
}


def _children(pid: int) -> list[int]:
    """Child process ids of ``pid`` (Linux)."""
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def make_target(key: str, work_dir: Path) -> Target:
    """``yrelay``, ``yrelay-yws``, ``yrelay-embedded``, ``pycrdt``, ``node``, ``broadcast``, ``yrelay@<checkout>``,
    ``yrelay-yws@<checkout>`` or
    ``yrelay+<SETTING>=<value>`` or ``yrelay-cluster<N>`` (N shards)."""
    if key.startswith("yrelay-cluster"):
        return YrelayClusterTarget(work_dir, masters=int(key[len("yrelay-cluster") :] or 3))
    if key.startswith("yrelay@"):
        return YrelayTarget(work_dir, tree=key.split("@", 1)[1])
    if key.startswith("yrelay-yws@"):  # the /yws protocol of another checkout
        yws = YrelayYwsTarget(work_dir, tree=key.split("@", 1)[1])
        yws.name = f"yrelay /yws@{key.split('@', 1)[1]}"
        return yws
    if key.startswith(
        "yrelay+"
    ):  # yrelay+NAME=VALUE: a setting changed (e.g. YRELAY_EVENT_LOG=0), or Redis's appendfsync
        name, value = key[len("yrelay+") :].split("=", 1)
        if name == "appendfsync":  # Redis's, not the server's
            target = YrelayTarget(work_dir, fsync=value)
            target.note = f"acks after a write to the AOF (appendfsync {value})"
        else:
            target = YrelayTarget(work_dir, env={name: value})
        target.name = f"yrelay ({name}={value})"
        return target
    return TARGETS[key](work_dir)
