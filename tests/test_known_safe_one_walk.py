"""The known-safe decision, now made by ``read_layout``'s one walk, is
exactly the one of the two walks it replaced (``safe_updates.known_safe``,
a strict re-read of the layout, kept here verbatim as the oracle) on many
generated updates: the fuzz's synthesised and mutated ones, real edits of
y-py and pycrdt documents (deletes, embeds, formats, XML, sub-documents,
unicode), and every one-byte change of updates editors send. A shape the
old check refused must still go to the validator; one it accepted must
still skip it."""

from __future__ import annotations

import functools
import itertools
import json
import random
import re
from collections.abc import Callable

import pycrdt

from yrelay.yjs import crdt, lib0
from yrelay.yjs.admission import read_for_storing
from yrelay.yjs.update_format import Layout, MalformedUpdate, read_layout
from yrelay_tools.testing import update_fuzz

# ---------------------------------------------------------------- the oracle
# yrelay/safe_updates.py as of ca9f426 (issue 34 folded it into read_layout).

#: Larger updates go to the validator processes (their batches amortise the
#: round trip, and the fuzz covered updates up to this size).
MAX_BYTES = 4096
#: Nesting of Any values, arrays and objects included.
MAX_DEPTH = 8

_MAX_CLOCK = 2**31 - 1
#: Client ids are 32-bit, as Yjs writes them: y-py panics on an item whose
#: parent is named by id when the item's or the parent's client is 2**32,
#: 2**33, 3 * 2**32, ... (found by the fuzz; pycrdt's own ids take 53 bits).
_MAX_CLIENT = 2**32 - 1
_MAX_INT = 2**31 - 1
_BIT6, _BIT7, _BIT8, _BITS5 = 32, 64, 128, 31
_GC, _SKIP = 0, 10
_DELETED, _BINARY, _STRING, _EMBED, _FORMAT, _TYPE, _ANY = 1, 3, 4, 5, 6, 7, 8
#: Array, Map, Text, XmlElement, XmlFragment, XmlText (not XmlHook: pycrdt
#: reads its name differently from y-py and refused every one the fuzz made).
_TYPE_REFS = {0, 1, 2, 3, 4, 6}
_TYPE_NEEDS_KEY = {3}  # YXmlElement carries a node name
#: JSON text with no escapes and no control characters (parsers differ on
#: escapes and lone surrogates; floats and huge integers are refused after parsing).
_PLAIN_JSON = re.compile(r"[^\\\x00-\x1f]*")


class _NotKnown(Exception):
    """The update is outside the known shapes (not necessarily invalid)."""


def known_safe(update: bytes, layout: Layout) -> bool:
    """True when ``update`` (whose layout ``read_layout`` already read) has a
    shape both engines are known to read; False means "ask the engines"."""
    if len(update) > MAX_BYTES:
        return False
    try:
        _check(update, layout)
    except (_NotKnown, ValueError, RecursionError):  # lib0.DecodeError is a ValueError
        return False
    return True


def _check(update: bytes, layout: Layout) -> None:
    """Read ``update`` again from the start, strictly (the layout read is
    lenient: non-minimal numbers, any string bytes, any type ref)."""
    inserted: dict[int, list[tuple[int, int, int]]] = {}  # client -> (start, end, struct start byte)
    for section in layout.sections:
        if not section.structs or section.client in inserted or section.client > _MAX_CLIENT:
            raise _NotKnown
        inserted[section.client] = [(s.clock, s.clock + s.length, s.start) for s in section.structs]
    splits: list[tuple[int, int]] = []  # (client, clock) where an engine may cut a struct
    astral: list[tuple[int, int, int]] = []  # strings with surrogate pairs: (client, start, end)
    reader = lib0.Reader(update)
    _number(reader)  # the section count
    for section in layout.sections:
        _number(reader), _number(reader), _number(reader)  # struct count, client, first clock
        for struct in section.structs:
            if struct.skip or not 1 <= struct.length <= struct.clock + struct.length <= _MAX_CLOCK:
                raise _NotKnown
            characters = _check_item(reader, section.client, struct.clock, inserted, splits)
            if characters is not None and characters != struct.length:
                astral.append((section.client, struct.clock, struct.clock + struct.length))
            if reader.pos != struct.end:  # the two reads disagree: never expected
                raise _NotKnown
    for _ in range(_number(reader)):  # the delete set
        client = _number(reader)
        if client > _MAX_CLIENT:
            raise _NotKnown
        for _ in range(_number(reader)):
            start = _number(reader)
            end = start + _number(reader)
            if end > _MAX_CLOCK:
                raise _NotKnown
            splits += ((client, start), (client, end))
    # y-py panics cutting a string inside a surrogate pair (an origin or a
    # delete naming half an emoji of the same update: found by the fuzz)
    for client, start, end in astral:
        if any(cut_client == client and start < cut < end for cut_client, cut in splits):
            raise _NotKnown


def _number(reader: lib0.Reader) -> int:
    """A varuint, written in as few bytes as it needs (as every encoder does)."""
    start = reader.pos
    value = reader.varuint()
    if reader.pos - start > 1 and reader.data[reader.pos - 1] == 0:
        raise _NotKnown
    return value


def _check_item(
    reader: lib0.Reader,
    client: int,
    clock: int,
    inserted: dict[int, list[tuple[int, int, int]]],
    splits: list[tuple[int, int]],
) -> int | None:
    """Read one Item strictly; its content's characters if it is a String."""
    info = reader.uint8()
    kind = info & _BITS5
    if kind == _GC:
        raise _NotKnown
    if info & _BIT8:  # origin: the item goes after that clock
        ref_client, ref_clock = _check_ref(reader, client, clock, inserted, parent=False)
        splits.append((ref_client, ref_clock + 1))
    if info & _BIT7:  # right origin: before that clock
        splits.append(_check_ref(reader, client, clock, inserted, parent=False))
    if not info & (_BIT7 | _BIT8):
        named = _number(reader)  # 1: a root type's name follows, 0: the parent item's id
        if named == 1:
            _strict_string(reader)
        elif named == 0:
            _check_ref(reader, client, clock, inserted, parent=True)
        else:  # lib0 reads any other value as "an id", the engines as a u32 (2**32 + 1 is a name)
            raise _NotKnown
        if info & _BIT6:
            _strict_string(reader)  # parentSub: the map key
    return _check_content(reader, kind)


def _check_ref(
    reader: lib0.Reader, client: int, clock: int, inserted: dict[int, list[tuple[int, int, int]]], parent: bool
) -> tuple[int, int]:
    ref_client, ref_clock = _number(reader), _number(reader)
    if ref_clock > _MAX_CLOCK or (ref_client == client and ref_clock >= clock):
        raise _NotKnown
    if ref_client > _MAX_CLIENT:
        raise _NotKnown
    for lo, hi, byte in inserted.get(ref_client, ()):
        if lo <= ref_clock < hi:
            target = reader.data[byte]
            if target & _BITS5 in (_GC, _SKIP) or (parent and (target & _BITS5 != _TYPE or ref_clock != lo)):
                raise _NotKnown
            break
    return ref_client, ref_clock


def _check_content(reader: lib0.Reader, kind: int) -> int | None:
    """Read an Item's content strictly; a String's number of characters."""
    if kind == _DELETED:
        if not 1 <= _number(reader) <= _MAX_CLOCK:
            raise _NotKnown
    elif kind == _STRING:
        text = _strict_string(reader)
        if not text:
            raise _NotKnown
        return len(text)
    elif kind == _BINARY:
        reader.uint8array(_number(reader))
    elif kind == _ANY:
        count = _number(reader)
        if count < 1:
            raise _NotKnown
        for _ in range(count):
            _check_any(reader, 0)
    elif kind == _TYPE:
        ref = _number(reader)
        if ref not in _TYPE_REFS:
            raise _NotKnown
        if ref in _TYPE_NEEDS_KEY:
            _strict_string(reader)
    elif kind == _EMBED:
        _check_json(_strict_string(reader))
    elif kind == _FORMAT:
        _strict_string(reader)
        _check_json(_strict_string(reader))
    else:  # JSON (legacy), Doc: not seen in live edits
        raise _NotKnown
    return None


def _strict_string(reader: lib0.Reader) -> str:
    try:
        return reader.uint8array(_number(reader)).decode("utf-8")  # strict: no encoded surrogates
    except UnicodeDecodeError:
        raise _NotKnown from None


def _check_any(reader: lib0.Reader, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise _NotKnown
    kind = reader.uint8()
    if kind in (127, 126, 121, 120):  # undefined, null, false, true
        return
    if kind == 125:  # integer
        start = reader.pos
        value = reader.varint()
        if abs(value) > _MAX_INT or reader.data[reader.pos - 1] == (0 if reader.pos - start > 1 else 0x40):
            raise _NotKnown  # too large, not minimal, or -0
    elif kind == 124:  # float32
        reader.uint8array(4)
    elif kind == 123:  # float64
        reader.uint8array(8)
    elif kind == 119:  # string
        _strict_string(reader)
    elif kind == 118:  # object
        for _ in range(_number(reader)):
            _strict_string(reader)
            _check_any(reader, depth + 1)
    elif kind == 117:  # array
        for _ in range(_number(reader)):
            _check_any(reader, depth + 1)
    else:  # bigint, binary: rare, left to the engines
        raise _NotKnown


def _check_json(text: str) -> None:
    """Format and Embed values: JSON both engines' parsers read alike."""
    if len(text) > 1024 or not _PLAIN_JSON.fullmatch(text):
        raise _NotKnown
    try:
        value = json.loads(text)
    except ValueError:
        raise _NotKnown from None
    if json.dumps(value, separators=(",", ":"), ensure_ascii=False) != text or not _plain(value, 0):
        raise _NotKnown


def _plain(value: object, depth: int) -> bool:
    if depth > MAX_DEPTH:
        return False
    if value is None or isinstance(value, (bool, str)):
        return True
    if isinstance(value, int):
        return abs(value) <= _MAX_INT
    if isinstance(value, list):
        return all(_plain(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(_plain(item, depth + 1) for item in value.values())
    return False


# ---------------------------------------------------------------- the comparison


def _compare(update: bytes, counts: dict[str, int]) -> None:
    """Both decisions agree on ``update`` read leniently, read strictly, and
    in its stored form (what the write path hands the validator)."""
    try:
        layout = read_layout(update, decide=True)
    except MalformedUpdate:
        counts["refused"] += 1
        return
    assert layout.known_safe == known_safe(update, layout), update.hex()
    counts[str(layout.known_safe)] += 1
    try:
        strict = read_layout(update, strict=True, decide=True)
    except MalformedUpdate:
        return
    assert strict.known_safe == layout.known_safe, update.hex()
    assert not read_layout(update).known_safe  # decided only when asked
    try:
        reading = read_for_storing(update)
    except MalformedUpdate:
        return
    assert reading.layout.known_safe == known_safe(reading.update, reading.layout), update.hex()


def _edits(seed: int) -> list[bytes]:
    """Updates of edits the fuzz's real ones lack: sub-documents, unicode
    keys and names, deletes across emoji, formats and embeds, by pycrdt and y-py."""
    rng = random.Random(seed)
    found: list[bytes] = []
    doc = pycrdt.Doc(client_id=rng.randrange(2**32))
    doc.observe(lambda event: found.append(event.update))
    text = doc.get("tëxt😀", type=pycrdt.Text)
    docs = doc.get("docs", type=pycrdt.Map)
    for index in range(300):
        _tolerating_panics(functools.partial(_pycrdt_edit, rng, index, text, docs))
    for depth in range(5, 12):  # Any values nested about as deep as a known shape may be
        nested: object = [1]
        for level in range(depth):
            nested = [nested] if level % 2 else {"k": nested}
        docs["deep"] = nested
    ypy: list[bytes] = []
    ydoc = crdt.new_doc(rng.randrange(2**32))
    crdt.observe_updates(ydoc, ypy.append)
    for _ in range(200):
        _tolerating_panics(lambda: _ypy_edit(rng, ydoc))
    return found + ypy + [doc.get_update(), crdt.encode_state(ydoc)]


def _pycrdt_edit(rng: random.Random, index: int, text: pycrdt.Text, docs: pycrdt.Map) -> None:
    roll = rng.random()
    if roll < 0.4:
        text.insert(
            rng.randrange(len(text) + 1),
            rng.choice(["a", "é", "😀", "👍🏽x", "\u2028", "漢字"]),
            attrs=rng.choice([None, {"bold": True}, {"ü": "ß"}]),
        )
    elif roll < 0.55 and len(text):
        start = rng.randrange(len(text))
        del text[start : min(len(text), start + rng.randrange(1, 4))]
    elif roll < 0.65 and len(text):
        start = rng.randrange(len(text))
        text.format(start, min(len(text), start + 3), {"color": rng.choice(["#f00", None, 7])})
    elif roll < 0.75:
        text.insert_embed(rng.randrange(len(text) + 1), rng.choice([{"img": "😀.png"}, {"n": [1, 2.5]}]))
    elif roll < 0.85:
        docs[f"d{index % 4}"] = pycrdt.Doc()  # a sub-document
    else:
        docs[rng.choice(["ключ", "k", "😀"])] = rng.choice(["v", 2**40, -1, [None, True], {"a": "b"}])


def _ypy_edit(rng: random.Random, ydoc: object) -> None:
    length = len(crdt.text_of(ydoc))
    if length and rng.random() < 0.4:
        crdt.delete_text(ydoc, rng.randrange(length), rng.randrange(1, 3))
    else:
        crdt.insert_text(ydoc, rng.randrange(length + 1), rng.choice(["x", "ñ", "😀", "ab"]))


def _tolerating_panics(edit: Callable[[], None]) -> None:
    """y-py and yrs panic on some offsets inside an emoji or next to an
    embed (a PanicException): that edit is left out."""
    try:
        edit()
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise


def test_one_walk_decides_as_the_two_walks_did_on_generated_updates():
    counts = {"refused": 0, "True": 0, "False": 0}
    for update in itertools.islice(update_fuzz.candidates(seed=34), 30_000):
        _compare(update, counts)
    for update in _edits(seed=34):
        _compare(update, counts)
    # every kind of answer is reached, often (the comparison means something)
    assert counts["True"] > 2_000 and counts["False"] > 2_000 and counts["refused"] > 1_000, counts


def test_one_walk_decides_as_the_two_walks_did_on_every_byte_changed():
    """Each byte of updates editors send, set to values that break a rule
    (a padded number, a high client id, invalid UTF-8, another content or
    Any kind): the decisions near the known shapes' edges."""
    counts = {"refused": 0, "True": 0, "False": 0}
    updates = [bytes.fromhex(text) for text in update_fuzz.YJS_UPDATES] + _edits(seed=7)[:60]
    for update in updates:
        for position, value in itertools.product(range(len(update)), (0, 1, 0x40, 0x7F, 0x80, 0xC3, 0xF0, 0xFF)):
            changed = bytearray(update)
            changed[position] = value
            _compare(bytes(changed), counts)
            _compare(update[:position] + bytes([value]) + update[position:], counts)
    assert counts["True"] > 500 and counts["False"] > 500, counts


def test_the_cuts_of_an_origin_and_a_right_origin_are_told_apart():
    """An item after (origin) and before (right origin) clocks of its own
    update's "😀😀": the origin cuts after its clock, the right origin at it."""
    counts = {"refused": 0, "True": 0, "False": 0}
    emoji = "😀😀".encode()
    for origin, right in itertools.product(range(4), range(4)):
        out = bytearray()
        for value in (1, 2, 5, 0):  # one section: two structs of client 5 from clock 0
            lib0.write_varuint(out, value)
        out += b"\x04\x01\x01t"  # a String in the root type "t"
        lib0.write_varuint8array(out, emoji)
        out.append(0x84 | 0x40)  # a String with an origin and a right origin
        for value in (5, origin, 5, right):
            lib0.write_varuint(out, value)
        lib0.write_varuint8array(out, b"x")
        _compare(bytes(out) + b"\x00", counts)
    assert counts["True"] and counts["False"], counts
