"""The Python client sends each document's updates in clock order: one the
server refused holds back the later ones of its document (not of others),
and one refused for content the server lacks is resolved by a two-way sync
push (issue 15; server side: tests/test_admission.py)."""

from __future__ import annotations

import asyncio

from conftest import eventually, running_server
from yrelay.client import Backoff, YrelayClient
from yrelay.storage.keys import document_keys, stream_key
from yrelay.yjs import crdt

#: A slow first resend: what happens before it is what these tests look at.
SLOW_RESEND = Backoff(base=1.0, max_delay=2.0, jitter=0.0, max_attempts=30)


def record_sends(client: YrelayClient) -> list[tuple]:
    """(op, doc, clock, sync) of every frame the client sends, in order."""
    sent: list[tuple] = []
    original = client._send_quietly

    async def spy(frame: dict) -> None:
        sent.append((frame["op"], frame.get("doc"), frame.get("clock"), frame.get("sync", False)))
        await original(frame)

    client._send_quietly = spy  # type: ignore[method-assign]
    return sent


async def refuse_writes(redis_client, refuse: bool) -> None:
    """Every Redis write fails (as in an outage); reads go on."""
    await redis_client.config_set("min-replicas-to-write", 1 if refuse else 0)


def updates_sent(sent: list[tuple], doc: str) -> list[int]:
    return [clock for op, d, clock, _ in sent if op == "update" and d == doc]


async def stream_clocks(redis_client, doc: str) -> list[int]:
    return [int(fields[b"c"]) for _, fields in await redis_client.xrange(stream_key(doc))]


async def test_a_refused_update_holds_back_its_document_only(redis_url, redis_client, make_client):
    async with running_server(redis_url) as url:
        writer = await make_client(url, backoff=SLOW_RESEND)
        reader = await make_client(url)
        notes, other = await writer.subscribe("notes"), await writer.subscribe("other")
        rnotes = await reader.subscribe("notes")
        sent = record_sends(writer)
        await refuse_writes(redis_client, True)
        try:
            crdt.insert_text(notes.ydoc, 0, "sixty-eight ")  # clock 1
            await eventually(lambda: any(e.get("clock") == 1 for e in writer.errors))
        finally:
            await refuse_writes(redis_client, False)
        assert writer.errors[-1]["code"] == "unavailable"
        crdt.insert_text(notes.ydoc, len(notes.text), "sixty-nine ")  # clock 2: waits for clock 1
        crdt.insert_text(other.ydoc, 0, "elsewhere")  # clock 3: another document goes at once
        await eventually(lambda: any(a.doc == "other" for a in writer.acked), timeout=0.8)
        assert updates_sent(sent, "notes") == [1]  # clock 1's resend is not due yet; 2 was not sent
        await writer.wait_idle(10)
        assert updates_sent(sent, "notes") == [1, 1, 2]
        assert await stream_clocks(redis_client, "notes") == [1, 2]
        await eventually(lambda: rnotes.text == "sixty-eight sixty-nine ")


async def test_killed_before_the_resend_nothing_later_was_acked(redis_url, redis_client, make_client):
    """The issue's sequence with the Python client: clock 1 refused, later
    edits made, the client dies before resending: no later update of that
    document was stored or acked (so none is stuck behind a gap)."""
    async with running_server(redis_url) as url:
        writer = await make_client(url, backoff=SLOW_RESEND)
        notes = await writer.subscribe("notes")
        sent = record_sends(writer)
        await refuse_writes(redis_client, True)
        try:
            crdt.insert_text(notes.ydoc, 0, "a")
            await eventually(lambda: writer.errors)
        finally:
            await refuse_writes(redis_client, False)
        for word in "bcdefgh":
            crdt.insert_text(notes.ydoc, len(notes.text), word)
        await asyncio.sleep(0.3)
        await writer.close()
        assert updates_sent(sent, "notes") == [1]  # the later ones waited for its resend
        assert writer.acked == [] and await redis_client.xlen(stream_key("notes")) == 0


async def test_updates_refused_together_are_resent_in_order_without_a_sync(redis_url, redis_client, make_client):
    """Clocks 1 and 2 both fail in Redis. A missing_dependency for clock 2
    (what the server answers when 2 arrives before 1 is stored) starts no
    sync while clock 1 is unacked: the client resends 1, then 2."""
    async with running_server(redis_url) as url:
        writer = await make_client(url, backoff=SLOW_RESEND)
        notes = await writer.subscribe("notes")
        await refuse_writes(redis_client, True)
        try:
            crdt.insert_text(notes.ydoc, 0, "one ")
            crdt.insert_text(notes.ydoc, 4, "two ")
            await eventually(lambda: len(writer.errors) == 2)
            writer._handle(
                {
                    "op": "error",
                    "code": "missing_dependency",
                    "doc": "notes",
                    "clock": 2,
                    "missing": {str(notes.ydoc.client_id): 0},
                    "message": "as the server says it",
                }
            )
        finally:
            await refuse_writes(redis_client, False)
        await writer.wait_idle(10)
        assert writer.resyncs == 0
        assert await stream_clocks(redis_client, "notes") == [1, 2]


async def test_an_update_refused_for_content_the_server_lost_is_pushed_by_a_two_way_sync(
    redis_url, redis_client, make_client
):
    """B's edit builds on A's text, which the server then loses (its keys
    are gone, as after a restore from an older backup): refused with
    missing_dependency, B pushes what the server lacks as a sync push."""
    async with running_server(redis_url) as url:
        a, b = await make_client(url), await make_client(url)
        adoc, bdoc = await a.subscribe("d"), await b.subscribe("d")
        crdt.insert_text(adoc.ydoc, 0, "hello")
        await eventually(lambda: bdoc.text == "hello")
        await a.close()
        await redis_client.delete(*document_keys("d"))
        sent = record_sends(b)
        crdt.insert_text(bdoc.ydoc, 5, " world")
        await b.wait_idle(10)
        assert any(e["code"] == "missing_dependency" for e in b.errors)
        assert [f for f in sent if f[0] == "sync"] and [f for f in sent if f[0] == "update" and f[3]]
        assert b.pending == 0  # the refused edit was covered by the push
        c = await make_client(url)
        cdoc = await c.subscribe("d")
        await eventually(lambda: cdoc.text == "hello world")


async def test_a_sync_push_drops_the_updates_it_covers_unless_their_content_was_left_out(server_url, make_client):
    """Answers crafted as the server gives them (tests/test_admission.py
    shows it does): ``dropped`` naming another Yjs client's content (pending
    structs) still covers the earlier updates; naming this document's own
    client's content it does not, and they stay queued."""
    client = await make_client(server_url, backoff=SLOW_RESEND)
    doc = await client.subscribe("d")
    swallowed: list[dict] = []

    async def swallow(frame: dict) -> None:  # nothing reaches the server: the test answers
        swallowed.append(frame)

    client._send_quietly = swallow  # type: ignore[method-assign]
    own = str(doc.ydoc.client_id)
    crdt.insert_text(doc.ydoc, 0, "edit")
    client._enqueue("d", crdt.encode_state(doc.ydoc), sync=True)
    await eventually(lambda: [f["clock"] for f in swallowed] == [2])  # the push goes; the update it covers waits
    client._handle(
        {"op": "appended", "doc": "d", "clock": 2, "id": None, "duplicate": False, "dropped": {own: [[0, 4]]}}
    )
    assert [item.clock for item in client.buffer.all()] == [1]  # own content left out: clock 1 stays
    await eventually(lambda: [f["clock"] for f in swallowed] == [2, 1])  # and is sent again
    client._enqueue("d", crdt.encode_state(doc.ydoc), sync=True)
    client._handle(
        {"op": "appended", "doc": "d", "clock": 3, "id": "5-0", "duplicate": False, "dropped": {"424242": [[3, 9]]}}
    )
    assert client.pending == 0  # another client's pending content only: clock 1 was covered
