"""The processes under test: K ``yrelay serve`` processes on one redis-server
(AOF on), optionally with a replica to fail over to.

Every method here is blocking (processes start and are waited for); the
harness calls them in a worker thread so that the proxies keep running.
Ports are random and on 127.0.0.1; a server keeps its port across restarts,
so the proxies need not be told.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis as redis_sync

from yrelay.storage.embedded import RedisProcess
from yrelay_tools.testing.processes import ServerProcess

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterConfig:
    servers: int = 3
    #: ``appendfsync`` of every redis-server: ``always`` or ``everysec``.
    fsync: str = "always"
    #: Keep a replica to fail over to (the failover fault needs one).
    replica: bool = True
    #: ``YRELAY_*`` settings of the server processes.
    server_env: dict[str, str] = field(default_factory=dict)
    #: ``python -m`` module of the servers (a broken build in tests).
    server_module: str = "yrelay"


class Cluster:
    is_cluster = False

    def __init__(self, root: Path, config: ClusterConfig):
        self.root = root
        self.config = config
        self._generation = 0
        self.primary = self._new_redis()
        self.replica: RedisProcess | None = None
        self.servers = [
            ServerProcess(self.primary.url, root / "servers", env=self._server_env(index), module=config.server_module)
            for index in range(config.servers)
        ]
        #: Failovers done, and the ports of primaries given up (for the report).
        self.failovers = 0

    def _server_env(self, index: int) -> dict[str, str]:
        return {"YRELAY_DATA_DIR": str(self.root / "servers" / f"server-{index}"), **self.config.server_env}

    def _new_redis(self, replica_of: RedisProcess | None = None) -> RedisProcess:
        self._generation += 1
        extra = {"replicaof": f"127.0.0.1 {replica_of.port}"} if replica_of else {}
        return RedisProcess(self.root / f"redis-{self._generation}", fsync=self.config.fsync, extra_config=extra)

    @property
    def redis_url(self) -> str:
        return self.primary.url

    def server_ports(self) -> list[int]:
        return [server.port for server in self.servers]

    # --------------------------------------------------------------- life cycle

    def start(self) -> None:
        self.primary.start()
        if self.config.replica:
            self._start_replica()
        for server in self.servers:
            server.start()

    def stop(self) -> None:
        for server in self.servers:
            server.resume()
            server.kill()
        for process in (self.replica, self.primary):
            if process is not None:
                process.stop()

    def _start_replica(self) -> None:
        self.replica = self._new_redis(replica_of=self.primary).start()

    def wait_replica_linked(self, timeout: float = 20.0) -> bool:
        """Until the replica's link is up and it has everything written so far."""
        if self.replica is None:
            return False
        replica = redis_sync.Redis(port=self.replica.port, socket_timeout=2)
        primary = redis_sync.Redis(port=self.primary.port, socket_timeout=timeout + 2)
        try:
            deadline = time.monotonic() + timeout
            while replica.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)
            return primary.wait(1, int(timeout * 1000)) >= 1
        except redis_sync.RedisError:
            return False
        finally:
            replica.close()
            primary.close()

    # ------------------------------------------------------------------- faults

    def kill_server(self, index: int) -> None:
        self.servers[index].resume()
        self.servers[index].kill()

    def start_server(self, index: int) -> None:
        self.servers[index].start(timeout=60)

    def pause_server(self, index: int) -> None:
        self.servers[index].pause()

    def resume_server(self, index: int) -> None:
        self.servers[index].resume()

    def kill_redis(self) -> None:
        """SIGKILL of the primary: whatever its AOF has is what comes back."""
        self.primary.kill()

    def start_redis(self) -> None:
        self.primary.start(timeout=60)

    def promote_replica(self) -> None:
        """Step one of a failover: the replica stops replicating and accepts
        writes, while the primary (and the servers on it) carry on acking
        updates the replica will never have."""
        assert self.replica is not None, "the failover fault needs a replica"
        client = redis_sync.Redis(port=self.replica.port, socket_timeout=5)
        try:
            client.replicaof("NO", "ONE")
        finally:
            client.close()

    def finish_failover(self) -> None:
        """Step two: the old primary dies, the servers are pointed at the
        promoted replica (restarted on their ports), and a fresh replica of
        the new primary is started for the next failover."""
        assert self.replica is not None
        for server in self.servers:
            server.resume()
            server.kill()
        self.primary.kill()
        self.primary, self.replica = self.replica, None
        self.primary.extra_config.pop("replicaof", None)  # a restart from its AOF must stay a primary
        self.failovers += 1

    def restart_servers(self) -> None:
        for server in self.servers:
            server.redis_url = self.primary.url
            server.start(timeout=60)
        if self.config.replica:
            self._start_replica()
