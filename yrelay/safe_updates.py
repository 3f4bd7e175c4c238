"""Which small updates are known to be safe without asking a CRDT engine.

Every update must be readable by y-py (the Python client) and pycrdt (the
server's engine) before it is stored, and y-py 0.6.2 can abort its process
on a hostile one, so the engines run in validator processes
(:mod:`yrelay.app.validator`): a pipe round trip per batch (~4 ms of p50
at 500 updates/s, issue 20) and the workers' CPU. Most updates are a few structs typed by a
browser. This module recognises a narrow set of shapes that both engines
were shown to accept (a differential fuzz over millions of generated and
mutated updates, ``python -m yrelay_tools.testing.update_fuzz``; figures
in BENCHMARKS.md#validation); an update of that shape needs no engine.

It never refuses anything: :func:`known_safe` answers True (store it, both
engines read it) or False (undecided: the validator processes check it as
before). The shapes, each rule closing a door the fuzz showed open or
one no live edit needs:

- at most ``MAX_BYTES``, already read by :func:`update_format.read_layout`;
- each client at most once, with at least one struct; every client id
  below 2**32 (y-py panics on some above: 2**32, 2**33, ...) and every
  clock, length and delete range below 2**31 (both engines count in u32);
- only Items (no GC, no Skip: live edits carry neither), with content
  Deleted, String, Binary, Any, Type (refs 0..6) or Format/Embed whose JSON
  is canonical and simple; at least one clock long;
- every string (content, root names, map keys, type names, Any strings)
  strict UTF-8 (no encoded surrogates);
- Any values: undefined, null, booleans, integers within 32 bits, floats,
  strings, and arrays and objects of those, nested at most ``MAX_DEPTH``
  deep;
- no origin, right origin or delete cuts a String of the update that holds
  a surrogate pair (y-py panics cutting inside one);
- a reference to the item's own client names an earlier clock; a reference
  into the update's own structs names an Item, and a parent reference
  names a Type item (else it names content a fresh document lacks, and
  the engines keep the item pending).

The 21-byte update that aborts y-py (docs/security.md#validation) is an
Embed whose text is not UTF-8: not a known shape, so it goes to a worker.
"""

from __future__ import annotations

import json
import re

from . import lib0
from .update_format import Layout

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


__all__ = ["MAX_BYTES", "known_safe"]
