"""Causal admission: an acked update is one the document can apply.

The failure it prevents, seen from outside: a client's update (Yjs clock 68)
is refused while Redis is down; its later updates (69-76) are appended and
acked; the client dies before resending 68. Yjs applies one client's structs
only in clock order, so 69-76 stay pending for ever in every replica and in
GC's snapshot: acked, stored, and never visible to anyone.
"""

from __future__ import annotations

import base64
import dataclasses

import pytest

from conftest import running_server
from wsraw import RawPeer
from yrelay.storage.append import NotAdmitted, append_one
from yrelay.storage.keys import clocks_key, meta_key, stream_key
from yrelay.storage.reads import DocumentStore
from yrelay.yjs import admission, crdt, update_format
from yrelay.yjs.lib0 import write_varuint as _write_uint


def typed(client_id: int, words: list[str]) -> tuple[crdt.Doc, list[bytes]]:
    """A document of Yjs client ``client_id`` typing ``words``, one update each."""
    doc = crdt.new_doc(client_id)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    for word in words:
        crdt.insert_text(doc, len(crdt.text_of(doc)), word)
    return doc, updates


def combine(*updates: bytes) -> bytes:
    """One update carrying the struct sections of several (no deletions), as
    Yjs's encodeStateAsUpdate does for a client holding pending structs."""
    out = bytearray()
    layouts = [(u, update_format.read_layout(u)) for u in updates]
    _write_uint(out, sum(len(layout.sections) for _, layout in layouts))
    for update, layout in layouts:
        for section in layout.sections:
            _write_uint(out, len(section.structs))
            _write_uint(out, section.client)
            _write_uint(out, section.structs[0].clock)
            out += update[section.structs[0].start : section.structs[-1].end]
    out += b"\x00"
    return bytes(out)


def text_of_stream(entries: list[bytes], snapshot: bytes = b"") -> str:
    doc = crdt.new_doc()
    for update in ([snapshot] if snapshot else []) + entries:
        crdt.apply_update(doc, update)  # in stream order, once: what every reader does
    return crdt.text_of(doc)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ------------------------------------------------------------------ the rules


def test_needs_of_typing_is_the_previous_clock_and_its_left_neighbour():
    _, updates = typed(7, ["ab", "cd", "ef"])
    needs = [admission.needs_of(update_format.read_layout(u)) for u in updates]
    assert needs[0].ranges == {7: [(0, 2)]} and needs[0].refs == {}
    assert needs[1].ranges == {7: [(2, 4)]} and needs[1].refs == {7: 1}
    assert admission.missing(needs[1], {}) == {7: 0}
    assert admission.missing(needs[1], {7: 2}) == {}
    assert admission.missing(needs[2], {7: 2}) == {7: 2}  # clock 4 is past the document's 2


def test_a_deletion_of_content_the_document_lacks_does_not_block():
    doc, updates = typed(7, ["hello"])
    deletions: list[bytes] = []
    crdt.observe_updates(doc, deletions.append)
    crdt.delete_text(doc, 0, 2)
    [deletion] = deletions
    assert admission.missing(admission.needs_of(update_format.read_layout(deletion)), {}) == {}


def test_an_update_refering_to_content_it_does_not_carry_in_order_is_inconsistent():
    _, [first, second] = typed(7, ["ab", "cd"])
    # the second's structs, renumbered to start at 0: it now refers to clock 1 of
    # its own client, which it only carries later (a cycle no encoder writes)
    layout = update_format.read_layout(second)
    forged = bytearray(b"\x01\x01\x07\x00") + second[layout.sections[0].structs[0].start :]
    with pytest.raises(admission.InconsistentUpdate):
        admission.needs_of(update_format.read_layout(bytes(forged)))


def test_ready_part_keeps_what_applies_and_names_what_does_not():
    _, theirs = typed(77, ["aa", "bb", "cc"])
    _, mine = typed(8, ["mine"])
    diff = combine(theirs[1], theirs[2], mine[0])  # 77's clocks 2-6 without 0-2: pending
    part = admission.ready_part(diff, update_format.read_layout(diff), {})
    assert part.dropped == {77: [(2, 6)]}
    assert part.update is not None and text_of_stream([part.update]) == "mine"
    assert admission.missing(part.needs, {}) == {}
    full = admission.ready_part(diff, update_format.read_layout(diff), {77: 2})
    assert full.dropped == {} and full.update == diff


def test_state_builder_integrates_out_of_order_entries_and_reports_the_stuck_ones():
    _, updates = typed(7, ["a", "b", "c", "d"])
    builder = admission.StateBuilder()
    for index in (3, 1, 2):
        builder.add(str(index), updates[index])
    assert builder.clocks == {} and {b.entry_id for b in builder.blocked} == {"1", "2", "3"}
    builder.add("0", updates[0])
    assert builder.clocks == {7: 4} and builder.blocked == []


# ------------------------------------------------------------------ the server


async def refuse_writes(redis_client, refuse: bool) -> None:
    """Make every Redis write fail (no replica can satisfy the minimum), as an
    outage does for the append script; nothing else changes."""
    await redis_client.config_set("min-replicas-to-write", 1 if refuse else 0)


async def test_a_later_update_behind_one_that_was_never_stored_is_not_acked(server_url, redis_client):
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "notes"})
    await peer.expect("subscribed")
    doc, updates = typed(68, ["sixty-eight ", "sixty-nine ", "seventy "])
    await refuse_writes(redis_client, True)
    try:
        first = await peer.update("notes", 1, updates[0])
    finally:
        await refuse_writes(redis_client, False)
    assert (first["op"], first["code"], first["clock"]) == ("error", "unavailable", 1)
    # Redis is back: the later updates come first (the resend timer of clock 1 has not fired)
    for clock, update in ((2, updates[1]), (3, updates[2])):
        answer = await peer.update("notes", clock, update)
        assert (answer["op"], answer["code"], answer["doc"], answer["clock"]) == (
            "error",
            "missing_dependency",
            "notes",
            clock,
        )
        assert answer["missing"] == {"68": 0}
    assert await redis_client.xlen(stream_key("notes")) == 0
    await peer.close()  # the client dies before resending: nothing it was told is saved is missing

    reader = await RawPeer.connect(server_url)
    await reader.send({"op": "subscribe", "doc": "notes"})
    await reader.expect("subscribed")
    await reader.nothing(0.3)


async def test_resent_in_order_every_update_is_acked_and_visible(server_url, redis_client):
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "notes"})
    await peer.expect("subscribed")
    doc, updates = typed(68, ["one ", "two ", "three "])
    assert (await peer.update("notes", 2, updates[1]))["code"] == "missing_dependency"
    for clock, update in enumerate(updates, start=1):
        assert (await peer.update("notes", clock, update))["op"] == "appended"
    entries = [fields[b"u"] for _, fields in await redis_client.xrange(stream_key("notes"))]
    assert text_of_stream(entries) == "one two three "
    assert await redis_client.hgetall(clocks_key("notes")) == {b"68": str(len("one two three ")).encode()}


async def test_a_sync_push_stores_its_ready_part_and_names_the_rest(server_url, redis_client):
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "d"})
    await peer.expect("subscribed")
    _, theirs = typed(77, ["lost ", "stuck "])
    _, mine = typed(8, ["mine"])
    diff = combine(theirs[1], mine[0])  # holds 77's second update pending, as Yjs would
    assert (await peer.update("d", 1, diff))["code"] == "missing_dependency"  # a plain update: whole or nothing
    await peer.send({"op": "update", "doc": "d", "clock": 2, "update": b64(diff), "sync": True})
    answer = await peer.expect("appended")
    assert answer["id"] is not None and answer["dropped"] == {"77": [[5, 11]]}
    entries = [fields[b"u"] for _, fields in await redis_client.xrange(stream_key("d"))]
    assert text_of_stream(entries) == "mine"
    # nothing of it applies: nothing stored, and the client is told
    await peer.send({"op": "update", "doc": "d", "clock": 3, "update": b64(theirs[1]), "sync": True})
    answer = await peer.expect("appended")
    assert answer["id"] is None and answer["dropped"] == {"77": [[5, 11]]}
    assert await redis_client.xlen(stream_key("d")) == 1


async def test_a_document_written_before_admission_gets_its_state_vector_rebuilt(redis_url, redis_client):
    """Entries written by an older server (no clocks hash): the first append
    rebuilds the state vector from them, then admits against it."""
    _, updates = typed(5, ["old ", "history ", "new"])
    for index, update in enumerate(updates[:2]):
        entry_id = f"{1000 + index}-0"
        await redis_client.xadd(stream_key("legacy"), {"u": update, "s": "old", "c": index}, id=entry_id)
        await redis_client.hset(meta_key("legacy"), "last_id", entry_id)
    async with running_server(redis_url) as url:
        peer = await RawPeer.connect(url)
        await peer.send({"op": "subscribe", "doc": "legacy"})
        await peer.expect("subscribed")
        answer = await peer.update("legacy", 1, updates[2])
        assert answer["op"] == "appended", answer
    assert await redis_client.hget(meta_key("legacy"), "clocks_through") == answer["id"].encode()
    assert await redis_client.hget(clocks_key("legacy"), "5") == str(len("old history new")).encode()


async def test_a_document_of_a_newer_layout_is_refused_not_written(server_url, redis_client):
    _, [update] = typed(5, ["x"])
    await redis_client.hset(meta_key("future"), mapping={"layout": 3, "last_id": "5-0", "clocks_through": "5-0"})
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "future"})
    await peer.expect("subscribed")
    answer = await peer.update("future", 1, update)
    assert (answer["op"], answer["code"]) == ("error", "unavailable")
    assert await redis_client.xlen(stream_key("future")) == 0


async def test_store_append_refuses_too(redis_client):
    store = DocumentStore(redis_client)
    await store.load_scripts()
    _, updates = typed(9, ["a", "b"])
    with pytest.raises(NotAdmitted) as refused:
        await append_one(store, "s", "session", 1, updates[1])
    assert refused.value.lacking == {9: 0}
    await append_one(store, "s", "session", 0, updates[0])
    await append_one(store, "s", "session", 1, updates[1])


def test_an_update_of_more_structs_than_any_document_encodes_to_is_refused():
    """Each struct read costs an object: a hostile 16 MiB of two-byte structs
    must be refused, not materialised."""
    out = bytearray()
    for value in (1, update_format.MAX_STRUCTS + 1, 5, 0):
        _write_uint(out, value)
    out += b"\x00\x01" * 10
    with pytest.raises(update_format.MalformedUpdate, match="structs"):
        update_format.read_layout(bytes(out))


def hostile_chain(length: int) -> bytes:
    """``length`` one-item sections, client ``i``'s item referring to client
    ``i + 1``'s: listed in that order, a pass-per-change fixpoint admits one
    section per pass (quadratic); the last one is a root item."""
    out = bytearray()
    _write_uint(out, length)
    for index in range(length):
        client = index + 1
        for value in (1, client, 0):  # one struct, at clock 0
            _write_uint(out, value)
        if index < length - 1:
            out.append(0x80 | 4)  # origin, ContentString
            _write_uint(out, client + 1)
            _write_uint(out, 0)
        else:
            out += b"\x04\x01\x01x"  # no origin: parent is the root type "x"
        out += b"\x01a"
    return bytes(out + b"\x00")


class CountedRefs(tuple):
    """A struct's refs that count how often any fixpoint looks at them."""

    looks = 0

    def __iter__(self):
        CountedRefs.looks += 1
        return super().__iter__()


def test_a_chain_of_sections_is_integrated_in_one_pass_per_link():
    """The fixpoint wakes a section only when what stops it arrives: a
    hostile chain costs a few looks per section, not one pass per link
    (2,000 links: a pass per change would look about 2,000,000 times)."""
    chain = hostile_chain(2_000)
    layout = update_format.read_layout(chain)
    sections = tuple(
        update_format.Section(
            section.client,
            tuple(dataclasses.replace(struct, refs=CountedRefs(struct.refs)) for struct in section.structs),
        )
        for section in layout.sections
    )
    layout = dataclasses.replace(layout, sections=sections)
    CountedRefs.looks = 0
    assert admission.missing(admission.needs_of(layout), {}) == {}
    part = admission.ready_part(chain, layout, {})
    assert part.dropped == {} and part.update == chain
    assert CountedRefs.looks <= 4 * 2 * 2_000  # two fixpoints and the needs, a few looks per section each


def test_an_update_involving_too_many_clients_is_refused():
    layout = update_format.read_layout(hostile_chain(admission.MAX_CLIENTS + 1))
    with pytest.raises(update_format.MalformedUpdate, match="Yjs clients"):
        admission.needs_of(layout)
