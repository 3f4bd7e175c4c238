"""The fan-out and the consumer groups' reader on one Redis read the
documents the change stream names (yrelay/storage/reader.py), and every
followed document at each sweep: an edit reaches the other clients (a
group's member) long before a sweep, an append nobody announced arrives
with the next sweep, and a change stream that cannot be read costs nothing
but the old way of reading."""

from __future__ import annotations

import asyncio

import redis.exceptions
from redis.asyncio import Redis

from conftest import eventually, running_server
from yrelay.consumers import ConsumerGroup
from yrelay.storage import reader as storage_reader
from yrelay.storage.append import append_args, append_keys, append_one, needs_or_nothing
from yrelay.storage.change_feed import announce
from yrelay.storage.keys import changes_key, stream_key
from yrelay.storage.reader import DocumentReader
from yrelay.storage.reads import DocumentStore
from yrelay.yjs import crdt

#: A sweep so rare that a test waiting for a delivery never sees one.
NO_SWEEP_MS = 120_000


async def test_an_edit_reaches_the_reader_without_waiting_for_a_sweep(redis_url, make_client, monkeypatch):
    reads: list[int] = []
    xread = DocumentReader._xread

    async def counting(self, readable, count, block_ms, listening):  # type: ignore[no-untyped-def]
        reads.append(len(readable))
        return await xread(self, readable, count, block_ms, listening)

    monkeypatch.setattr(DocumentReader, "_xread", counting)
    async with running_server(redis_url, block_ms=NO_SWEEP_MS) as url:
        writer, reader = await make_client(url), await make_client(url)
        for i in range(30):  # documents followed, untouched
            await reader.subscribe(f"quiet-{i}")
        await writer.subscribe("typed")
        doc = await reader.subscribe("typed")
        reads.clear()
        crdt.insert_text(writer.docs["typed"].ydoc, 0, "hello")
        await eventually(lambda: doc.text == "hello")
    # Delivered by rounds over the documents woken (the announced one, and
    # any just subscribed whose first read was still due), never all 31.
    assert reads and max(reads) < 31, reads


async def test_an_append_nobody_announced_arrives_with_the_next_sweep(redis_url, redis_client, make_client):
    async with running_server(redis_url, block_ms=300) as url:
        reader = await make_client(url)
        doc = await reader.subscribe("by-hand")
        before = await redis_client.xlen(changes_key())
        # An append as a server of an older version makes it: the script alone.
        source = crdt.new_doc()
        crdt.insert_text(source, 0, "unannounced")
        update = crdt.encode_state(source)
        store = DocumentStore(redis_client)
        await store.scripts.append(
            keys=append_keys("by-hand"),
            args=append_args([("old-server-session-01", 1, update, needs_or_nothing(update))]),
        )
        assert await redis_client.xlen(changes_key()) == before  # nothing announced it
        await eventually(lambda: doc.text == "unannounced", timeout=10)


async def test_a_change_stream_of_the_wrong_type_loses_no_edit(redis_url, redis_client, make_client):
    await redis_client.delete(changes_key())
    await redis_client.set(changes_key(), "not a stream")
    try:
        async with running_server(redis_url, block_ms=NO_SWEEP_MS) as url:
            writer, reader = await make_client(url), await make_client(url)
            await writer.subscribe("wrong-type")
            doc = await reader.subscribe("wrong-type")
            crdt.insert_text(writer.docs["wrong-type"].ydoc, 0, "still here")
            # Acked (the announcement's refusal is not the append's) and delivered
            # (the reader, unable to read the change stream, reads every document).
            await eventually(lambda: writer.pending == 0 and doc.text == "still here")
            entries = await redis_client.xrange("yrelay:{wrong-type}:stream")
            assert len(entries) == 1
    finally:
        await redis_client.delete(changes_key())


async def test_a_direct_append_announces_its_document(redis_client):
    store = DocumentStore(redis_client)
    source = crdt.new_doc()
    crdt.insert_text(source, 0, "x")
    last = await redis_client.xrevrange(changes_key(), count=1)
    await append_one(store, "announced", "tool-session-0001", 1, crdt.encode_state(source))
    [(_, fields)] = await redis_client.xrange(changes_key(), min=f"({last[0][0].decode()}" if last else "-")
    assert fields[b"d"] == b"announced"


async def test_an_announcement_redis_refuses_is_only_logged(redis_client, caplog):
    await redis_client.delete(changes_key())
    await redis_client.set(changes_key(), "not a stream")
    try:
        await announce(redis_client, ["anything"])  # after a write that is done: nothing to fail
        assert "the next sweep delivers them" in caplog.text
    finally:
        await redis_client.delete(changes_key())


# ------------------------------------------------- a consumer group's reader


async def _member(redis_client, group: str, prefix: str, lease: float) -> tuple[ConsumerGroup, asyncio.Task, list]:
    """A member of ``group`` over the documents under ``prefix`` that acks
    each batch; the (doc, id) of every entry it was handed."""
    member = ConsumerGroup(redis_client, group, member=f"{group}-m", lease=lease, prefix=prefix)
    await member.start()
    got: list[tuple[str, str]] = []

    async def consume() -> None:
        async for batch in member.batches():
            got.extend((batch.doc, str(entry_id)) for entry_id in batch.ids)
            try:
                await batch.ack()
            except redis.exceptions.RedisError:  # as an application would: the batch comes again
                pass

    return member, asyncio.create_task(consume()), got


async def _stop(member: ConsumerGroup, task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await member.leave()


async def _append(store: DocumentStore, doc: str, clock: int, text: str) -> str:
    source = crdt.new_doc()
    crdt.insert_text(source, 0, text)
    entry_id, _ = await append_one(store, doc, "feed-writer-session", clock, crdt.encode_state(source))
    return str(entry_id)


async def test_a_group_member_is_woken_by_the_change_stream(redis_client, monkeypatch):
    store = DocumentStore(redis_client)
    docs = [f"cf-woken-{i}" for i in range(30)]
    first = {(doc, await _append(store, doc, 1, "a")) for doc in docs}
    reads: list[int] = []
    xread = DocumentReader._xread

    async def counting(self, readable, count, block_ms, listening):  # type: ignore[no-untyped-def]
        reads.append(len(readable))  # the documents' streams, not the change stream
        return await xread(self, readable, count, block_ms, listening)

    monkeypatch.setattr(DocumentReader, "_xread", counting)
    # A lease of 300 s: the member's sweep (every lease / 3) never comes in this test.
    member, task, got = await _member(redis_client, "cf-woken", "cf-woken-", lease=300.0)
    try:
        await eventually(lambda: first <= set(got), timeout=15)
        reads.clear()
        later = await _append(store, "cf-woken-7", 2, "b")
        await eventually(lambda: ("cf-woken-7", later) in got, timeout=10)
    finally:
        await _stop(member, task)
    # Read because the change stream named it, in rounds over what was woken, never all 30.
    assert reads and max(reads) < len(docs), reads


async def test_a_group_member_reads_an_unannounced_append_at_the_next_sweep(redis_client):
    store = DocumentStore(redis_client)
    member, task, got = await _member(redis_client, "cf-sweep", "cf-sweep-", lease=1.2)
    try:
        await _append(store, "cf-sweep-doc", 1, "a")
        await eventually(lambda: len(got) == 1, timeout=10)
        source = crdt.new_doc()
        crdt.insert_text(source, 0, "unannounced")
        update = crdt.encode_state(source)
        before = await redis_client.xlen(changes_key())
        await store.scripts.append(
            keys=append_keys("cf-sweep-doc"),
            args=append_args([("old-server-session-02", 1, update, needs_or_nothing(update))]),
        )
        assert await redis_client.xlen(changes_key()) == before  # nothing announced it
        [(last, _)] = await redis_client.xrevrange(stream_key("cf-sweep-doc"), count=1)
        await eventually(lambda: len(got) == 2, timeout=10)
        assert got[1] == ("cf-sweep-doc", last.decode())
    finally:
        await _stop(member, task)


async def test_a_group_member_reads_on_past_a_change_stream_of_the_wrong_type(redis_client):
    store = DocumentStore(redis_client)
    await redis_client.delete(changes_key())
    await redis_client.set(changes_key(), "not a stream")
    member, task, got = await _member(redis_client, "cf-wrong", "cf-wrong-", lease=1.2)
    try:
        first = await _append(store, "cf-wrong-doc", 1, "a")
        second = await _append(store, "cf-wrong-doc", 2, "b")
        await eventually(lambda: [entry for _, entry in got] == [first, second], timeout=10)
    finally:
        await redis_client.delete(changes_key())
        await _stop(member, task)


async def test_a_document_of_the_wrong_type_does_not_stop_a_member(redis_client, caplog):
    store = DocumentStore(redis_client)
    member, task, got = await _member(redis_client, "cf-poison", "cf-poison-", lease=1.2)
    try:
        bad = await _append(store, "cf-poison-bad", 1, "a")
        await eventually(lambda: ("cf-poison-bad", bad) in got, timeout=10)
        await redis_client.delete(stream_key("cf-poison-bad"))
        await redis_client.set(stream_key("cf-poison-bad"), "not a stream")  # held by the member, unreadable
        good = [await _append(store, "cf-poison-good", clock, text) for clock, text in ((1, "b"), (2, "c"))]
        await eventually(lambda: [entry for doc, entry in got if doc == "cf-poison-good"] == good, timeout=10)
        assert "cf-poison-bad cannot be read" in caplog.text
    finally:
        await redis_client.delete(stream_key("cf-poison-bad"))
        await _stop(member, task)


async def make_redis_busy(redis_client, doc: str, seconds: float, windows: int = 5) -> None:
    """Redis answers BUSY to everyone for ``seconds``, ``windows`` times (a
    script that loops past ``lua-time-limit``, 0.1 s here, then SCRIPT
    KILL), while ``doc`` is being appended to, so its readers are likely in
    the middle of reading when Redis turns busy."""
    store, appended, stop = DocumentStore(redis_client), 0, asyncio.Event()

    async def append_on() -> None:  # stopped, not cancelled: a command cancelled in flight can hang redis-py
        nonlocal appended
        while not stop.is_set():
            try:
                await _append(store, doc, 1000 + appended, "x")
                appended += 1
            except redis.exceptions.ResponseError:  # BUSY: the append is not made
                pass
            await asyncio.sleep(0.003)

    limit = (await redis_client.config_get("lua-time-limit"))["lua-time-limit"]
    appending = asyncio.create_task(append_on())
    await redis_client.config_set("lua-time-limit", 100)
    try:
        for _ in range(windows):  # a reader blocked in XREAD when one starts waits it out: several chances
            started = appended
            await eventually(lambda: appended >= started + 10)  # noqa: B023 - called within this iteration, never after it
            await _busy(redis_client, seconds)
    finally:
        stop.set()
        await appending
        await redis_client.config_set("lua-time-limit", limit)


async def _busy(redis_client, seconds: float) -> None:
    looping = asyncio.create_task(Redis(connection_pool=redis_client.connection_pool).eval("while true do end", 0))
    try:
        await asyncio.sleep(seconds)
    finally:
        while not looping.done():
            try:
                await redis_client.script_kill()
            except redis.exceptions.ResponseError:  # not running yet, or already killed
                await asyncio.sleep(0.05)
        await asyncio.gather(looping, return_exceptions=True)


async def test_a_busy_redis_sets_no_document_aside_for_a_member(redis_client, caplog):
    """BUSY (a long script) is Redis's passing state, not a document's: a
    member retries, and an append after it is read at once, not in 30 s."""
    store = DocumentStore(redis_client)
    member, task, got = await _member(redis_client, "cf-busy", "cf-busy-", lease=3.0)
    try:
        first = await _append(store, "cf-busy-doc", 1, "before")
        await eventually(lambda: ("cf-busy-doc", first) in got, timeout=10)
        await make_redis_busy(redis_client, "cf-busy-doc", 0.4)
        last = await _append(store, "cf-busy-doc", 2, "after")
        await eventually(lambda: ("cf-busy-doc", last) in got, timeout=8)
        assert "cannot be read" not in caplog.text
    finally:
        await _stop(member, task)


async def test_a_busy_redis_sets_no_document_aside_for_the_fan_out(redis_url, redis_client, make_client, caplog):
    async with running_server(redis_url) as url:
        reader = await make_client(url)
        doc = await reader.subscribe("busy-doc")
        await _append(DocumentStore(redis_client), "busy-doc", 1, "before")
        await eventually(lambda: "before" in doc.text)
        await make_redis_busy(redis_client, "busy-doc", 0.4)
        await _append(DocumentStore(redis_client), "busy-doc", 2, "after")
        await eventually(lambda: "after" in doc.text, timeout=8)
    assert "cannot be read" not in caplog.text  # nor its subscribers told it is unavailable
    assert "fan-out reader failed" not in caplog.text  # a warning, not a traceback as for a bug


async def test_a_document_set_aside_is_read_again_once_repaired_by_the_fan_out_and_a_member(
    redis_url, redis_client, make_client, monkeypatch, caplog
):
    """One set-aside rule for both users of the reader loop: a stream of the
    wrong type is set aside by each (logged; the fan-out's subscribers told),
    and once the key is repaired and the set-aside over, both read it on."""
    monkeypatch.setattr(storage_reader, "SET_ASIDE_SECONDS", 1.0)
    store, doc, key = DocumentStore(redis_client), "cf-repair-doc", stream_key("cf-repair-doc")
    member, task, got = await _member(redis_client, "cf-repair", "cf-repair-", lease=1.2)
    try:
        async with running_server(redis_url, block_ms=300) as url:
            client = await make_client(url)
            subscribed = await client.subscribe(doc)
            first = await _append(store, doc, 1, "a")
            await eventually(lambda: (doc, first) in got and subscribed.text == "a", timeout=10)
            await redis_client.rename(key, "cf-repair-kept")
            await redis_client.set(key, "not a stream")
            await eventually(
                lambda: (
                    f"fan-out: document {doc} cannot be read" in caplog.text
                    and f"consumer group cf-repair: document {doc} cannot be read" in caplog.text
                ),
                timeout=10,
            )
            await eventually(lambda: any(e.get("code") == "document_unavailable" for e in client.errors), timeout=10)
            await redis_client.delete(key)
            await redis_client.rename("cf-repair-kept", key)
            second = await _append(store, doc, 2, "b")
            await eventually(lambda: (doc, second) in got and sorted(subscribed.text) == ["a", "b"], timeout=15)
    finally:
        await redis_client.delete("cf-repair-kept")
        await _stop(member, task)
