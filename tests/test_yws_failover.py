"""Issue 39 on a real Redis Cluster (3 masters, a replica each): a /yws
client on a server that had just restarted, then a failover to a replica
that missed the last writes. The client must end equal to the document, or
be closed (and resync on its reconnect); never stay open and differ.

Each round: the server restarts (a /ws client of it resubscribes: its
fan-out follows the document from there); the document's replica is cut
off; a writer appends an entry and is gone (nobody will send it again, and
no fan-out reads it yet: an append nobody announced is read at the sweep,
here once a minute); the stock /yws reader reconnects, and its sync answer
holds that entry; the master is killed and the lagging replica takes over;
the /ws client writes on. The entry is lost to Redis; only the reader holds
it, so only its resync can give it back. Before issue 39's fix the check
after the failover looked only for what the fan-out had read, the reader
stayed open, and the document never got the entry back.

The CI run makes ``YRELAY_YWS_FAILOVER_ROUNDS`` rounds (2); the figure in
docs/reliability.md is 20 rounds with ``YRELAY_YWS_FAILOVER_HOG`` busy
processes (one per core) beside them."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys

import pytest
import redis
from redis.crc import key_slot

from conftest import eventually, running_server
from test_cluster import stored_text
from yrelay.storage.append import append_one
from yrelay.storage.client import YrelayCluster
from yrelay.storage.embedded import free_port
from yrelay.storage.keys import stream_key
from yrelay.storage.reads import DocumentStore
from yrelay.yjs import crdt
from ywspeer import ReconnectingPeer

ROUNDS = int(os.environ.get("YRELAY_YWS_FAILOVER_ROUNDS", "2"))
HOG = int(os.environ.get("YRELAY_YWS_FAILOVER_HOG", "0"))
DOC = "team/followed"


@pytest.fixture
async def cluster_url(redis_cluster) -> str:
    client = redis.RedisCluster.from_url(redis_cluster.url)
    client.flushall()
    client.close()
    return redis_cluster.url


@pytest.fixture
def hogs():
    """``HOG`` processes spinning on a core each, for the length of the test."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(HOG)]
    yield
    for process in spinning:
        process.kill()
        process.wait()


@pytest.mark.timeout(120 + 90 * ROUNDS)
async def test_a_yws_reader_of_a_restarted_server_ends_equal_or_resyncs_after_a_lagging_failover(
    redis_cluster, cluster_url, make_client, hogs, caplog
):
    caplog.set_level(logging.WARNING)
    port = free_port()
    # block_ms: the fan-out reads a document nobody announced once a minute (the sweep).
    options = {
        "redis_cluster": True,
        "ack_replicas": 1,
        "ack_replicas_timeout": 0.5,
        "gc_interval": 0,
        "block_ms": 60_000,
    }
    ws_url, base = f"ws://127.0.0.1:{port}/ws", f"ws://127.0.0.1:{port}"
    reader = ReconnectingPeer(base, DOC)
    outcomes = []
    try:
        writer = written = None
        for round_ in range(ROUNDS):
            reader.online.clear()  # it reconnects only once the lost entry is stored (its sync answer holds it)
            async with running_server(cluster_url, port, **options):  # a restarted server
                writer = writer or await make_client(ws_url)  # then it reconnects by itself
                written = written or await writer.subscribe(DOC)
                crdt.insert_text(written.ydoc, 0, f"<w{round_}>")
                await writer.wait_idle(timeout=60)  # resubscribed and written: the fan-out follows DOC

                master = redis_cluster.master_of_slot(key_slot(stream_key(DOC).encode()))
                replica = await asyncio.to_thread(redis_cluster.cut_off_replica, master)
                try:
                    gone = crdt.new_doc(1000 + round_)  # a writer that crashes once stored
                    crdt.insert_text(gone, 0, f"<gone{round_}>")
                    store_client = YrelayCluster.from_url(cluster_url)  # a fresh one: the last round killed a node
                    try:
                        await append_one(DocumentStore(store_client), DOC, f"gone-{round_}", 0, crdt.encode_state(gone))
                    finally:
                        await store_client.aclose()
                    closes, connects = len(reader.closes), reader.connects
                    reader.online.set()
                    # its sync answer
                    await eventually(lambda: f"<gone{round_}>" in reader.text, timeout=30)  # noqa: B023 - called within this iteration, never after it
                    redis_cluster.node(master).kill()
                finally:
                    redis_cluster.resume(replica)
                await asyncio.to_thread(redis_cluster.wait_promoted, replica)
                redis_cluster.node(master).start()  # it rejoins as the new master's replica (acks need one)
                crdt.insert_text(written.ydoc, 0, f"<after{round_}>")  # announced: the fan-out reads the new master
                await writer.wait_idle(timeout=60)

                async def settled() -> bool:
                    stored = await stored_text(replica, DOC)  # noqa: B023 - called within this iteration, never after it
                    return reader.ws is not None and reader.text == stored == written.text  # noqa: B023 - called within this iteration, never after it

                deadline = asyncio.get_running_loop().time() + 30
                while not await settled() and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.1)
                stored = await stored_text(replica, DOC)
                outcome = {
                    "round": round_,
                    "equal": reader.text == stored,
                    "closes": reader.closes[closes:],
                    "reconnects": reader.connects - connects - 1,
                    "lost_entry_back": f"<gone{round_}>" in stored,
                }
                outcomes.append(outcome)
                print(outcome)
                await asyncio.to_thread(redis_cluster.wait_healthy, 60)
                assert outcome["equal"], f"the reader stayed open and differs: {reader.text!r} != {stored!r}"
    finally:
        await reader.close()
    assert all(outcome["equal"] and outcome["lost_entry_back"] for outcome in outcomes), outcomes
