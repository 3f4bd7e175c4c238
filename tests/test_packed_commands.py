"""The hot path's Redis batches packed by hand (yrelay/storage/packed.py):
the appender's appends, GC bookkeeping and WAIT, and the ack writer's
ZADDs, against a real redis-server."""

from __future__ import annotations

import asyncio

from redis.exceptions import ResponseError

from yrelay.storage import packed
from yrelay.storage.append import Appender
from yrelay.storage.keys import bucket_gc_due_key, document_bucket, tracker_key
from yrelay.storage.listing import all_documents
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import DocumentStore
from yrelay.tracker import AckWriter
from yrelay.yjs.admission import Needs

EMPTY = b"\x00\x00"


async def test_a_refused_command_is_its_reply_and_the_connection_stays_in_step(redis_client):
    replies = await packed.execute(
        redis_client,
        [
            packed.command(b"SET", b"k", b"v"),
            packed.command(b"LPUSH", b"k", b"x"),  # WRONGTYPE
            packed.command(b"GET", b"k"),
        ],
    )
    assert replies[0] is True or replies[0] == b"OK"
    assert isinstance(replies[1], ResponseError) and "WRONGTYPE" in str(replies[1])
    assert replies[2] == b"v"
    assert await redis_client.get("k") == b"v"  # the pooled connection is still usable


async def test_appends_of_several_documents_in_one_write_after_the_script_cache_was_flushed(redis_client):
    store = DocumentStore(redis_client)
    await store.load_scripts()
    appender = Appender(store)
    appender.start()
    try:
        await redis_client.script_flush()  # as after a Redis restart: the appends are refused NOSCRIPT, then run
        futures = [appender.submit(f"doc-{d}", "s", clock, EMPTY, Needs()) for d in range(3) for clock in (1, 2)]
        results = await asyncio.wait_for(asyncio.gather(*futures), 10)
    finally:
        await appender.stop()
    assert all(result.entry_id is not None and not result.duplicate for result in results)
    for d in range(3):
        assert len(await redis_client.xrange(f"yrelay:{{doc-{d}}}:stream")) == 2  # each appended once
    docs = [f"doc-{d}" for d in range(3)]
    for doc in docs:  # the GC bookkeeping rode the same write
        assert await redis_client.zscore(bucket_gc_due_key(document_bucket(doc)), doc) is not None
    assert set(docs) <= {doc async for page in all_documents(redis_client) for doc in page}


async def test_acks_move_the_tracker_forward_only_and_report_evicted_sessions(redis_client):
    evicted: list[tuple[str, str]] = []
    writer = AckWriter(redis_client, on_evicted=lambda doc, session: evicted.append((doc, session)))
    await redis_client.zadd(tracker_key("a"), {"s1": StreamId(5, 0).score()})
    await redis_client.zadd(tracker_key("b"), {"s1": StreamId(9, 0).score()})
    writer.submit("a", "s1", StreamId(7, 3))
    writer.submit("b", "s1", StreamId(8, 0))  # older than tracked: never moves it back
    writer.submit("c", "gone", StreamId(1, 0))  # not tracked (evicted): not re-added
    await writer.flush()
    assert await redis_client.zscore(tracker_key("a"), "s1") == StreamId(7, 3).score()
    assert await redis_client.zscore(tracker_key("b"), "s1") == StreamId(9, 0).score()
    assert await redis_client.zscore(tracker_key("c"), "gone") is None
    assert evicted == [("c", "gone")]


def test_a_cluster_client_keeps_redis_pys_pipeline(redis_client):
    from redis.asyncio.cluster import RedisCluster

    cluster = RedisCluster.__new__(RedisCluster)  # not connected: only its type matters
    assert packed.packable(redis_client) and not packed.packable(cluster)
    assert isinstance(packed.pipeline(redis_client), packed.Batch)
