"""Nothing is stored that Yjs cannot apply (issue 32).

pycrdt and y-py read some updates Yjs 13.6 (the browser clients' engine)
throws on; the fuzz found them (docs/architecture.md, "Validation on pycrdt
alone"). An empty delete range, which y-py writes when it deletes text, is
stored without it; a struct of length 0 or a type ref past 6, which no
encoder writes, is refused. Each case goes through a real server and Redis,
and what is stored is applied by Yjs in Node (web/node_modules/yjs) and by
pycrdt.
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest

from engines import needs_ypy
from wsraw import RawPeer
from yrelay.yjs import crdt, lib0, update_format
from yrelay.yjs.update_format import read_layout, stored_form

YJS = Path(__file__).resolve().parent.parent / "web" / "node_modules" / "yjs" / "dist" / "yjs.mjs"

#: Applies each list of hex updates, in order, to one fresh Yjs document:
#: per list, the text of "text" or the message Yjs threw.
_APPLY = """
const Y = await import(process.argv[1])
const lists = JSON.parse((await import('node:fs')).readFileSync(0, 'utf8'))
const results = lists.map(list => {
  const doc = new Y.Doc()
  try {
    for (const hex of list) Y.applyUpdate(doc, new Uint8Array(Buffer.from(hex, 'hex')))
    return { text: doc.getText('text').toString() }
  } catch (error) {
    return { threw: String(error.message) }
  }
})
console.log(JSON.stringify(results))
"""


def yjs_apply(*lists: list[bytes]) -> list[dict[str, str]]:
    """What Yjs makes of each list of updates (applied in order to one document)."""
    payload = json.dumps([[update.hex() for update in updates] for updates in lists])
    done = subprocess.run(
        ["node", "--input-type=module", "-e", _APPLY, YJS.as_uri()],
        input=payload,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)


def pycrdt_text(updates: list[bytes]) -> str:
    doc = crdt.new_doc()
    crdt.apply_updates(doc, updates)
    return crdt.text_of(doc)


async def stored(redis_client, doc: str) -> list[bytes]:
    return [fields[b"u"] for _, fields in await redis_client.xrange(f"yrelay:{{{doc}}}:stream")]


def typed(client_id: int, chunks: list[tuple[int, str]]) -> list[bytes]:
    """The updates of a pycrdt document typing ``chunks`` (index, text)."""
    doc = crdt.new_doc(client_id)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    for index, chunk in chunks:
        crdt.insert_text(doc, index, chunk)
    return updates


def delete_set(*entries: tuple[int, list[tuple[int, int]]]) -> bytes:
    """A delete set's bytes, ``(client, [(clock, length), ...])`` as given (empty ranges too)."""
    return update_format._delete_set(entries)


def with_delete_set(update: bytes, deletes: bytes) -> bytes:
    return update[: read_layout(update).delete_start] + deletes


def update_of(*structs: bytes) -> bytes:
    """One section of ``structs`` by client 1 from clock 0, no deletes."""
    out = bytearray()
    for value in (1, len(structs), 1, 0):
        lib0.write_varuint(out, value)
    return bytes(out) + b"".join(structs) + b"\x00"


def in_root(kind: int, content: bytes) -> bytes:
    """An item of content ``kind`` whose parent is the root type "text"."""
    out = bytearray([kind, 1])
    lib0.write_varstring(out, "text")
    return bytes(out) + content


def after_a(kind: int, content: bytes) -> bytes:
    """An item of content ``kind`` after client 1's clock 0 (:data:`A`)."""
    return bytes([0x80 | kind, 1, 0]) + content


A = in_root(4, b"\x01a")  # the string "a"
#: What pycrdt reads, Yjs 13.6 cannot decode (it throws), and no encoder
#: writes: refused.
REFUSED = {
    "type ref 9 (a sub-document in yrs)": update_of(in_root(7, b"\x09")),
    "type ref 15 (undefined in yrs)": update_of(in_root(7, b"\x0f")),
    "a sub-document whose options are null": update_of(in_root(9, b"\x01g\x7e")),
    "a sub-document whose options are undefined": update_of(in_root(9, b"\x01g\x7f")),
}
#: What pycrdt reads, Yjs throws on, and carries nothing: stored without
#: its structs of length 0 (y-py and pycrdt write empty strings in a
#: document's state after an edit inside a surrogate pair).
EMPTY = {
    "an empty string after a": (update_of(A, after_a(4, b"\x00")), update_of(A)),
    "an empty array after a": (update_of(A, after_a(8, b"\x00")), update_of(A)),
    "an empty string between a and b": (
        update_of(A, after_a(4, b"\x00"), after_a(4, b"\x01b")),
        update_of(A, after_a(4, b"\x01b")),
    ),
    "an empty deleted run": (update_of(in_root(1, b"\x00")), crdt.EMPTY_UPDATE),
}


def test_what_is_refused_or_left_out_reads_in_pycrdt_and_not_in_yjs():
    """The refusals are about Yjs: each case reads in pycrdt and the
    lenient layout read, throws in Yjs, and (refused) fails the strict read."""
    updates = [*REFUSED.values(), *(sent for sent, _ in EMPTY.values())]
    for update, result in zip(updates, yjs_apply(*([update] for update in updates)), strict=True):
        assert "threw" in result, (update.hex(), result)
        crdt.pycrdt_doc.validate_update(update)  # raises if pycrdt did not read it
        read_layout(update)
    for update in REFUSED.values():
        with pytest.raises(ValueError, match="Yjs cannot apply it"):
            read_layout(update, strict=True)


def test_the_strict_read_refuses_every_string_yjs_cannot_decode():
    """lib0's TextDecoder is fatal and Yjs parses JSON content with
    ``JSON.parse``: pycrdt refuses these too, the strict read on its own."""

    def text(data: bytes) -> bytes:
        out = bytearray()
        lib0.write_varuint8array(out, data)
        return bytes(out)

    cases = [
        update_of(bytes([4, 1]) + text(b"\xff") + text(b"a")),  # a root type's name
        update_of(in_root(4, text(b"\xed\xa0\x80"))),  # an encoded lone surrogate
        update_of(in_root(8, b"\x01\x77" + text(b"\xff"))),  # a string in an Any value
        update_of(in_root(8, b"\x01\x76\x01" + text(b"\xff") + b"\x7e")),  # a key in an Any object
        update_of(in_root(7, b"\x05" + text(b"\xff"))),  # an XML hook's name
        update_of(in_root(2, b"\x01" + text(b"{"))),  # ContentJSON
        update_of(in_root(2, b"\x01" + text(b"NaN"))),  # Python's json reads it, JSON.parse does not
        update_of(in_root(5, text(b"1 x"))),  # an embed
        update_of(A, after_a(6, text(b"bold") + text(b"tru"))),  # a format's value
    ]
    for update in cases:
        read_layout(update)
        with pytest.raises(ValueError, match="not (UTF-8|JSON)"):
            read_layout(update, strict=True)
    assert [result.get("threw", "") != "" for result in yjs_apply(*([update] for update in cases))] == [True] * 9
    read_layout(update_of(in_root(2, b"\x02" + text(b"undefined") + text(b'{"a":[1]}'))), strict=True)


def test_the_strict_read_of_json_content_agrees_with_json_parse():
    """The strict read checks each ContentJSON item and embed with one
    shared scanner (not a decoder built per item, which made a 64 KiB
    update of tiny items hold the event loop 150 ms): it still takes what
    ``JSON.parse`` takes, whitespace around the value included, and
    nothing else."""

    def text(data: str) -> bytes:
        out = bytearray()
        lib0.write_varuint8array(out, data.encode())
        return bytes(out)

    takes = [" [1, 2]\n", "\t0", '{"a":"\\ud800"}', "1e999", "-0", '"x"', "true"]
    refuses = ["", " ", "1 2", "[1]x", "01", "Infinity", "-Infinity", "[NaN]", '"a\x01"', "\u00a00", "[1,]"]
    updates = [update_of(in_root(2, b"\x01" + text(item))) for item in takes + refuses]
    updates += [update_of(in_root(5, text(item))) for item in takes + refuses]  # an embed
    strict = []
    for update in updates:
        try:
            read_layout(update, strict=True)
            strict.append(True)
        except ValueError:
            strict.append(False)
    expected = ([True] * len(takes) + [False] * len(refuses)) * 2
    assert strict == expected
    yjs = [result.get("threw", "") == "" for result in yjs_apply(*([update] for update in updates))]
    assert yjs == expected


@pytest.mark.parametrize("name", list(REFUSED))
async def test_an_update_yjs_cannot_decode_is_refused_with_a_clear_error(server_url, redis_client, name):
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "r"})
    await peer.expect("subscribed")
    answer = await peer.update("r", 2, REFUSED[name])
    assert (answer["op"], answer["code"], answer["doc"], answer["clock"]) == ("error", "invalid_update", "r", 2)
    assert "Yjs cannot apply it" in answer["message"] and "Traceback" not in answer["message"], answer
    assert await redis_client.xlen("yrelay:{r}:stream") == 0
    assert (await peer.update("r", 3, typed(9, [(0, "ok")])[0]))["op"] == "appended"  # the connection goes on


async def test_structs_of_length_0_are_stored_without_them(server_url, redis_client):
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "z"})
    await peer.expect("subscribed")
    for clock, (sent, _) in enumerate(EMPTY.values(), 1):
        assert (await peer.update("z", clock, sent))["op"] == "appended"
    entries = await stored(redis_client, "z")
    assert entries == [kept for _, kept in EMPTY.values()]
    texts = ["a", "a", "ab", ""]
    assert yjs_apply(*([entry] for entry in entries)) == [{"text": text} for text in texts]
    assert [pycrdt_text([entry]) for entry in entries] == texts
    assert [pycrdt_text([sent]) for sent, _ in EMPTY.values()] == texts  # the same document


async def test_empty_delete_ranges_are_stored_without_them(server_url, redis_client):
    """y-py's shape (deleting the x of "xü" it wrote (0, 1) and an empty (2, 0)):
    Yjs holding the whole document throws on the client's bytes; it applies
    what the server stored, as does pycrdt. A delete set of empty ranges
    only (for a client nobody holds) is stored as an empty update."""
    x, u = typed(7, [(0, "x"), (1, "ü")])
    sent = bytes.fromhex("00") + delete_set((7, [(0, 1), (2, 0)]))
    alone = bytes.fromhex("00") + delete_set((0, [(4, 0)]), (5, []))
    assert yjs_apply([x, u, sent], [alone]) == [{"threw": "Unexpected case"}] * 2
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "d"})
    await peer.expect("subscribed")
    for clock, update in enumerate([x, u, sent, alone], 1):
        assert (await peer.update("d", clock, update))["op"] == "appended"
    entries = await stored(redis_client, "d")
    assert entries == [x, u, bytes.fromhex("00") + delete_set((7, [(0, 1)])), crdt.EMPTY_UPDATE]
    assert yjs_apply(entries, entries[3:]) == [{"text": "ü"}, {"text": ""}]
    assert pycrdt_text(entries) == "ü"


async def test_a_large_update_read_in_a_thread_is_stored_without_empty_ranges(server_url, redis_client):
    """Past 64 KiB the write path reads the update in a thread: the same rule."""
    [update] = typed(7, [(0, "y" * 70_000)])
    sent = with_delete_set(update, delete_set((7, [(3, 0), (5, 2)]), (8, [(0, 0)])))
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "big"})
    await peer.expect("subscribed")
    await peer.send({"op": "update", "doc": "big", "clock": 1, "update": base64.b64encode(sent).decode()})
    assert (await peer.expect("appended"))["clock"] == 1
    [entry] = await stored(redis_client, "big")
    assert entry == with_delete_set(update, delete_set((7, [(5, 2)])))
    assert yjs_apply([entry]) == [{"text": "y" * 69_998}]
    assert pycrdt_text([entry]) == "y" * 69_998


def test_the_stored_form_keeps_what_else_the_update_says():
    """Structs byte for byte, every non-empty range in its order; the same
    object back when there is nothing to leave out (the common case)."""
    [update] = typed(3, [(0, "abc")])
    for deletes in [delete_set(), delete_set((3, [(1, 1)])), delete_set((3, [(2, 1), (0, 1)]), (3, [(1, 1)]))]:
        whole = with_delete_set(update, deletes)
        assert stored_form(whole, read_layout(whole)) is whole
    messy = with_delete_set(update, delete_set((3, [(2, 1), (1, 0), (0, 1)]), (4, [(0, 0)]), (3, [])))
    layout = read_layout(messy)
    clean = stored_form(messy, layout)
    assert clean == with_delete_set(update, delete_set((3, [(2, 1), (0, 1)])))
    assert read_layout(clean).sections == layout.sections and read_layout(clean).deletes == layout.deletes


@needs_ypy
async def test_a_y_py_client_deleting_text_is_stored_so_that_yjs_applies_it(server_url, redis_client, make_client):
    """The y-py engine of the Python client writes an empty delete range
    deleting the x it typed ü before; its edits are all stored (none refused),
    and Yjs and pycrdt apply what was stored, in order, to its text."""
    client = await make_client(server_url, engine="y-py")
    doc = await client.subscribe("ypy")
    written: list[bytes] = []
    crdt.observe_updates(doc.ydoc, written.append)
    crdt.insert_text(doc.ydoc, 0, "x")
    crdt.insert_text(doc.ydoc, 0, "ü")
    crdt.delete_text(doc.ydoc, 1, 1)
    assert stored_form(written[-1], read_layout(written[-1])) is not written[-1]  # y-py's shape
    await client.wait_idle()
    entries = await stored(redis_client, "ypy")
    assert len(entries) == 3 and entries[:2] == written[:2] and entries[2] != written[2]
    assert crdt.text_of(doc.ydoc) == "ü" and client.errors == []
    assert yjs_apply(written) == [{"threw": "Unexpected case"}]  # the client's own bytes
    assert yjs_apply(entries) == [{"text": "ü"}]
    assert pycrdt_text(entries) == "ü"
