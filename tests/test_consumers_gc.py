"""GC with consumer groups, against a real redis-server: a group's position
holds trimming back; an abandoned group is evicted past the relative delta,
a live one only past the absolute limit; an evicted group starts again from
the snapshot and is told so."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from conftest import eventually
from consumerutil import LEASE, Worker
from gcutil import append_all, append_at, text_updates
from yrelay.consumers import AckResult, ConsumerGroup, DocumentStates
from yrelay.consumers.progress import Progress
from yrelay.gc import Collector, GcPolicy
from yrelay.storage.keys import group_progress_key, stream_key
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import DocumentStore

POLICY = GcPolicy(relative_ms=10_000, absolute_ms=50_500, group_abandoned_ms=10_000, group_absolute_ms=50_500)


async def stream_ids(redis, doc: str) -> list[StreamId]:
    return [StreamId.parse(entry_id.decode()) for entry_id, _ in await redis.xrange(stream_key(doc))]


async def group_at(redis, group: str, doc: str, offset: StreamId) -> None:
    """The group's progress on ``doc`` at ``offset`` (a claim and an ack)."""
    progress = Progress(redis, group)
    await progress.claim(doc, 1)
    assert await progress.ack(doc, 1, offset) is AckResult.ACKED


async def history(store: DocumentStore, doc: str, count: int) -> tuple[list[StreamId], str]:
    """``count`` entries a minute old, then one now (the newest)."""
    updates, text = text_updates(count + 1)
    start = int(time.time() * 1000) - 60_000
    ids = await append_at(store.redis, doc, [start + i for i in range(count)], updates[:count])
    ids += await append_all(store, doc, updates[count:], session="now")
    return ids, text


async def test_a_live_groups_position_holds_trimming_back(redis_client, store):
    updates, _ = text_updates(10)
    ids = await append_all(store, "doc", updates)
    async with ConsumerGroup(redis_client, "idx", member="m", lease=LEASE):  # live while we collect
        await group_at(redis_client, "idx", "doc", ids[3])
        [report] = await Collector(redis_client, POLICY).collect(["doc"])
    assert (report.folded, report.trimmed) == (4, 4)
    assert await stream_ids(redis_client, "doc") == ids[4:]  # the group's unprocessed entries stay
    assert (await store.load_snapshot("doc")).offset == ids[3]


async def test_the_lowest_of_sessions_and_groups_wins(redis_client, store):
    updates, _ = text_updates(10)
    ids = await append_all(store, "doc", updates)
    await redis_client.zadd("yrelay:{doc}:tracker", {"session": ids[5].score()})
    await group_at(redis_client, "idx", "doc", ids[7])
    [report] = await Collector(redis_client, POLICY).collect(["doc"])
    assert await stream_ids(redis_client, "doc") == ids[6:]
    await redis_client.zrem("yrelay:{doc}:tracker", "session")
    # A new group starts at the snapshot (ids[5]); an older ack does not move it back.
    await group_at(redis_client, "other", "doc", ids[2])
    assert await redis_client.zscore(group_progress_key("doc"), "other") == ids[5].score()
    [report] = await Collector(redis_client, POLICY).collect(["doc"])
    assert report.trimmed == 0
    assert await stream_ids(redis_client, "doc") == ids[6:]


async def test_an_abandoned_group_is_evicted_past_the_relative_delta_and_restarts_from_the_snapshot(
    redis_client, store
):
    ids, text = await history(store, "doc", 6)
    await group_at(redis_client, "idx", "doc", ids[1])  # no member: abandoned, a minute behind the newest
    [report] = await Collector(redis_client, POLICY).collect(["doc"])
    assert report.stream_length == 0
    assert await redis_client.zscore(group_progress_key("doc"), "idx") is None

    processed: Counter = Counter()
    worker = await Worker(redis_client, "m", processed).start()
    await eventually(lambda: len(worker.batches) >= 1, timeout=10)
    first = worker.batches[0]
    assert (first.restart, first.entries) == ("evicted", [])
    assert first.offset == ids[-1]
    states = DocumentStates(redis_client)
    await states.apply(first)
    assert states.text("doc") == text  # the snapshot is the whole document
    await worker.stop()


async def test_a_live_group_is_kept_within_the_absolute_limit_and_evicted_past_it(redis_client, store):
    ids, _ = await history(store, "doc", 6)
    processed: Counter = Counter()
    worker = await Worker(redis_client, "m", processed).start()
    worker.acking = False
    await eventually(lambda: len(processed) == 7, timeout=10)
    stale = worker.batches[-1]
    # A minute behind the newest, but live: the relative delta does not apply,
    # and within the absolute limit (2 minutes here).
    lenient = GcPolicy(relative_ms=10_000, absolute_ms=50_500, group_abandoned_ms=10_000, group_absolute_ms=120_000)
    [report] = await Collector(redis_client, lenient).collect(["doc"])
    assert report.trimmed == 0 and await stream_ids(redis_client, "doc") == ids
    # Past the absolute limit (30 s; it lacks entries a minute old): evicted.
    strict = GcPolicy(relative_ms=10_000, absolute_ms=50_500, group_abandoned_ms=10_000, group_absolute_ms=30_000)
    [report] = await Collector(redis_client, strict).collect(["doc"])
    assert report.stream_length == 0
    assert await stale.ack() is AckResult.EVICTED  # told
    worker.acking = True
    await eventually(lambda: any(batch.restart == "evicted" for batch in worker.batches), timeout=10)
    await eventually(lambda: AckResult.ACKED in worker.acks, timeout=5)
    assert await redis_client.zscore(group_progress_key("doc"), "idx") == ids[-1].score()
    await worker.stop()


async def test_dry_run_reports_without_evicting_groups(redis_client, store):
    ids, _ = await history(store, "doc", 6)
    await group_at(redis_client, "idx", "doc", ids[1])
    await Collector(redis_client, POLICY).collect(["doc"], dry_run=True)
    assert await redis_client.zscore(group_progress_key("doc"), "idx") == ids[1].score()
    assert await stream_ids(redis_client, "doc") == ids


async def test_a_claim_that_fails_after_another_made_a_snapshot_batch_loses_no_snapshot(redis_client, store):
    """A member claiming its documents builds their snapshot batches one by
    one; Redis failing on a later claim must not drop the batches already
    built (their documents would then be read from after the snapshot, and
    the snapshot never handed out)."""
    import redis.exceptions

    docs = ["snapclaim-a", "snapclaim-b"]
    for doc in docs:
        await history(store, doc, 4)
    await Collector(redis_client, POLICY).collect(docs)
    member = ConsumerGroup(redis_client, "snapclaim", member="m", lease=LEASE, prefix="snapclaim-")
    claim, calls = member.reader.progress.claim, []

    async def failing_second(doc: str, version: int):  # type: ignore[no-untyped-def]
        calls.append(doc)
        if len(calls) == 2:
            raise redis.exceptions.ConnectionError("lost Redis between two claims")
        return await claim(doc, version)

    member.reader.progress.claim = failing_second  # type: ignore[method-assign]
    snapshots: list[str] = []

    async def consume() -> None:
        async for batch in member.batches():
            if batch.snapshot:
                snapshots.append(batch.doc)
            await batch.ack()

    await member.start()
    task = asyncio.create_task(consume())
    try:
        await eventually(lambda: sorted(set(snapshots)) == docs, timeout=15)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await member.leave()
    assert len(calls) > 2  # the failure happened, and the claims ran again
