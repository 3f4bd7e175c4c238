"""A real Redis Cluster on loopback (tests, ``yrelay chaos --cluster``, the
bench): N masters with a replica each,
made of the same redis-server binary as the other fixtures (cluster mode),
joined by ``redis-cli --cluster create``. Starts in a few seconds."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from yrelay.storage.embedded import RedisProcess, ephemeral_low, find_redis_server


def cluster_port() -> int:
    """A free port whose cluster bus port (+10,000) is free too, both below
    the kernel's ephemeral range (:func:`yrelay.storage.embedded.free_port`
    says why)."""
    top = max(ephemeral_low() - 10_000, 12_000)
    while True:
        port = random.randrange(10_000, top)
        try:
            for candidate in (port, port + 10_000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port


def cluster_node(data_dir: Path) -> RedisProcess:
    return RedisProcess(
        data_dir,
        cluster_port(),
        fsync="everysec",
        extra_config={
            "cluster-enabled": "yes",
            "cluster-config-file": str(data_dir / "nodes.conf"),
            "cluster-node-timeout": "2000",
            # A replica of a lost master may take over even if it lagged a while.
            "cluster-replica-validity-factor": "0",
        },
    )


def start_node(data_dir: Path, attempts: int = 5) -> RedisProcess:
    """A started node, on another port when the one picked was taken meanwhile."""
    for attempt in range(attempts):
        node = cluster_node(data_dir)
        try:
            return node.start()
        except RuntimeError:
            node.stop()
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@dataclass
class LocalCluster:
    """``masters`` masters, each with one replica, under ``data_dir``."""

    data_dir: Path
    masters: int = 3
    nodes: list[RedisProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        """A seed node's URL (what ``--redis-url`` gets with ``--redis-cluster``)."""
        return self.nodes[0].url

    def start(self, timeout: float = 30.0) -> LocalCluster:
        self.nodes = [start_node(self.data_dir / f"node{i}") for i in range(2 * self.masters)]
        if self.masters >= 3:
            cli = str(Path(find_redis_server()).with_name("redis-cli"))
            subprocess.run(
                [
                    cli,
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{node.port}" for node in self.nodes),
                    "--cluster-replicas",
                    "1",
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=timeout,
            )
        else:
            self._create_by_hand(timeout)
        self.wait_healthy(timeout)
        return self

    def _create_by_hand(self, timeout: float) -> None:
        """What ``redis-cli --cluster create`` does, for fewer than the three
        masters it insists on (a 1-shard cluster to compare against)."""
        masters, replicas = self.nodes[: self.masters], self.nodes[self.masters :]
        share = 16384 // self.masters
        for index, node in enumerate(masters):
            end = 16384 if index == self.masters - 1 else (index + 1) * share
            with self.client(node) as client:
                client.execute_command("CLUSTER ADDSLOTS", *range(index * share, end))
        with self.client(self.nodes[0]) as client:
            for node in self.nodes[1:]:
                client.execute_command("CLUSTER MEET", "127.0.0.1", node.port)
        deadline = time.monotonic() + timeout
        for replica, master in zip(replicas, masters, strict=True):
            master_id = self.node_id(master.port)
            while True:
                try:
                    with self.client(replica) as client:
                        client.execute_command("CLUSTER REPLICATE", master_id)
                    break
                except redis.ResponseError:  # the replica has not heard of the master yet
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

    def client(self, node: RedisProcess) -> redis.Redis:
        return redis.Redis(port=node.port, socket_timeout=5)

    def topology(self) -> dict[int, int | None]:
        """master port -> the port of its replica (None when it has none), as
        every node agrees on it; raises if the nodes disagree or the cluster
        is not ok."""
        views = []
        for node in self.nodes:
            if node.process is None:
                continue
            try:
                with self.client(node) as client:
                    if client.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                        raise RuntimeError(f"node {node.port} does not see the cluster ok")
                    views.append(parse_nodes(client.execute_command("CLUSTER NODES")))
            except redis.ConnectionError as exc:
                raise RuntimeError(f"node {node.port} unreachable ({exc}): {node.log_tail()}") from None
        if any(view != views[0] for view in views):
            raise RuntimeError("nodes disagree on the topology")
        return views[0]

    def wait_healthy(self, timeout: float = 30.0) -> dict[int, int | None]:
        """Wait until every live node sees the same topology, every master
        has slots and a replica in sync (``master_link_status:up``)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                topology = self.topology()
                if len(topology) == self.masters and all(topology.values()) and self._replicas_linked(topology):
                    return topology
            except (RuntimeError, redis.RedisError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the cluster did not become healthy")
            time.sleep(0.1)

    def _replicas_linked(self, topology: dict[int, int | None]) -> bool:
        for replica in topology.values():
            if replica is None:
                return False
            with redis.Redis(port=replica, socket_timeout=5) as client:
                if client.info("replication").get("master_link_status") != "up":
                    return False
        return True

    def node(self, port: int) -> RedisProcess:
        return next(node for node in self.nodes if node.port == port)

    def master_of_slot(self, slot: int) -> int:
        live = next(node for node in self.nodes if node.process is not None)  # node 0 may be a killed master
        with self.client(live) as client:
            for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    return int(master[1])
        raise LookupError(slot)

    def node_id(self, port: int) -> str:
        with redis.Redis(port=port, socket_timeout=5) as client:
            reply: bytes = client.execute_command("CLUSTER MYID")
            return reply.decode()

    def failover(self, master: int, timeout: float = 30.0) -> int:
        """``CLUSTER FAILOVER`` on ``master``'s replica (a coordinated
        switch: the replica catches up, then takes the slots); returns the
        new master's port once the cluster is healthy again."""
        replica = self.topology()[master]
        assert replica is not None
        with redis.Redis(port=replica, socket_timeout=5) as client:
            client.execute_command("CLUSTER FAILOVER")
        deadline = time.monotonic() + timeout
        while self.wait_healthy(timeout).get(replica) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{replica} did not take over from {master}")
            time.sleep(0.1)
        return replica

    def kill_master(self, master: int, timeout: float = 30.0) -> int:
        """SIGKILL ``master`` and wait until its replica took over (after
        ``cluster-node-timeout``); returns the new master's port. Start the
        killed node again with :meth:`restart` (from the main thread: a
        node started from a worker thread gets SIGTERM when that thread
        ends, by its parent-death signal)."""
        replica = self.topology()[master]
        assert replica is not None
        self.node(master).kill()
        self.wait_promoted(replica, timeout)
        self.wait_forgotten_as_master(master, timeout)
        return replica

    def wait_forgotten_as_master(self, port: int, timeout: float = 30.0) -> None:
        """Wait until no live node's slot map names ``port`` as a master.
        The promoted replica knows at once; the others hear it by gossip a
        moment later, and a cluster client seeded by one of them would be
        sent to the dead node meanwhile (seen: a chaos run's probe after a
        master kill, refused, failed the run)."""
        deadline = time.monotonic() + timeout
        while True:
            stale = []
            for node in self.nodes:
                if node.process is None or node.port == port:
                    continue
                try:
                    with self.client(node) as client:
                        slots = client.execute_command("CLUSTER SLOTS")
                except redis.RedisError:
                    stale.append(node.port)
                    continue
                if any(int(master[1]) == port for _start, _end, master, *_ in slots):
                    stale.append(node.port)
            if not stale:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes {stale} still name {port} as a master")
            time.sleep(0.05)

    def wait_promoted(self, replica: int, timeout: float = 30.0) -> None:
        """Wait until ``replica`` says it is a master (its old master failed)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with redis.Redis(port=replica, socket_timeout=5) as client:
                    if client.execute_command("ROLE")[0] == b"master":
                        return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{replica} did not take over")
            time.sleep(0.1)

    def cut_off_replica(self, master: int) -> int:
        """Freeze ``master``'s replica (SIGSTOP) and close its replication
        link: the master goes on taking writes the replica never gets, what
        asynchronous replication loses if the master dies now. Returns the
        replica's port; :meth:`resume` it (it then reconnects and catches
        up, unless its master is gone)."""
        replica = self.topology()[master]
        assert replica is not None
        self.pause(replica)
        with self.client(self.node(master)) as client:
            client.client_kill_filter(_type="replica")
        return replica

    def pause(self, port: int) -> None:
        """SIGSTOP the node on ``port``: it neither answers nor reconnects."""
        process = self.node(port).process
        assert process is not None
        os.kill(process.pid, signal.SIGSTOP)

    def resume(self, port: int) -> None:
        """SIGCONT a node stopped by :meth:`pause`."""
        process = self.node(port).process
        assert process is not None
        os.kill(process.pid, signal.SIGCONT)

    def restart(self, port: int, timeout: float = 30.0) -> None:
        """Start a killed node again (it rejoins as a replica); wait until healthy."""
        self.node(port).start()
        self.wait_healthy(timeout)

    def migrate_slot(self, slot: int, target: int, timeout: float = 30.0) -> None:
        """Move ``slot`` and its keys to master ``target`` as redis-cli's
        resharding does: IMPORTING/MIGRATING, MIGRATE of the keys (all of a
        slot's keys in one call when they fit: a script over them never sees
        half of them moved), then the slot's new owner told to every node."""
        source = self.master_of_slot(slot)
        source_id, target_id = self.node_id(source), self.node_id(target)
        with (
            redis.Redis(port=source, socket_timeout=timeout) as src,
            redis.Redis(port=target, socket_timeout=timeout) as dst,
        ):
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
            while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000):
                src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, int(timeout * 1000), "KEYS", *keys)
            for port in (target, source):
                with redis.Redis(port=port, socket_timeout=5) as client:
                    client.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
        deadline = time.monotonic() + timeout
        while self.master_of_slot(slot) != target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"slot {slot} not moved to {target}")
            time.sleep(0.05)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def parse_nodes(nodes: dict[str, dict[str, Any]]) -> dict[int, int | None]:
    """CLUSTER NODES (as redis-py parses it) -> master port (of masters
    with slots) -> replica port."""
    ports = {info["node_id"]: int(address.rsplit(":", 1)[1]) for address, info in nodes.items()}
    topology: dict[int, int | None] = {}
    for info in nodes.values():
        if "master" in info["flags"] and "fail" not in info["flags"] and info["slots"]:
            topology.setdefault(ports[info["node_id"]], None)
    for info in nodes.values():
        master = ports.get(info["master_id"])
        if "slave" in info["flags"] and "fail" not in info["flags"] and master in topology:
            topology[master] = ports[info["node_id"]]
    return topology
