"""Per-document drift digests: maintained exactly, checked on resubscribe,
repaired by the two-way exchange when the server lost what clients hold."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import redis as redis_sync
from redis.asyncio import Redis

from conftest import eventually, running_server
from gcutil import append_all, dump_document, text_updates
from yrelay.gc import Collector, GcPolicy
from yrelay.reconciliation.digest import Digest, digest_of
from yrelay.reconciliation.held_entries import HeldEntries
from yrelay.reconciliation.stream_digest import StreamDigests
from yrelay.storage.embedded import RedisProcess, free_port
from yrelay.storage.keys import meta_key, stream_key
from yrelay.storage.offsets import ZERO, StreamId
from yrelay.storage.reads import DocumentStore
from yrelay.storage.replies import text
from yrelay.storage.rewind import find_rewound
from yrelay.tracker.tracker import session_documents
from yrelay.yjs import crdt

NO_GC = {"gc_interval": 0}
#: A URL nothing listens on: parks a client until a test points it back.
NOWHERE = f"ws://127.0.0.1:{free_port()}/ws"


async def stream_ids(redis_client, doc: str) -> list[str]:
    return [text(entry_id) for entry_id, _ in await redis_client.xrange(stream_key(doc))]


async def append_text(store: DocumentStore, doc: str, count: int, word: str) -> None:
    client_id = 1 + sum(map(ord, word))  # distinct per word: no clashing Yjs clocks
    await append_all(store, doc, text_updates(count, client_id, word)[0], session=f"writer-{word}-0000000000")


def tokens(count: int, tag: str) -> list[str]:
    return [f"<{tag}{i}>" for i in range(count)]


# ------------------------------------------------------------------ the store


async def test_stored_digest_follows_appends_and_trims(redis_client):
    store, digests = DocumentStore(redis_client), StreamDigests(redis_client)
    await append_text(store, "d", 40, "a")
    ids = await stream_ids(redis_client, "d")
    last = StreamId.parse(ids[-1])

    window = await digests.window("d", ZERO, last)  # also folds the unhashed tail in
    assert window is not None and window.digest == digest_of(ids)
    assert text(await redis_client.hget(meta_key("d"), "digest_through")) == ids[-1]

    # A window that starts and ends inside the stream.
    window = await digests.window("d", StreamId.parse(ids[9]), StreamId.parse(ids[29]))
    assert window is not None and window.digest == digest_of(ids[10:30])

    await append_text(store, "d", 10, "b")
    reports = await Collector(redis_client, GcPolicy(relative_ms=5, absolute_ms=50)).collect(
        ["d"]
    )  # nobody tracked: folds and trims all
    assert reports[0].trimmed == 50
    assert await stream_ids(redis_client, "d") == []
    check = await digests.recompute("d")
    assert not check.wrong and check.actual == "0" * 32

    await append_text(store, "d", 5, "c")
    ids = await stream_ids(redis_client, "d")
    window = await digests.window("d", ZERO, StreamId.parse(ids[-1]))
    assert window is not None and window.since > ZERO  # starts at the trim point
    assert window.digest == digest_of(ids)


async def test_trim_of_hashed_and_unhashed_entries_keeps_the_digest_exact(redis_client):
    store, digests = DocumentStore(redis_client), StreamDigests(redis_client)
    await append_text(store, "d", 30, "a")
    ids = await stream_ids(redis_client, "d")
    await digests.window("d", ZERO, StreamId.parse(ids[9]))  # hashes all 30
    await append_text(store, "d", 30, "b")
    policy = GcPolicy(relative_ms=5, absolute_ms=50, max_fold_entries=7)  # trims in chunks of 7, past the hashed part
    await Collector(redis_client, policy).collect(["d"])
    await append_text(store, "d", 3, "c")
    check = await digests.recompute("d", fix=False)
    assert not check.wrong
    ids = await stream_ids(redis_client, "d")
    window = await digests.window("d", ZERO, StreamId.parse(ids[-1]))
    assert window is not None and window.digest == digest_of(ids)


async def test_recompute_reports_and_fixes_a_wrong_digest(redis_client):
    store, digests = DocumentStore(redis_client), StreamDigests(redis_client)
    for doc in ("good", "bad"):
        await append_text(store, doc, 12, doc)
        await digests.window(doc, ZERO, await store.last_id(doc))
    await redis_client.hset(meta_key("bad"), "digest_hash", "f" * 32)

    wrong = await digests.recompute_all(fix=True)
    assert [check.doc for check in wrong] == ["bad"]
    assert wrong[0].stored == "f" * 32 and wrong[0].fixed
    assert await digests.recompute_all(fix=True) == []
    window = await digests.window("bad", ZERO, await store.last_id("bad"))
    assert window is not None and window.digest == digest_of(await stream_ids(redis_client, "bad"))


async def test_window_past_the_cap_is_not_computed(redis_client):
    store = DocumentStore(redis_client)
    await append_text(store, "d", 20, "a")
    assert await StreamDigests(redis_client, cap=10).window("d", ZERO, ZERO) is None


async def test_an_unhashed_tail_longer_than_the_cap_is_folded_in_pages(redis_client):
    store = DocumentStore(redis_client)
    await append_text(store, "d", 30, "a")
    ids = await stream_ids(redis_client, "d")
    window = await StreamDigests(redis_client, cap=10).window("d", ZERO, StreamId.parse(ids[-1]))
    assert window is not None and window.digest == digest_of(ids)
    assert text(await redis_client.hget(meta_key("d"), "digest_through")) == ids[-1]


def test_held_entries_count_each_id_once_and_rebase():
    held = HeldEntries()
    ids = [StreamId(1000 + i, 0) for i in range(10)]
    for entry_id in ids + ids[3:5]:  # resent deliveries repeat ids
        held.add(entry_id)
    assert held.digest(ids[-1]) == digest_of(map(str, ids))
    assert held.digest(ids[4]) == digest_of(map(str, ids[:5]))  # own ids past the offset left out
    held.rebase(ids[5])
    assert held.digest(ids[-1]) == digest_of(map(str, ids[6:]))
    assert not held.add(ids[2])  # at or below the base: not held individually
    held.reset(ids[1])  # a resync to an older point keeps nothing below it
    assert held.since == ids[1] and held.digest(ids[-1]) == digest_of(map(str, ids[6:]))
    assert held.digest(ZERO) == Digest()


def test_held_entries_stay_under_their_cap_by_moving_the_base_up():
    held = HeldEntries(max_ids=4)
    ids = [StreamId(2000 + i, 0) for i in range(10)]
    for entry_id in ids:
        held.add(entry_id)
    assert len(held) == 4 and held.since == ids[5]
    assert held.digest(ids[-1]) == digest_of(map(str, ids[6:]))  # the window is the recent tail


async def test_a_capped_client_window_still_resumes_without_a_resync(redis_url, make_client):
    """A client whose held ids outgrew the cap compares over a later window:
    the server leaves out what lies below it, and the digests agree."""
    async with running_server(redis_url, gc_interval=0) as url:
        writer, reader = await make_client(url), await make_client(url)
        wdoc, rdoc = await writer.subscribe("capped"), await reader.subscribe("capped")
        rdoc.held.max_ids = 5
        for i in range(20):
            crdt.insert_text(wdoc.ydoc, 0, f"{i},")
            await writer.wait_idle()
        await eventually(lambda: rdoc.text == wdoc.text)
        assert len(rdoc.held) == 5 and rdoc.held.since > StreamId(0, 0)
        await reader.drop_connection()
        await eventually(lambda: reader.connected.is_set() and rdoc.synced.is_set())
        crdt.insert_text(wdoc.ydoc, 0, "after,")
        await eventually(lambda: rdoc.text == wdoc.text)
        assert (reader.resyncs, reader.drifts) == (0, 0)


# ------------------------------------------------------------- the protocol


async def test_matching_digests_resume_in_one_round_trip(redis_url, make_client):
    async with running_server(redis_url, **NO_GC) as url:
        writer, reader = await make_client(url), await make_client(url)
        wdoc, rdoc = await writer.subscribe("doc"), await reader.subscribe("doc")
        for i in range(20):
            crdt.insert_text(wdoc.ydoc, 0, f"<w{i}>")
        await eventually(lambda: rdoc.text == wdoc.text)
        events: list[str] = []
        reader.on_event = lambda name, data: events.append(name)
        await reader.drop_connection()
        for i in range(5):
            crdt.insert_text(wdoc.ydoc, 0, f"<x{i}>")
        await eventually(lambda: rdoc.text == wdoc.text and reader.connected.is_set())
        assert reader.drifts == 0 and reader.resyncs == 0
        assert "resync_required" not in events


async def test_restored_backup_is_detected_and_repaired_by_the_digest(redis_url, redis_client, make_client):
    """The server goes back to an older state of the document (a restore from
    backup): the first client to return is ahead and resyncs; its repair
    appends new entries, so the second client is no longer ahead. Only the
    digest shows that the server lost entries it holds."""
    async with running_server(redis_url, **NO_GC) as url:
        first, second = await make_client(url), await make_client(url)
        one, two = await first.subscribe("doc"), await second.subscribe("doc")
        crdt.insert_text(one.ydoc, 0, "<before>")
        await eventually(lambda: two.text == "<before>")
        backup = await dump_document(redis_client, "doc")
        for i in range(5):
            crdt.insert_text(one.ydoc, 0, f"<one{i}>")
            crdt.insert_text(two.ydoc, 0, f"<two{i}>")
        await first.wait_idle()
        await second.wait_idle()
        await eventually(lambda: one.text == two.text)
        second.urls = [NOWHERE]  # keep the second client away until the first repaired
        await second.drop_connection()
        await restore_document(redis_client, "doc", backup)

        await first.drop_connection()
        await eventually(lambda: first.resyncs == 1 and first.pending == 0 and first.connected.is_set())
        crdt.insert_text(one.ydoc, 0, "<after>")
        await first.wait_idle()

        second.urls = [url]
        await eventually(lambda: one.text == two.text and second.pending == 0, timeout=15)
        assert second.drifts == 1
        for token in ["<before>", "<after>", *tokens(5, "one"), *tokens(5, "two")]:
            assert token in one.text
        server_doc, _ = await DocumentStore(redis_client).load_document("doc")
        assert crdt.text_of(server_doc) == one.text


async def test_find_rewound_asks_for_the_ids_not_the_last_id(redis_client):
    """A lost tail is found even once new entries were appended after it
    (the last id moved past everything seen); an entry GC trimmed is not lost."""
    store = DocumentStore(redis_client)
    for doc in ("lost", "trimmed", "intact"):
        await append_text(store, doc, 3, "a")
    backup = await dump_document(redis_client, "lost")
    await append_text(store, "lost", 2, "b")
    seen = {doc: [StreamId.parse((await stream_ids(redis_client, doc))[-1])] for doc in ("lost", "trimmed", "intact")}
    await restore_document(redis_client, "lost", backup)
    await append_text(store, "lost", 1, "c")  # past everything seen, after the loss
    assert await store.last_id("lost") > seen["lost"][0]
    await Collector(redis_client, GcPolicy(relative_ms=5, absolute_ms=50)).collect(["trimmed"])
    assert await stream_ids(redis_client, "trimmed") == []

    assert await find_rewound(redis_client, seen) == {"lost": await store.last_id("lost")}
    assert await find_rewound(redis_client, {"intact": [ZERO], "new": [ZERO]}) == {}


async def test_live_clients_give_back_what_redis_lost_without_reconnecting(redis_url, redis_client, make_client):
    """Redis comes back older while the websockets stay open (a restart from
    a backup or an AOF that lacks the tail: the server's connections to it
    drop, the clients' do not). The fan-out finds the entries it had read
    gone and the live subscribers resync: their two-way exchange gives the
    lost updates back, with no client reconnecting."""
    events: list[str] = []
    async with running_server(redis_url, **NO_GC) as url:
        first = await make_client(url, on_event=lambda event, _: events.append(event))
        second = await make_client(url, on_event=lambda event, _: events.append(event))
        one, two = await first.subscribe("doc"), await second.subscribe("doc")
        crdt.insert_text(one.ydoc, 0, "<before>")
        await eventually(lambda: two.text == "<before>")
        backup = await dump_document(redis_client, "doc")
        await edit_both(one, two, "lost", 3)
        await settle(first, second, one, two)
        await restore_document(redis_client, "doc", backup)
        await redis_client.client_kill_filter(_type="normal", skipme=True)  # as a restart drops them
        assert await stored_text(redis_client, "doc") == "<before>"  # the loss is real

        deadline = asyncio.get_running_loop().time() + 20
        while (stored := await stored_text(redis_client, "doc")) != one.text:
            assert asyncio.get_running_loop().time() < deadline, f"Redis holds {stored!r}, not {one.text!r}"
            await asyncio.sleep(0.05)
        for token in ["<before>", *tokens(3, "lost-one"), *tokens(3, "lost-two")]:
            assert token in stored
        assert "disconnected" not in events and events.count("resync_required") == 2
        await settle(first, second, one, two)


async def stored_text(redis_client, doc: str) -> str:
    stored, _ = await DocumentStore(redis_client).load_document(doc)
    return crdt.text_of(stored)


async def restore_document(redis_client, doc: str, backup: dict[str, bytes | None]) -> None:
    async with redis_client.pipeline(transaction=True) as pipe:
        for key, value in backup.items():
            pipe.delete(key)
            if value is not None:
                pipe.restore(key, 0, value, replace=True)
        await pipe.execute()


async def test_failover_to_a_replica_that_missed_writes_converges(tmp_path, make_client):
    """Primary + replica; the replica is promoted while the primary still
    accepts (and acks) updates it never replicates. Every update any live
    client holds ends up in the promoted replica and in every client."""
    primary = RedisProcess(tmp_path / "primary").start()
    replica = RedisProcess(tmp_path / "replica", extra_config={"replicaof": f"127.0.0.1 {primary.port}"}).start()
    try:
        await wait_replicating(replica)
        new_port = free_port()
        new_url = f"ws://127.0.0.1:{new_port}/ws"
        async with contextlib.AsyncExitStack() as old_server:
            old_url = await old_server.enter_async_context(running_server(primary.url, **NO_GC))
            first = await make_client([old_url, new_url])
            second = await make_client(old_url)
            one, two = await first.subscribe("doc"), await second.subscribe("doc")
            await edit_both(one, two, "early", 8)
            await settle(first, second, one, two)
            redis_sync.Redis(port=primary.port).wait(1, 5000)  # the replica has all of it

            redis_sync.Redis(port=replica.port).replicaof("NO", "ONE")  # promoted too early
            await edit_both(one, two, "lost", 8)  # acked by the old primary only
            await settle(first, second, one, two)
            second.urls = [NOWHERE]  # the second client stays away until the first repaired
            async with running_server(replica.url, port=new_port, **NO_GC):
                await old_server.aclose()
                primary.kill()
                await eventually(
                    lambda: first.connected.is_set() and first.pending == 0 and first.resyncs >= 1, timeout=20
                )
                crdt.insert_text(one.ydoc, 0, "<late>")
                await first.wait_idle()
                second.urls = [new_url]
                await eventually(lambda: one.text == two.text and second.pending == 0, timeout=20)
                assert second.drifts >= 1
                for token in ["<late>", *tokens(8, "early-one"), *tokens(8, "lost-one"), *tokens(8, "lost-two")]:
                    assert token in one.text
                promoted = Redis.from_url(replica.url)
                server_doc, _ = await DocumentStore(promoted).load_document("doc")
                await promoted.aclose()
                assert crdt.text_of(server_doc) == one.text
    finally:
        replica.stop()
        primary.stop()


async def settle(first, second, one, two) -> None:
    await first.wait_idle()
    await second.wait_idle()
    await eventually(lambda: one.text == two.text)


async def edit_both(one, two, tag: str, rounds: int) -> None:
    for i in range(rounds):
        crdt.insert_text(one.ydoc, 0, f"<{tag}-one{i}>")
        crdt.insert_text(two.ydoc, 0, f"<{tag}-two{i}>")
        await asyncio.sleep(0.01)


async def wait_replicating(replica: RedisProcess, timeout: float = 15.0) -> None:
    client = redis_sync.Redis(port=replica.port)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while client.info("replication").get("master_link_status") != "up":
        if loop.time() > deadline:
            raise AssertionError("replica never linked to the primary")
        await asyncio.sleep(0.05)


async def test_server_started_with_verify_digests_fixes_wrong_ones(redis_url, redis_client, caplog):
    store, digests = DocumentStore(redis_client), StreamDigests(redis_client)
    await append_text(store, "d", 12, "a")
    await digests.window("d", ZERO, await store.last_id("d"))
    sessions = session_documents(redis_client, "session-for-verify-0001")
    await sessions.add(["d", "e"])
    await redis_client.hset(meta_key("d"), "digest_hash", "f" * 32)
    await redis_client.hset(sessions.digest_key, "hash", "e" * 32)

    with caplog.at_level(logging.INFO, logger="yrelay"):
        async with running_server(redis_url, verify_digests=True, **NO_GC):
            pass
    assert "drift digest of d was wrong" in caplog.text
    assert "subscription-set digest of session session-for-verify-0001 was wrong" in caplog.text
    assert "drift digests: 2 wrong, all fixed" in caplog.text
    assert not (await digests.recompute("d", fix=False)).wrong
    assert await sessions.digest() == digest_of(["d", "e"])


async def test_a_lost_own_update_past_the_last_delivery_is_given_back(redis_url, redis_client, make_client):
    """A lone writer's newest updates are acked, then lost (restore from
    backup); it holds no delivery past them, so only the ``through`` of its
    digest shows the server is behind."""
    async with running_server(redis_url, **NO_GC) as url:
        writer = await make_client(url)
        doc = await writer.subscribe("solo")
        crdt.insert_text(doc.ydoc, 0, "<before>")
        await writer.wait_idle()
        backup = await dump_document(redis_client, "solo")
        crdt.insert_text(doc.ydoc, 0, "<lost>")
        await writer.wait_idle()
        await restore_document(redis_client, "solo", backup)
        synced: list[dict] = []
        writer.on_event = lambda name, data: synced.append(data) if name == "synced" else None
        await writer.drop_connection()
        # The sync reply, not the request: what the server lacks is sent on the reply.
        await eventually(lambda: writer.resyncs == 1 and synced and writer.pending == 0 and writer.connected.is_set())
        await writer.wait_idle()
        server_doc, _ = await DocumentStore(redis_client).load_document("solo")
        assert crdt.text_of(server_doc) == doc.text == "<lost><before>"
