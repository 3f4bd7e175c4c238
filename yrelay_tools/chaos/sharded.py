"""The processes under test on the cluster topology (``yrelay chaos
--cluster``): K ``yrelay serve --redis-cluster`` processes on a Redis Cluster
of 3 masters with a replica each (:class:`LocalCluster`, the one the tests
start), and the cluster's own faults: a master SIGKILLed (its replica takes
over after ``cluster-node-timeout``, missing whatever it had not received),
``CLUSTER FAILOVER`` (a coordinated switch: the replica catches up first) and
a document's slot migrated to another master during edits.

Same interface as :class:`yrelay_tools.chaos.cluster.Cluster` for what the
nemesis and the run share (servers, ``redis_url``, server faults); every
method is blocking, the harness calls them in a worker thread.
"""

from __future__ import annotations

import logging
from pathlib import Path

from redis.crc import key_slot

from yrelay_tools.chaos.cluster import ClusterConfig
from yrelay_tools.testing.processes import ServerProcess
from yrelay_tools.testing.redis_cluster import LocalCluster

log = logging.getLogger(__name__)


class ShardedCluster:
    is_cluster = True

    def __init__(self, root: Path, config: ClusterConfig, masters: int = 3):
        self.root = root
        self.config = config
        self.redis = LocalCluster(root / "redis-cluster", masters=masters)
        self.servers: list[ServerProcess] = []
        self.failovers = 0

    @property
    def redis_url(self) -> str:
        """A live node's URL: the seed of a cluster client (any node will do)."""
        return next(node.url for node in self.redis.nodes if node.process is not None)

    def server_ports(self) -> list[int]:
        return [server.port for server in self.servers]

    def masters(self) -> list[int]:
        """The masters' ports, in a stable order (a fault's target indexes it)."""
        return sorted(self.redis.topology())

    # --------------------------------------------------------------- life cycle

    def start(self) -> None:
        self.redis.start()
        env = {"YRELAY_REDIS_CLUSTER": "1", **self.config.server_env}
        self.servers = [
            ServerProcess(
                self.redis_url,
                self.root / "servers",
                module=self.config.server_module,
                env={"YRELAY_DATA_DIR": str(self.root / "servers" / f"server-{index}"), **env},
            )
            for index in range(self.config.servers)
        ]
        for server in self.servers:
            server.start(timeout=60)

    def stop(self) -> None:
        for server in self.servers:
            server.resume()
            server.kill()
        self.redis.stop()

    # ------------------------------------------------------------ server faults

    def kill_server(self, index: int) -> None:
        self.servers[index].resume()
        self.servers[index].kill()

    def start_server(self, index: int) -> None:
        self.servers[index].redis_url = self.redis_url  # its seed may be a node killed since
        self.servers[index].start(timeout=60)

    def pause_server(self, index: int) -> None:
        self.servers[index].pause()

    def resume_server(self, index: int) -> None:
        self.servers[index].resume()

    # ----------------------------------------------------------- cluster faults

    def kill_master(self, target: int) -> tuple[int, int]:
        """SIGKILL a master; returns (its port, the port of the replica that
        took over) once the replica is master."""
        master = self.masters()[target % self.redis.masters]
        return master, self.redis.kill_master(master)

    def restart_node(self, port: int) -> None:
        """The killed node back (as a replica of its successor), and every
        master with a linked replica again before the next fault."""
        self.redis.restart(port, timeout=60)
        self.failovers += 1

    def cluster_failover(self, target: int) -> tuple[int, int]:
        """``CLUSTER FAILOVER`` on a master's replica: (old, new master)."""
        self.redis.wait_healthy(60)
        master = self.masters()[target % self.redis.masters]
        new = self.redis.failover(master, timeout=60)
        self.failovers += 1
        return master, new

    def migrate_document(self, doc: str, target: int) -> tuple[int, int, int]:
        """Move the slot of ``doc``'s keys (its hash tag) to another master:
        (slot, from, to)."""
        self.redis.wait_healthy(60)
        slot = key_slot(doc.encode())
        source = self.redis.master_of_slot(slot)
        others = [port for port in self.masters() if port != source]
        destination = others[target % len(others)]
        self.redis.migrate_slot(slot, destination, timeout=30)
        return slot, source, destination
