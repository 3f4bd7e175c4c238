"""ack_replicas: ``appended`` only once a replica holds the entry (Redis WAIT
on the appender's pipeline connection), on a real master + replica."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from conftest import eventually, running_server
from yrelay.config import Settings
from yrelay.storage.embedded import RedisProcess
from yrelay.storage.keys import stream_key
from yrelay.yjs import crdt


def _wait_linked(master: RedisProcess, replica: RedisProcess, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    with redis.Redis(port=master.port) as m, redis.Redis(port=replica.port) as r:
        while time.monotonic() < deadline:
            if (
                r.info("replication").get("master_link_status") == "up"
                and m.info("replication").get("connected_slaves") == 1
            ):
                return
            time.sleep(0.05)
    raise TimeoutError("replica not linked to its master")


@pytest.fixture
def master_and_replica(tmp_path: Path) -> Iterator[tuple[RedisProcess, RedisProcess]]:
    master = RedisProcess(tmp_path / "master").start()
    replica = RedisProcess(tmp_path / "replica", extra_config={"replicaof": f"127.0.0.1 {master.port}"}).start()
    try:
        _wait_linked(master, replica)
        yield master, replica
    finally:
        if replica.process is not None:
            os.kill(replica.process.pid, signal.SIGCONT)
        replica.stop()
        master.stop()


def _entries(port: int, doc: str) -> list[tuple[bytes, bytes]]:
    """(session, clock) of every entry of ``doc``'s stream on that server."""
    with redis.Redis(port=port) as client:
        return [(fields[b"s"], fields[b"c"]) for _, fields in client.xrange(stream_key(doc))]


async def test_appended_only_once_the_replica_holds_the_entry(master_and_replica, make_client):
    master, replica = master_and_replica
    async with running_server(master.url, ack_replicas=1, ack_replicas_timeout=2.0) as url:
        client = await make_client(url)
        doc = await client.subscribe("replicated")
        for i in range(20):
            crdt.insert_text(doc.ydoc, 0, f"<{i}>")
            await client.wait_idle()
            # acked, so the replica holds it already (no wait for replication here)
            assert len(_entries(replica.port, "replicated")) == len(client.acked)
        assert len(client.acked) == 20 and not client.error_codes


async def test_replication_timeout_then_the_resend_is_appended_once(master_and_replica, make_client):
    master, replica = master_and_replica
    doc_id = "paused-replica"
    async with running_server(master.url, ack_replicas=1, ack_replicas_timeout=0.3) as url:
        client = await make_client(url)
        doc = await client.subscribe(doc_id)
        crdt.insert_text(doc.ydoc, 0, "before ")
        await client.wait_idle()
        assert replica.process is not None
        os.kill(replica.process.pid, signal.SIGSTOP)  # holds its socket, acknowledges nothing
        try:
            crdt.insert_text(doc.ydoc, 7, "paused")
            await eventually(lambda: client.error_codes["replication_timeout"] >= 2)  # resent, timed out again
            assert len(client.acked) == 1, "acked while no replica held it"
            assert len(_entries(master.port, doc_id)) == 2, "the entry is stored on the master"
        finally:
            os.kill(replica.process.pid, signal.SIGCONT)
        await client.wait_idle()
    assert len(client.acked) == 2
    master_entries = _entries(master.port, doc_id)
    assert len(master_entries) == len(set(master_entries)) == 2, "a resend was stored twice"
    await eventually(lambda: _entries(replica.port, doc_id) == master_entries)


def test_ack_replicas_timeout_is_bounded():
    with pytest.raises(ValueError, match="ack_replicas_timeout"):
        Settings(ack_replicas=1, ack_replicas_timeout=0)
    with pytest.raises(ValueError, match="ack_replicas_timeout"):
        Settings(ack_replicas=1, ack_replicas_timeout=30)


async def test_a_probe_waits_for_writes_of_other_connections(master_and_replica):
    """The resend path's second round trip: on a connection that wrote
    nothing, the probe's WAIT covers an entry another connection wrote."""
    from redis.asyncio import Redis

    from yrelay.storage.replicas import ReplicaWait

    master, replica = master_and_replica
    wait = ReplicaWait(replicas=1, timeout=0.3)
    assert replica.process is not None
    async with Redis.from_url(master.url) as writer, Redis.from_url(master.url) as other:
        os.kill(replica.process.pid, signal.SIGSTOP)
        try:
            await writer.xadd(stream_key("probe"), {"u": b"x"})
            assert not await wait.after_read_only(other, "probe")
        finally:
            os.kill(replica.process.pid, signal.SIGCONT)
        assert await wait.after_read_only(other, "probe")
