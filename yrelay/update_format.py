"""Reading what a Yjs (v1) update covers, without integrating it.

y-py 0.6.2 silently drops updates whose dependencies are missing: they stay
"pending", never show in the state vector, and ``encode_state`` leaves them
out. Folding the stream into a snapshot through y-py alone would therefore
lose such an update without a trace. This module decodes the update's binary
layout (lib0 encoding, as written by Yjs' ``UpdateEncoderV1``) far enough to
know which ``(client, clock)`` ranges it inserts and which ranges it deletes,
so a fold can check that every entry really landed in the snapshot.

The layout, per the Yjs source (``encoding.js``, ``UpdateDecoderV1``):

* structs: ``n`` client sections, each ``count, client, clock`` then ``count``
  structs; a struct is ``info`` (one byte) and, by ``info & 31``: 0 GC
  (length), 10 Skip (length, covers nothing), else an Item whose origins,
  parent and content follow and whose length is its content's length;
* the delete set: ``n`` clients, each ``client, count`` then ``clock, length``.
"""

from __future__ import annotations

import bisect
import heapq
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from . import lib0

Ranges = dict[int, list[tuple[int, int]]]  # client -> [start, end) clock ranges

_BIT6, _BIT7, _BIT8, _BITS5 = 32, 64, 128, 31
_GC, _SKIP = 0, 10
_TYPE_NEEDS_KEY = {3, 5}  # YXmlElement, YXmlHook carry a node name
#: Type refs Yjs 13 reads: YArray .. YXmlText (0-6). pycrdt reads 9 and 15
#: too (yrs's sub-document and "undefined" branches); Yjs throws on them.
YJS_TYPE_REFS = 7
_NO_END = float("inf")


class MalformedUpdate(ValueError):
    """The bytes do not follow the Yjs v1 update layout."""


def _reader(data: bytes) -> lib0.Reader:
    return lib0.Reader(data, MalformedUpdate)


def _string(reader: lib0.Reader, strict: bool = False) -> str:
    """A ContentString's text; lone surrogates pass (their UTF-16 length
    counts), unless ``strict``."""
    if strict:
        return _text(reader, True, "a string")
    try:
        return reader.varuint8array().decode("utf-8", errors="surrogatepass")
    except UnicodeDecodeError:
        raise MalformedUpdate("string is not UTF-8") from None


_YJS = "Yjs cannot apply it"


def _text(reader: lib0.Reader, strict: bool, what: str) -> str:
    """A string Yjs decodes (lib0's TextDecoder is fatal: invalid UTF-8,
    encoded surrogates included, throws); '' unless ``strict``, where it is
    only skipped."""
    data = reader.varuint8array()
    if not strict:
        return ""
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise MalformedUpdate(f"{what} is not UTF-8: {_YJS}") from None


def _json(reader: lib0.Reader, strict: bool, what: str, undefined: bool = False) -> None:
    """JSON text Yjs parses (``JSON.parse``: no NaN, no Infinity, unlike
    Python's); ``undefined``: the word itself passes (ContentJSON's)."""
    text = _text(reader, strict, what)
    if not strict or (undefined and text == "undefined"):
        return
    if not _is_json(text):
        raise MalformedUpdate(f"{what} is not JSON: {_YJS}")


def _not_json(word: str) -> None:
    raise ValueError(word)


#: One scanner for every JSON text (``json.loads`` with ``parse_constant``
#: builds a decoder per call: 4 us, 10 times the lenient read of a
#: ContentJSON item, so a 64 KiB update of tiny items held the event loop
#: 150 ms and a 16 MiB one a thread 39 s).
#: (An attribute each decoder sets in ``__init__``, which typeshed does not declare.)
_SCAN: Callable[[str, int], tuple[object, int]] = vars(json.JSONDecoder(parse_constant=_not_json))["scan_once"]
#: What ``JSON.parse`` skips around a value.
_JSON_SPACE = re.compile(r"[ \t\n\r]*")


def _is_json(text: str) -> bool:
    """Whether ``JSON.parse(text)`` returns (one value, JSON's whitespace
    around it), without Python's NaN and Infinity."""
    try:
        _, end = _SCAN(text, _past_space(text, 0))
    except (StopIteration, ValueError, RecursionError):
        return False
    return end == len(text) or _past_space(text, end) == len(text)


def _past_space(text: str, start: int) -> int:
    """Where JSON's whitespace from ``start`` on ends."""
    space = _JSON_SPACE.match(text, start)
    assert space is not None  # the pattern matches the empty string
    return space.end()


def _utf16_length(text: str) -> int:
    """Yjs counts string clocks in UTF-16 code units, as JavaScript does."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le", errors="surrogatepass")) // 2


def _content_length(reader: lib0.Reader, ref: int, strict: bool = False) -> int:
    """Consume an Item's content and return how many clocks it spans
    (``strict``: what Yjs cannot read is refused, see :func:`read_layout`)."""
    if ref == 1:  # ContentDeleted
        return reader.varuint()
    if ref == 2:  # ContentJSON: strings
        count = reader.varuint()
        for _ in range(count):
            _json(reader, strict, "a JSON item", undefined=True)
        return count
    if ref == 3:  # ContentBinary
        reader.varuint8array()
        return 1
    if ref == 4:  # ContentString
        return _utf16_length(_string(reader, strict))
    if ref == 5:  # ContentEmbed: JSON text
        _json(reader, strict, "an embed")
        return 1
    if ref == 6:  # ContentFormat: key, JSON text
        _text(reader, strict, "a format's key")
        _json(reader, strict, "a format's value")
        return 1
    if ref == 7:  # ContentType
        type_ref = reader.varuint()
        if strict and type_ref >= YJS_TYPE_REFS:
            raise MalformedUpdate(f"type ref {type_ref} is not one of Yjs's (0-6): {_YJS}")
        if type_ref in _TYPE_NEEDS_KEY:
            _text(reader, strict, "a node name")
        return 1
    if ref == 8:  # ContentAny
        count = reader.varuint()
        for _ in range(count):
            reader.skip_any(strict=strict)
        return count
    if ref == 9:  # ContentDoc: guid, options
        _text(reader, strict, "a sub-document's guid")
        if strict and reader.data[reader.pos : reader.pos + 1] in (b"\x7f", b"\x7e"):
            raise MalformedUpdate(f"a sub-document's options are undefined or null: {_YJS}")
        reader.skip_any(strict=strict)
        return 1
    raise MalformedUpdate(f"unknown content type {ref}")


def _struct_length(
    reader: lib0.Reader, info: int, refs: list[tuple[int, int]] | None = None, strict: bool = False
) -> int:
    """Consume one Item (after its info byte) and return its length; the ids
    it refers to (origin, right origin, parent) go to ``refs`` when given."""
    if info & _BIT8:
        _ref(reader, refs)  # origin id
    if info & _BIT7:
        _ref(reader, refs)  # right origin id
    if not info & (_BIT7 | _BIT8):  # the parent cannot be copied from an origin
        if reader.varuint() == 1:
            _text(reader, strict, "a root type's name")
        else:
            _ref(reader, refs)  # the parent item's id
        if info & _BIT6:
            _text(reader, strict, "a map key")  # parentSub
    return _content_length(reader, info & _BITS5, strict)


def _ref(reader: lib0.Reader, refs: list[tuple[int, int]] | None) -> None:
    client, clock = reader.varuint(), reader.varuint()
    if refs is not None:
        refs.append((client, clock))


@dataclass
class Coverage:
    """What one update holds: inserted struct ranges and deleted ranges."""

    structs: Ranges = field(default_factory=dict)
    deletes: Ranges = field(default_factory=dict)


def _read_structs(reader: lib0.Reader) -> Ranges:
    structs: Ranges = {}
    for _ in range(reader.varuint()):
        count, client, clock = reader.varuint(), reader.varuint(), reader.varuint()
        ranges = structs.setdefault(client, [])
        for _ in range(count):
            info = reader.uint8()
            ref = info & _BITS5
            length = reader.varuint() if ref in (_GC, _SKIP) else _struct_length(reader, info)
            if ref != _SKIP and length:
                ranges.append((clock, clock + length))
            clock += length
    return {client: merge_ranges(ranges) for client, ranges in structs.items() if ranges}


def _read_deletes(reader: lib0.Reader) -> Ranges:
    deletes: Ranges = {}
    for _ in range(reader.varuint()):
        client, count = reader.varuint(), reader.varuint()
        ranges = deletes.setdefault(client, [])
        for _ in range(count):
            clock, length = reader.varuint(), reader.varuint()
            if length:  # y-py writes empty deletes; they cover nothing
                ranges.append((clock, clock + length))
    return {client: merge_ranges(ranges) for client, ranges in deletes.items() if ranges}


def decode(update: bytes) -> Coverage:
    """The ranges ``update`` inserts and deletes; raises :class:`MalformedUpdate`."""
    reader = _reader(update)
    coverage = Coverage(_read_structs(reader), _read_deletes(reader))
    if reader.pos != len(update):
        raise MalformedUpdate("trailing bytes after the delete set")
    return coverage


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, overlapping or touching ``[start, end)`` ranges joined."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _within(inner: Ranges, outer: Ranges) -> bool:
    for client, ranges in inner.items():
        available = outer.get(client, [])
        for start, end in ranges:
            # ``available`` is merged and sorted: only the last range starting
            # at or before ``start`` can hold it (a bisection, not a scan).
            index = bisect.bisect_right(available, (start, _NO_END)) - 1
            if index < 0 or available[index][1] < end:
                return False
    return True


def union(coverages: Iterable[Coverage]) -> Coverage:
    """What a set of updates holds together, integrated or not (what a store
    holds, as opposed to :func:`covers` against one document's state)."""
    structs: Ranges = {}
    deletes: Ranges = {}
    for coverage in coverages:
        for target, ranges in ((structs, coverage.structs), (deletes, coverage.deletes)):
            for client, client_ranges in ranges.items():
                target.setdefault(client, []).extend(client_ranges)
    return Coverage({c: merge_ranges(r) for c, r in structs.items()}, {c: merge_ranges(r) for c, r in deletes.items()})


def covers(whole: Coverage, part: Coverage) -> bool:
    """True when everything ``part`` inserts and deletes is in ``whole``.

    ``whole`` is normally the coverage of a document's full state
    (``encode_state``): its structs are every integrated range and its delete
    set every deleted one, so a pending (unintegrated) part shows up as absent.
    A deletion of content past the document's state is held vacuously: that
    content is in nobody's document, so there is nothing to show deleted
    (a snapshot keeps such deletions pending: :func:`pending_deletes`).
    """
    return _within(part.structs, whole.structs) and _within(_clip(part.deletes, state_of(whole)), whole.deletes)


def state_of(whole: Coverage) -> dict[int, int]:
    """A document's state vector from its coverage: per client, the end of
    the struct range that starts at clock 0."""
    return {client: ranges[0][1] for client, ranges in whole.structs.items() if ranges and ranges[0][0] == 0}


def _clip(deletes: Ranges, state: dict[int, int]) -> Ranges:
    """The parts of ``deletes`` below ``state`` (content the document holds)."""
    clipped: Ranges = {}
    for client, ranges in deletes.items():
        limit = state.get(client, 0)
        kept = [(start, min(end, limit)) for start, end in ranges if start < limit]
        if kept:
            clipped[client] = kept
    return clipped


def pending_deletes(state: dict[int, int], parts: Iterable[Coverage]) -> Ranges:
    """Deletions among ``parts`` of content past the document's ``state``
    (its state vector, or :func:`state_of` its coverage): Yjs keeps them
    pending and applies them if the content ever arrives, but an engine's
    encoding of the document drops them; a snapshot must carry them
    (:func:`with_deletes`) or content deleted before it arrived comes back."""
    pending: Ranges = {}
    for part in parts:
        for client, ranges in part.deletes.items():
            limit = state.get(client, 0)
            for start, end in ranges:
                if end > limit:
                    pending.setdefault(client, []).append((max(start, limit), end))
    return {client: merge_ranges(ranges) for client, ranges in pending.items()}


def with_deletes(update: bytes, extra: Ranges) -> bytes:
    """``update`` with ``extra`` added to its delete set."""
    if not extra:
        return update
    reader = _reader(update)
    _read_structs(reader)
    start = reader.pos
    merged = union([Coverage(deletes=_read_deletes(reader)), Coverage(deletes=extra)]).deletes
    return update[:start] + _delete_set(
        [(client, [(lo, hi - lo) for lo, hi in ranges]) for client, ranges in merged.items()]
    )


def _delete_set(entries: Sequence[tuple[int, Sequence[tuple[int, int]]]]) -> bytes:
    """A delete set's bytes: ``(client, [(clock, length), ...])`` entries, in order."""
    out = bytearray()
    lib0.write_varuint(out, len(entries))
    for client, ranges in entries:
        lib0.write_varuint(out, client)
        lib0.write_varuint(out, len(ranges))
        for clock, length in ranges:
            lib0.write_varuint(out, clock)
            lib0.write_varuint(out, length)
    return bytes(out)


def held_prefix(whole: Coverage, updates: Sequence[bytes]) -> int:
    """How many of ``updates``, from the first on, ``whole`` fully holds
    (an update that does not decode is not held). Decodes only up to the
    first one not held; :func:`held_count` for updates decoded already."""
    return held_count(whole, (decode_or_none(update) for update in updates))


def held_count(whole: Coverage, parts: Iterable[Coverage | None]) -> int:
    """How many of ``parts`` (None: an update that did not decode), from the
    first on, ``whole`` fully holds."""
    held = 0
    for part in parts:
        if part is None or not covers(whole, part):
            break
        held += 1
    return held


def decode_or_none(update: bytes) -> Coverage | None:
    """:func:`decode`, None for bytes that are not a v1 update (an empty
    snapshot included): a fold decodes each entry once, for both the
    deletions it must keep pending and the proof that it holds the entry."""
    try:
        return decode(update)
    except MalformedUpdate:
        return None


def decode_state_vector(data: bytes) -> dict[int, int]:
    """A Yjs state vector (``count``, then ``count`` pairs ``client, clock``)
    as a dict; raises :class:`MalformedUpdate` unless it is well formed and
    every number is below 2**53.

    CRDT engines trust these numbers: y-py 0.6.2 sizes an allocation by the
    count of ``/////w8=`` (about 146 GB) and aborts the process. Here the
    count is bounded by the bytes present (a pair takes at least two), each
    varint by eight bytes, and no bytes may trail.
    """
    reader = _reader(data)
    count = reader.varuint()
    if count > (len(data) - reader.pos) // 2:
        raise MalformedUpdate(f"state vector claims {count} clients in {len(data)} bytes")
    clocks: dict[int, int] = {}
    for _ in range(count):
        client = reader.varuint()
        clocks[client] = reader.varuint()
    if reader.pos != len(data):
        raise MalformedUpdate("trailing bytes after the state vector")
    return clocks


def causal_order(updates: Sequence[bytes]) -> list[bytes]:
    """``updates`` reordered so that each client's structs come in clock order.

    y-py 0.6.2 integrates one client's structs only when they start at or
    before what the document already holds of that client, and never retries
    the rest (they stay pending). Applying in this order integrates a batch
    stored in any order in one pass: a heap per client of the updates waiting
    for it, O(n log n) in the number of updates. Updates whose predecessor is
    missing from the batch (or that do not decode) keep their relative order
    at the end. Dependencies on other clients' items (origins) are not read,
    so a caller must still check what landed.
    """
    structs: list[Ranges | None] = []
    for update in updates:
        try:
            structs.append(decode(update).structs)
        except MalformedUpdate:
            structs.append(None)
    state: dict[int, int] = {}
    blocked: dict[int, list[tuple[int, int]]] = {}  # client -> heap of (start clock, index)
    order: list[int] = []
    for first, ranges in enumerate(structs):
        work = [first] if ranges is not None else []
        while work:
            index = work.pop()
            ranges_of = structs[index]
            assert ranges_of is not None  # only updates that decoded are worked on
            waiting_for = next(
                ((client, spans[0][0]) for client, spans in ranges_of.items() if spans[0][0] > state.get(client, 0)),
                None,
            )
            if waiting_for is not None:
                heapq.heappush(blocked.setdefault(waiting_for[0], []), (waiting_for[1], index))
                continue
            order.append(index)
            for client, spans in ranges_of.items():
                state[client] = max(state.get(client, 0), spans[-1][1])
                heap = blocked.get(client, [])
                while heap and heap[0][0] <= state[client]:
                    work.append(heapq.heappop(heap)[1])
    placed = set(order)
    return [updates[index] for index in order] + [u for index, u in enumerate(updates) if index not in placed]


#: Client ids and clocks above this cannot be exact in JavaScript (nor in
#: Redis's Lua, which counts in doubles): no Yjs encoder writes them.
MAX_SAFE_INTEGER = lib0.MAX_SAFE_INTEGER


#: Structs one update may carry (read_layout keeps an object per struct: a
#: hostile 16 MiB of two-byte structs would otherwise cost over a gigabyte).
#: A whole heavily edited document encodes to far fewer: Yjs merges runs.
MAX_STRUCTS = 1_000_000


@dataclass(frozen=True, slots=True)
class Struct:
    """One struct of an update, with where its bytes are (for re-encoding a part)."""

    clock: int
    length: int
    #: A Skip covers nothing: the sender lacks that range (diffs, merges).
    skip: bool
    #: Ids this struct refers to: origin, right origin, parent.
    refs: tuple[tuple[int, int], ...]
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Section:
    """The structs of one Yjs client that an update carries, in clock order."""

    client: int
    structs: tuple[Struct, ...]


@dataclass(frozen=True)
class Layout:
    """An update read struct by struct (what causal admission needs)."""

    sections: tuple[Section, ...]
    #: Byte offset where the delete set starts (it runs to the end).
    delete_start: int
    deletes: Ranges


def read_layout(update: bytes, strict: bool = False) -> Layout:
    """Every struct of ``update`` with its refs and byte span, and its delete
    set; raises :class:`MalformedUpdate` (also for ids past 2**53 - 1).

    ``strict`` (what the server stores from now on: :mod:`yrelay.app.write_path`)
    also refuses what pycrdt and y-py read but Yjs 13.6, the browser
    clients' engine, cannot even decode, and no Yjs encoder writes: a
    client in two sections (Yjs keeps the last one only, so it would not
    hold what the others do), a type ref past 6, a string that is not
    UTF-8 (lib0's decoder is fatal), JSON content ``JSON.parse`` throws
    on, and a sub-document whose options are undefined or null. (What Yjs
    decodes but throws on integrating, and
    which carries nothing, is left out of what is stored instead:
    :func:`stored_form`.) Entries stored before are read leniently (a
    rebuilt state vector must count what the append script counted)."""
    reader = _reader(update)
    sections = []
    seen: set[int] = set()
    total = 0
    for _ in range(reader.varuint()):
        count, client, clock = reader.varuint(), reader.varuint(), reader.varuint()
        if strict:
            if client in seen:
                raise MalformedUpdate(f"client {client} has two sections (Yjs reads only the last): {_YJS}")
            seen.add(client)
        total += count + 1  # an empty section costs an object too
        if total > MAX_STRUCTS:
            raise MalformedUpdate(f"more than {MAX_STRUCTS:,} structs and sections in one update")
        structs = []
        highest = 0  # the largest id value referred to in this section
        for _ in range(count):
            start = reader.pos
            info = reader.uint8()
            ref = info & _BITS5
            if ref == _GC or ref == _SKIP:
                length = reader.varuint()
                structs.append(Struct(clock, length, ref == _SKIP, (), start, reader.pos))
            else:
                refs: list[tuple[int, int]] = []
                length = _struct_length(reader, info, refs, strict)
                for pair in refs:
                    highest = max(highest, *pair)
                structs.append(Struct(clock, length, False, tuple(refs), start, reader.pos))
            clock += length
        _check_safe(client, clock, highest)
        sections.append(Section(client, tuple(structs)))
    delete_start = reader.pos
    deletes = _read_deletes(reader)
    if reader.pos != len(update):
        raise MalformedUpdate("trailing bytes after the delete set")
    _check_safe(*(value for ranges in deletes.values() for pair in ranges for value in pair), *deletes)
    return Layout(tuple(sections), delete_start, deletes)


def _check_safe(*values: int) -> None:
    if values and max(values) > MAX_SAFE_INTEGER:
        raise MalformedUpdate("a client id or clock is past 2**53 - 1")


def encode_part(update: bytes, layout: Layout, kept: dict[int, int]) -> bytes:
    """``update`` with only the first ``kept[i]`` structs of section ``i``
    (sections keeping none are left out) and its whole delete set.

    Each struct's bytes are copied as they are: a kept prefix starts at its
    section's first clock, so no struct needs rewriting."""
    sections = [
        (section.client, section.structs[: kept.get(index, 0)]) for index, section in enumerate(layout.sections)
    ]
    return (
        _sections(update, [(client, structs) for client, structs in sections if structs])
        + update[layout.delete_start :]
    )


def _sections(update: bytes, sections: Sequence[tuple[int, Sequence[Struct]]]) -> bytes:
    """The struct part of an update: ``(client, structs of update)`` sections,
    each struct's bytes copied as they are (V1 encodes each on its own;
    runs of adjacent ones in one slice)."""
    out = bytearray()
    lib0.write_varuint(out, len(sections))
    for client, structs in sections:
        lib0.write_varuint(out, len(structs))
        lib0.write_varuint(out, client)
        lib0.write_varuint(out, structs[0].clock)
        start, end = structs[0].start, structs[0].end
        for struct in structs[1:]:
            if struct.start != end:
                out += update[start:end]
                start = struct.start
            end = struct.end
        out += update[start:end]
    return bytes(out)


def stored_form(update: bytes, layout: Layout) -> bytes:
    """``update`` without what carries nothing and Yjs 13.6 (the browser
    clients' engine) throws on; ``update`` itself when it has none of it
    (no Yjs encoder writes any):

    - structs of length 0 (an empty string, array or deleted run; a GC or
      Skip of 0), and sections left with none: y-py and pycrdt write empty
      strings in a document's state after an edit inside a surrogate pair;
      Yjs's struct store cannot hold one ("Unexpected case", or a read of an
      undefined struct). An id refers to the struct that holds its clock,
      and one of length 0 holds none: every reference reads the same
      without it. Clocks stay as they were (it spans none).
    - empty ranges of the delete set (and clients left with none): y-py
      writes them when it deletes text (``05 00``: clock 5, length 0);
      Yjs throws on one at or past what its document holds of that client
      (its pending delete set cannot encode a length of 0).

    Nothing the sender meant is lost, and every engine applies the result.
    The caller reads the result's layout again when it differs."""
    same_structs = all(
        section.structs and all(struct.length for struct in section.structs) for section in layout.sections
    )
    no_deletes = len(update) == layout.delete_start + 1  # "0 clients": most updates
    deletes = None if no_deletes else _non_empty_deletes(update, layout.delete_start)
    if same_structs and deletes is None:
        return update
    if same_structs:
        head = update[: layout.delete_start]
    else:
        sections = [(section.client, [s for s in section.structs if s.length]) for section in layout.sections]
        head = _sections(update, [(client, structs) for client, structs in sections if structs])
    return head + (update[layout.delete_start :] if deletes is None else _delete_set(deletes))


def _non_empty_deletes(update: bytes, start: int) -> list[tuple[int, list[tuple[int, int]]]] | None:
    """The delete set at ``start`` without its empty ranges and the clients
    left with none (``(client, [(clock, length)])`` in order); None when it
    has none of them."""
    reader = lib0.Reader(update, MalformedUpdate, start)
    entries: list[tuple[int, list[tuple[int, int]]]] = []
    clean = True
    for _ in range(reader.varuint()):
        client, count = reader.varuint(), reader.varuint()
        kept = []
        for _ in range(count):
            clock, length = reader.varuint(), reader.varuint()
            if length:
                kept.append((clock, length))
        clean = clean and 0 < len(kept) == count
        if kept:
            entries.append((client, kept))
    return None if clean else entries
