"""Consumer groups and webhooks on a real Redis Cluster (3 masters, a replica
each, on loopback): a group drains documents spread over every master with
nothing missed, a killed member's documents are resumed from their last
ack, a server's append wakes the member (per bucket) before its sweep, GC
holds back for a live group and evicts an abandoned one, and ``yrelay
webhook --redis-cluster`` delivers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator

import pytest
import redis
from redis.crc import key_slot

from conftest import eventually, running_server
from consumerutil import LEASE, Worker
from gcutil import append_all, text_updates
from test_consumers import TAKEOVER_BOUND, every, three_members_process_each_entry_once, write
from test_consumers_gc import POLICY, group_at, history, stream_ids
from test_webhooks import Receiver, run_webhook_cli
from yrelay.consumers import ConsumerGroup
from yrelay.gc import Collector
from yrelay.storage.client import YrelayCluster
from yrelay.storage.keys import group_members_key, group_progress_key, stream_key
from yrelay.storage.reads import DocumentStore
from yrelay.storage.replies import text
from yrelay.yjs import crdt

DOCS = [f"team/doc-{i:02d}" for i in range(12)]


@pytest.fixture
async def cluster(redis_cluster):
    client = redis.RedisCluster.from_url(redis_cluster.url)
    client.flushall()  # every master
    client.close()
    yield redis_cluster


@pytest.fixture
async def cluster_client(cluster):
    client = YrelayCluster.from_url(cluster.url)
    yield client
    await client.aclose()


@pytest.fixture
def cluster_store(cluster_client) -> DocumentStore:
    return DocumentStore(cluster_client)


def masters(cluster, docs: list[str]) -> set[int]:
    return {cluster.master_of_slot(key_slot(stream_key(doc).encode())) for doc in docs}


@contextlib.asynccontextmanager
async def acking_member(client, group: str, **options: object) -> AsyncIterator[Counter]:
    """The only member of ``group``, with a 30 s lease (it sweeps its
    documents every 10 s), acking every batch; yields the (document, entry
    id) pairs it processed."""
    processed: Counter = Counter()
    async with ConsumerGroup(client, group, member="solo", lease=30.0, **options) as member:  # type: ignore[arg-type]

        async def run() -> None:
            async for batch in member.batches():
                processed.update((batch.doc, entry_id) for entry_id in batch.ids)
                await batch.ack()

        task = asyncio.create_task(run())
        try:
            yield processed
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_three_members_drain_documents_on_every_master_with_nothing_missed(
    cluster, cluster_client, cluster_store, caplog
):
    caplog.set_level(logging.WARNING)
    assert len(masters(cluster, DOCS)) == 3
    await three_members_process_each_entry_once(cluster_client, cluster_store, DOCS)
    assert not [r for r in caplog.records if "CROSSSLOT" in r.getMessage()]


async def test_a_killed_members_documents_are_resumed_from_their_last_ack(cluster_client, cluster_store):
    ids = await write(cluster_store, DOCS[:6], 3)
    processed: Counter = Counter()
    a, b = [await Worker(cluster_client, name, processed).start() for name in ("a", "b")]
    await eventually(lambda: set(processed) == every(ids) and len(a.group.documents) == 3, timeout=20)
    await eventually(lambda: len(a.acks) >= 3, timeout=5)
    a.acking = False  # a processes without acking, then dies: b redoes what a did not ack
    victims = a.group.documents
    unacked = await write(cluster_store, victims, 2, word="u")
    await eventually(lambda: every(unacked) <= set(processed), timeout=10)
    await a.kill()
    await eventually(lambda: set(victims) <= set(b.group.documents), timeout=TAKEOVER_BOUND + 5)
    after = await write(cluster_store, DOCS[:6], 2, word="z")
    await eventually(lambda: set(processed) >= every(ids) | every(unacked) | every(after), timeout=20)
    duplicates = {key for key, count in processed.items() if count > 1}
    assert duplicates == every(unacked)
    assert b.group.reader.redelivered == len(duplicates)
    await b.stop()


async def test_a_servers_append_wakes_the_member_before_its_sweep(cluster, cluster_client, cluster_store, make_client):
    """With a 30 s lease the member sweeps its documents every 10 s; an edit
    through a server on the cluster (its appender announces each batch on
    the buckets' change streams) is read on the wake-up, long before that."""
    docs = DOCS[:3]
    ids = await write(cluster_store, docs, 2)
    async with acking_member(cluster_client, "woken") as processed:
        await eventually(lambda: set(processed) == every(ids), timeout=15)
        async with running_server(cluster.url, redis_cluster=True) as url:
            editor = await make_client(url)
            for doc in docs:
                crdt.insert_text((await editor.subscribe(doc)).ydoc, 0, "late ")
            await editor.wait_idle()
        streams = {
            doc: [text(entry_id) for entry_id, _ in await cluster_client.xrange(stream_key(doc))] for doc in docs
        }
        assert all(len(entries) == 3 for entries in streams.values())
        await eventually(lambda: set(processed) == every(streams), timeout=5)


async def test_the_webhook_cli_delivers_on_a_cluster(cluster, cluster_client, cluster_store):
    written = await write(cluster_store, DOCS[:4], 2)
    assert len(masters(cluster, DOCS[:4])) >= 2

    async def delivered(receiver: Receiver) -> None:
        await eventually(lambda: all(receiver.accepted(doc) == written[doc] for doc in written), timeout=30)
        assert await cluster_client.zcard(group_members_key("cluster-hooks")) == 1

    stderr = await run_webhook_cli(cluster.url, "cluster-hooks", delivered, "--redis-cluster")
    assert await cluster_client.zcard(group_members_key("cluster-hooks")) == 0  # left, not lapsed
    assert "CROSSSLOT" not in stderr


async def test_gc_holds_back_for_a_live_group_and_evicts_an_abandoned_one_on_a_cluster(
    cluster, cluster_client, cluster_store
):
    """``gc_groups.lua`` and the claim/ack scripts on documents of different
    masters: the live group's unprocessed entries stay, the abandoned group is
    evicted and its next member starts again from the snapshot."""
    held = DOCS[0]
    evicted = next(doc for doc in DOCS if masters(cluster, [doc]) != masters(cluster, [held]))
    held_ids = await append_all(cluster_store, held, text_updates(10)[0])
    evicted_ids, _ = await history(cluster_store, evicted, 6)
    async with ConsumerGroup(cluster_client, "live", member="m", lease=LEASE):  # live while we collect
        await group_at(cluster_client, "live", held, held_ids[3])
        await group_at(cluster_client, "gone", evicted, evicted_ids[1])  # no member: abandoned
        reports = await Collector(cluster_client, POLICY).collect([held, evicted])
    assert [report.error for report in reports] == [None, None]
    assert await stream_ids(cluster_client, held) == held_ids[4:]  # the live group's unprocessed entries stay
    assert await cluster_client.zscore(group_progress_key(evicted), "gone") is None

    processed: Counter = Counter()
    worker = await Worker(cluster_client, "m", processed, group="gone").start()
    await eventually(lambda: any(b.doc == evicted for b in worker.batches), timeout=10)
    first = next(b for b in worker.batches if b.doc == evicted)
    assert (first.restart, first.offset) == ("evicted", evicted_ids[-1])
    await worker.stop()


async def test_a_backlog_longer_than_a_batch_is_read_on_without_waiting_for_the_sweep(cluster_client, cluster_store):
    """Batches of 5, a 30 s lease (a sweep every 10 s): a document's 20
    entries come in 4 batches one after the other (a full read is read on
    at once, as one XREAD over every document would)."""
    ids = await write(cluster_store, DOCS[:1], 20)
    async with acking_member(cluster_client, "backlog", batch_size=5) as processed:
        await eventually(lambda: set(processed) == every(ids), timeout=5)
