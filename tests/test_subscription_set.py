"""Subscription-set drift: one digest per session, range reconciliation on a
mismatch, re-created and removed subscriptions."""

from __future__ import annotations

import asyncio

from conftest import eventually, running_server
from wsraw import RawPeer
from yrelay.gc import Collector, GcPolicy
from yrelay.reconciliation import digest_of
from yrelay.storage.keys import tracker_key
from yrelay.storage.offsets import StreamId
from yrelay.tracker.tracker import Tracker, session_documents
from yrelay.yjs import crdt

NO_CHECKS = {"subscription_check_interval": None}


async def test_equal_sets_are_confirmed_in_one_round_trip(redis_url, redis_client, make_client):
    async with running_server(redis_url, gc_interval=0) as url:
        client = await make_client(url, **NO_CHECKS)
        names = [f"set/doc-{i}" for i in range(12)]
        for name in names:
            await client.subscribe(name)
        check = await client.check_subscriptions()
        assert check.in_sync and check.round_trips == 1
        assert await session_documents(redis_client, client.session).digest() == digest_of(names)


async def test_evicted_session_is_detected_by_the_set_digest_and_recovers(redis_url, redis_client, make_client):
    """GC evicts a reader from a document that then goes quiet: no ack ever
    shows it, the subscription-set check does."""
    async with running_server(redis_url, gc_interval=0) as url:
        writer = await make_client(url, **NO_CHECKS)
        reader = await make_client(url, **NO_CHECKS)
        wdoc = await writer.subscribe("busy")
        rdoc = await reader.subscribe("busy")
        for name in ("quiet-1", "quiet-2"):
            await reader.subscribe(name)
        for i in range(10):
            crdt.insert_text(wdoc.ydoc, 0, f"<w{i}>")
            await asyncio.sleep(0.005)
        await eventually(lambda: rdoc.text == wdoc.text)
        await writer.wait_idle()

        # The reader's acks are all in first: a late one (a busy machine's
        # timing) would move it past the offset set below, and GC would keep it.
        last_id, _ = (await redis_client.xrevrange("yrelay:{busy}:stream", count=1))[0]
        deadline = asyncio.get_running_loop().time() + 30
        while (
            await redis_client.zscore(tracker_key("busy"), reader.session) != StreamId.parse(last_id.decode()).score()
        ):
            assert asyncio.get_running_loop().time() < deadline, "the reader never acked the last entry"
            await asyncio.sleep(0.02)
        # The reader falls behind (its acked offset is the first entry) ...
        first_id, _ = (await redis_client.xrange("yrelay:{busy}:stream", count=1))[0]
        await redis_client.zadd(tracker_key("busy"), {reader.session: StreamId.parse(first_id.decode()).score()})
        # ... and a real GC pass evicts it.
        [report] = await Collector(redis_client, GcPolicy(relative_ms=1, absolute_ms=10**9)).collect(["busy"])
        assert report.evicted_sessions == [reader.session]
        assert await Tracker(redis_client).offset("busy", reader.session) is None

        check = await reader.check_subscriptions()
        assert check.missing == ["busy"] and check.extra == []
        assert 2 <= check.round_trips <= 4
        again = await reader.check_subscriptions()  # while "busy" is still being re-created
        assert again.missing == []  # pending documents are left out, never unsubscribed
        await eventually(lambda: rdoc.synced.is_set())
        await eventually(lambda: reader.resyncs >= 1)
        assert await Tracker(redis_client).offset("busy", reader.session) is not None
        assert (await reader.check_subscriptions()).round_trips == 1

        crdt.insert_text(wdoc.ydoc, 0, "<after>")
        await eventually(lambda: rdoc.text == wdoc.text)


async def test_lost_unsubscribe_is_found_and_removed(redis_url, redis_client, make_client):
    async with running_server(redis_url, gc_interval=0) as url:
        client = await make_client(url, **NO_CHECKS)
        for name in ("keep", "drop"):
            await client.subscribe(name)
        client.docs.pop("drop")  # the app let go of it, the unsubscribe never arrived
        check = await client.check_subscriptions()
        assert check.extra == ["drop"] and check.missing == []
        members = session_documents(redis_client, client.session)
        await eventually_async(lambda: members.digest(), digest_of(["keep"]))
        assert await redis_client.zscore(tracker_key("drop"), client.session) is None


async def test_periodic_check_runs_by_itself(redis_url, redis_client, make_client):
    async with running_server(redis_url, gc_interval=0) as url:
        client = await make_client(url, subscription_check_interval=0.1)
        events: list[str] = []
        client.on_event = lambda name, data: events.append(name)
        await client.subscribe("solo")
        await Tracker(redis_client).untrack("solo", client.session)  # an operator's eviction
        await eventually(lambda: "subscriptions_repaired" in events)
        await eventually_async(lambda: Tracker(redis_client).offset("solo", client.session), None, negate=True)


async def test_garbage_reconcile_payload_is_a_clear_error(server_url):
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "reconcile", "payload": "////"})
    error = await peer.expect("error")
    assert error["code"] == "malformed_frame" and "reconcile" in error["message"]
    await peer.send({"op": "check_subscriptions", "count": 0, "hash": "0" * 32, "ref": 7})
    answer = await peer.expect("subscriptions")
    assert answer["count"] == 0 and answer["hash"] == "0" * 32 and answer["ref"] == 7
    await peer.send({"op": "check_subscriptions", "count": -1, "hash": "x"})
    assert (await peer.expect("error"))["code"] == "malformed_frame"


async def eventually_async(read, expected, negate: bool = False, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while ((await read()) == expected) == negate:
        if loop.time() > deadline:
            raise AssertionError(f"never {'not ' if negate else ''}{expected!r}")
        await asyncio.sleep(0.02)
