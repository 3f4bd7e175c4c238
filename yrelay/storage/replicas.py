"""Acks that survive a failover: ``appended`` only once ``ack_replicas``
replicas hold the entry (``ack_replicas`` > 0).

Redis's ``WAIT n timeout`` blocks until n replicas acknowledged every write
*of the connection it is sent on*, so it rides at the end of the appender's
pipeline, on the connection that carried the append scripts: one ``WAIT``
per batch, whatever the batch holds. (In a Redis Cluster the batch is one
pipeline per node, and each gets its own ``WAIT`` on that node's connection.)

A batch that wrote nothing (only resends answered from the dedup) is the
one case the documented guarantee does not cover: ``WAIT`` promises the
writes of *its own connection*, and the stored entry may have been written
by another (the first attempt, perhaps in another process). Redis 6.2.14
and 7.0.15 in fact wait for the master's offset as of the connection's last
command, reads included (measured: a ``WAIT`` after a ``GET`` waited for an
``XADD`` of another connection; a first command ``WAIT`` on 6.2 did not),
which would cover it; rather than rest on that, such a batch writes a probe
key of the document and waits for it, in a second round trip.

What it guarantees: the replicas hold the entry **in memory** (they
acknowledged the replication stream), not that they fsynced it
(docs/operations.md#durability). Past the timeout the entry *is* stored on
the master: the answer is ``replication_timeout``, the client resends, and
that resend, answered from the dedup, waits for the replicas again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import cast

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline

from yrelay.storage.client import is_cluster
from yrelay.storage.keys import replication_probe_key
from yrelay.storage.packed import CommandQueue

log = logging.getLogger(__name__)

#: How long a probe key lives (ms): only its write matters.
PROBE_TTL_MS = 10_000


class ReplicationTimeout(Exception):
    """The update is stored, but fewer than ``ack_replicas`` replicas confirmed
    it within ``ack_replicas_timeout``."""

    def __init__(self, entry_id: str | None):
        super().__init__(f"entry {entry_id} stored, replicas did not confirm it in time")
        self.entry_id = entry_id


@dataclass(frozen=True)
class ReplicaWait:
    replicas: int
    timeout: float

    @classmethod
    def of(cls, replicas: int, timeout: float) -> ReplicaWait | None:
        """None when acks need no replica (the setting ``ack_replicas`` 0).
        Given the two settings, not the settings object: storage knows
        nothing of the server's configuration (or of uvicorn, which it loads)."""
        return cls(replicas, timeout) if replicas > 0 else None

    def queue(self, pipe: CommandQueue, keys: dict[str, str]) -> dict[str, int]:
        """The ``WAIT`` at the end of a pipeline, after its writes to
        ``keys`` (name -> a key written); name -> the index of the WAIT that
        covers it among those queued. In a cluster, one per node holding one
        of ``keys``: it rides that node's connection, after that node's
        writes (a command that a resharding sent to another node meanwhile
        is not covered: docs/operations.md#redis-cluster)."""
        args = ("WAIT", self.replicas, max(int(self.timeout * 1000), 1))
        if not is_cluster(pipe):
            pipe.execute_command(*args)
            return dict.fromkeys(keys, 0)
        cluster = cast(ClusterPipeline, pipe)  # is_cluster: a cluster client's pipeline
        nodes = {name: _primary_of(cluster, key) for name, key in keys.items()}
        distinct = list({node.name: node for node in nodes.values()}.values())
        for node in distinct:
            cluster.execute_command(*args, target_nodes=node)
        index = {node.name: i for i, node in enumerate(distinct)}
        return {name: index[node.name] for name, node in nodes.items()}

    def enough(self, replies: list[object]) -> bool:
        """Did every ``WAIT`` reply count enough replicas? (An error reply does not.)"""
        return all(isinstance(reply, int) and reply >= self.replicas for reply in replies)

    async def after_read_only(self, redis: Redis, doc: str) -> bool:
        """Write a probe of ``doc`` and wait for it on the same connection:
        every write before it, on any connection, is then on the replicas."""
        try:
            async with redis.pipeline(transaction=False) as pipe:
                pipe.set(replication_probe_key(doc), b"1", px=PROBE_TTL_MS)
                self.queue(pipe, {doc: replication_probe_key(doc)})
                _, *replies = await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - the entry is stored: the client resends whatever failed here
            log.warning("waiting for replicas after a resend failed: %s", exc)
            return False
        return self.enough(replies)


def _primary_of(cluster: ClusterPipeline, key: str) -> ClusterNode:
    """The primary holding ``key``'s slot (redis-py returns None only when
    asked for a replica; a slot nobody covers raises SlotNotCoveredError)."""
    node = cluster.cluster_client.get_node_from_key(key)
    assert node is not None
    return node
