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

The same read decides whether the update has a shape both engines (y-py,
the Python client's, and pycrdt, the server's) are known to read
(:attr:`Layout.known_safe`). Every update must be readable by both before
it is stored, and y-py 0.6.2 can abort its process on a hostile one, so
the engines run in validator processes (:mod:`yrelay.yjs.validator`): a
pipe round trip per batch (~4 ms of p50 at 500 updates/s, issue 20) and
the workers' CPU. Most updates are a few structs typed by a browser; an
update of a known shape skips the workers. The shapes were shown to be
read by both engines by a differential fuzz over millions of generated and
mutated updates (``python -m yrelay_tools.testing.update_fuzz``; figures
in BENCHMARKS.md#validation). The decision never refuses anything: False
means "ask the engines". Each rule closes a door the fuzz showed open or
one no live edit needs:

- at most ``KNOWN_SAFE_BYTES``;
- each client at most once, with at least one struct; every client id
  below 2**32 (y-py panics on some above: 2**32, 2**33, ...) and every
  clock, length and delete range below 2**31 (both engines count in u32);
  every number written in as few bytes as it needs (as every encoder does);
- only Items (no GC, no Skip: live edits carry neither), with content
  Deleted, String, Binary, Any, Type (refs 0..6 but XmlHook) or
  Format/Embed whose JSON is canonical and simple; at least one clock long;
- every string (content, root names, map keys, type names, Any strings)
  strict UTF-8 (no encoded surrogates); a parent named, or given by id;
- Any values: undefined, null, booleans, integers within 32 bits, floats,
  strings, and arrays and objects of those, nested at most ``MAX_DEPTH``
  deep;
- no origin, right origin or delete cuts a String of the update that holds
  a surrogate pair (y-py panics cutting inside one);
- a reference to the item's own client names an earlier clock; a parent
  reference into the update's own structs names a Type item.

The 21-byte update that aborts y-py (docs/security.md#validation) is an
Embed whose text is not UTF-8: not a known shape, so it goes to a worker.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import itertools
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from yrelay.yjs import lib0

Ranges = dict[int, list[tuple[int, int]]]  # client -> [start, end) clock ranges

_BIT6, _BIT7, _BIT8, _BITS5 = 32, 64, 128, 31
_GC, _SKIP = 0, 10
_STRING, _TYPE = 4, 7
_TYPE_NEEDS_KEY = {3, 5}  # YXmlElement, YXmlHook carry a node name
#: Type refs Yjs 13 reads: YArray .. YXmlText (0-6). pycrdt reads 9 and 15
#: too (yrs's sub-document and "undefined" branches); Yjs throws on them.
YJS_TYPE_REFS = 7
_NO_END = float("inf")

#: Larger updates are never known safe: they go to the validator processes
#: (their batches amortise the round trip, and the fuzz covered updates up
#: to this size).
KNOWN_SAFE_BYTES = 4096
#: Nesting of a known shape's Any values, arrays and objects included.
MAX_DEPTH = 8
_MAX_CLOCK = _MAX_INT = 2**31 - 1
#: Client ids are 32-bit, as Yjs writes them: y-py panics on an item whose
#: parent is named by id when the item's or the parent's client is 2**32,
#: 2**33, 3 * 2**32, ... (found by the fuzz; pycrdt's own ids take 53 bits).
_MAX_CLIENT = 2**32 - 1
#: Array, Map, Text, XmlElement, XmlFragment, XmlText (not XmlHook: pycrdt
#: reads its name differently from y-py and refused every one the fuzz made).
_KNOWN_TYPE_REFS = {0, 1, 2, 3, 4, 6}
#: JSON text with no escapes and no control characters.
_PLAIN_JSON = re.compile(r"[^\\\x00-\x1f]*")


class MalformedUpdate(ValueError):
    """The bytes do not follow the Yjs v1 update layout."""


class _Walk(lib0.Reader):
    """One read of an update's structs. ``strict``: what Yjs cannot decode is
    refused (see :func:`read_layout`). ``decide``: ``known`` stays True while
    the update has one of the shapes both engines are known to read (see the
    module doc), and the walk gathers what is decided once every struct is
    read (:meth:`decided`)."""

    __slots__ = ("strict", "known", "pairs", "cuts", "strings", "parents")
    #: (client, clock) where an engine may cut a struct: after an origin,
    #: at a right origin, at both ends of each delete range.
    cuts: list[tuple[int, int]]
    #: Strings of the update holding surrogate pairs: (client, start, end).
    strings: list[tuple[int, int, int]]
    #: Parent ids items name.
    parents: list[tuple[int, int]]

    def __init__(self, data: bytes, strict: bool = False, decide: bool = False) -> None:
        lib0.Reader.__init__(self, data, MalformedUpdate)
        self.strict = strict
        self.known = decide and len(data) <= KNOWN_SAFE_BYTES
        #: Whether the last ContentString read holds a surrogate pair.
        self.pairs = False
        if self.known:  # (only a walk that decides reads them)
            self.cuts, self.strings, self.parents = [], [], []

    def text(self, what: str, lone_surrogates: bool = False) -> str:
        """A string Yjs decodes (lib0's TextDecoder is fatal: invalid UTF-8,
        encoded surrogates included, throws): refused when ``strict``, not a
        known shape otherwise; '' unless one of them needs it read, or
        ``lone_surrogates`` (a ContentString: they pass, their UTF-16 length
        counts)."""
        data = self.varuint8array()
        if self.strict or self.known:
            try:
                return data.decode()
            except UnicodeDecodeError:
                if self.strict:
                    raise MalformedUpdate(f"{what} is not UTF-8: {_YJS}") from None
                self.known = False
        if not lone_surrogates:
            return ""
        try:
            return data.decode("utf-8", errors="surrogatepass")
        except UnicodeDecodeError:
            raise MalformedUpdate("string is not UTF-8") from None

    def json(self, what: str, undefined: bool = False) -> None:
        """JSON text Yjs parses (``JSON.parse``: no NaN, no Infinity, unlike
        Python's); ``undefined``: the word itself passes (ContentJSON's).
        A known shape holds only JSON both engines' parsers read alike."""
        text = self.text(what)
        if self.known:
            self.known = _plain_json(text)
        if self.strict and not self.known and not (undefined and text == "undefined") and not _is_json(text):
            raise MalformedUpdate(f"{what} is not JSON: {_YJS}")

    def value(self) -> None:
        """One value of lib0's ``writeAny`` (ContentAny's)."""
        start = self.pos
        if self.known:
            with contextlib.suppress(MalformedUpdate):
                if self._plain_value(0):
                    return
            self.known = False
            self.pos = start  # read again as any value (or refused as before)
        self.skip_any(strict=self.strict)

    def _plain_value(self, depth: int) -> bool:
        """A value of the known shapes: undefined, null, booleans, integers
        within 32 bits (not -0), floats, strict UTF-8 strings, and arrays and
        objects of those nested at most ``MAX_DEPTH`` deep (not bigint, not
        binary: rare, left to the engines)."""
        if depth > MAX_DEPTH:
            return False
        kind = self.uint8()
        if kind in (127, 126, 121, 120):  # undefined, null, false, true
            return True
        if kind == 125:  # integer (a padded one is caught by ``padded``)
            start = self.pos
            return abs(self.varint()) <= _MAX_INT and not (self.pos == start + 1 and self.data[start] == 0x40)
        if kind in (124, 123):  # float32, float64
            self.uint8array(4 if kind == 124 else 8)
            return True
        if kind == 119:  # string
            return _utf8(self.varuint8array())
        if kind == 118:  # object
            return all(_utf8(self.varuint8array()) and self._plain_value(depth + 1) for _ in range(self.varuint()))
        if kind == 117:  # array
            return all(self._plain_value(depth + 1) for _ in range(self.varuint()))
        return False

    def content_length(self, ref: int) -> int:
        """Consume an Item's content and return how many clocks it spans."""
        if ref == 1:  # ContentDeleted
            return self.varuint()
        if ref == 3:  # ContentBinary
            self.varuint8array()
            return 1
        if ref == 4:  # ContentString
            text = self.text("a string", lone_surrogates=True)
            length = _utf16_length(text)
            if self.known:
                self.pairs = length != len(text)
            return length
        if ref == 5:  # ContentEmbed: JSON text
            self.json("an embed")
            return 1
        if ref == 6:  # ContentFormat: key, JSON text
            self.text("a format's key")
            self.json("a format's value")
            return 1
        if ref == 7:  # ContentType
            type_ref = self.varuint()
            if self.strict and type_ref >= YJS_TYPE_REFS:
                raise MalformedUpdate(f"type ref {type_ref} is not one of Yjs's (0-6): {_YJS}")
            self.known = self.known and type_ref in _KNOWN_TYPE_REFS
            if type_ref in _TYPE_NEEDS_KEY:
                self.text("a node name")
            return 1
        if ref == 8:  # ContentAny
            count = self.varuint()
            for _ in range(count):
                self.value()
            return count
        self.known = False  # ContentJSON (legacy), ContentDoc: not seen in live edits
        if ref == 2:  # ContentJSON: strings
            count = self.varuint()
            for _ in range(count):
                self.json("a JSON item", undefined=True)
            return count
        if ref == 9:  # ContentDoc: guid, options
            self.text("a sub-document's guid")
            if self.strict and self.data[self.pos : self.pos + 1] in (b"\x7f", b"\x7e"):
                raise MalformedUpdate(f"a sub-document's options are undefined or null: {_YJS}")
            self.skip_any(strict=self.strict)
            return 1
        raise MalformedUpdate(f"unknown content type {ref}")

    def item(self, info: int, refs: list[tuple[int, int]] | None = None) -> int:
        """Consume one Item (after its info byte) and return its length; the
        ids it refers to (origin, right origin, parent) go to ``refs`` when given."""
        if info & _BIT8:
            self._ref(refs)  # origin id
        if info & _BIT7:
            self._ref(refs)  # right origin id
        if not info & (_BIT7 | _BIT8):  # the parent cannot be copied from an origin
            named = self.varuint()
            if named == 1:
                self.text("a root type's name")
            else:  # lib0 reads any value but 1 as "an id", the engines as a u32 (2**32 + 1 is a name)
                self.known = self.known and named == 0
                self._ref(refs)  # the parent item's id
            if info & _BIT6:
                self.text("a map key")  # parentSub
        return self.content_length(info & _BITS5)

    def _ref(self, refs: list[tuple[int, int]] | None) -> None:
        client, clock = self.varuint(), self.varuint()
        if refs is not None:
            refs.append((client, clock))

    def decide_item(self, client: int, clock: int, length: int, info: int, refs: list[tuple[int, int]]) -> None:
        """Keep ``known`` for an Item of the known shapes (its content was
        read): at least one clock long, below 2**31; ids of 32-bit clients
        and 31-bit clocks, one of its own client naming an earlier clock."""
        if not 1 <= length <= clock + length <= _MAX_CLOCK:
            self.known = False
        if self.pairs and info & _BITS5 == _STRING:
            self.strings.append((client, clock, clock + length))
        origin = info & _BIT8
        for ref_client, ref_clock in refs:
            if ref_clock > _MAX_CLOCK or ref_client > _MAX_CLIENT or (ref_client == client and ref_clock >= clock):
                self.known = False
            if not info & (_BIT7 | _BIT8):
                self.parents.append((ref_client, ref_clock))
            else:  # an origin (first): the item goes after that clock; a right origin: before it
                self.cuts.append((ref_client, ref_clock + 1 if origin else ref_clock))
                origin = 0

    def decided(self, sections: Sequence[Section]) -> bool:
        """The decision, once the whole update is read (``known`` held
        struct by struct): its strings with
        surrogate pairs are cut nowhere inside one (y-py panics cutting
        inside one: an origin or a delete naming half an emoji of the same
        update, found by the fuzz), and a parent it carries itself is a
        Type item (else the engines keep the item pending)."""
        if self.padded:  # every number as few bytes as it needs
            return False
        carried = {section.client: section.structs for section in sections} if self.parents else {}
        for client, clock in self.parents:
            structs = carried.get(client, ())
            if structs and structs[0].clock <= clock < structs[-1].clock + structs[-1].length:
                if not any(s.clock == clock and self.data[s.start] & _BITS5 == _TYPE for s in structs):
                    return False
        return not any(
            cut_client == client and start < cut < end
            for client, start, end in self.strings
            for cut_client, cut in self.cuts
        )


def _utf8(data: bytes) -> bool:
    """Whether ``data`` is strict UTF-8 (no encoded surrogates)."""
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


_YJS = "Yjs cannot apply it"


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


def _plain_json(text: str) -> bool:
    """Format and Embed values of the known shapes: JSON both engines'
    parsers read alike (canonical, no escapes, no control characters:
    parsers differ on escapes and lone surrogates), of null, booleans,
    strings and 32-bit integers (and arrays and objects of those)."""
    if len(text) > 1024 or not _PLAIN_JSON.fullmatch(text):
        return False
    try:
        value = json.loads(text)
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False) == text and _plain(value, 0)
    except (ValueError, RecursionError):
        return False


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


def _utf16_length(text: str) -> int:
    """Yjs counts string clocks in UTF-16 code units, as JavaScript does."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le", errors="surrogatepass")) // 2


@dataclass
class Coverage:
    """What one update holds: inserted struct ranges and deleted ranges."""

    structs: Ranges = field(default_factory=dict)
    deletes: Ranges = field(default_factory=dict)


def _read_structs(reader: _Walk) -> Ranges:
    structs: Ranges = {}
    for _ in range(reader.varuint()):
        count, client, clock = reader.varuint(), reader.varuint(), reader.varuint()
        ranges = structs.setdefault(client, [])
        for _ in range(count):
            info = reader.uint8()
            ref = info & _BITS5
            length = reader.varuint() if ref in (_GC, _SKIP) else reader.item(info)
            if ref != _SKIP and length:
                ranges.append((clock, clock + length))
            clock += length
    return {client: merge_ranges(ranges) for client, ranges in structs.items() if ranges}


def _read_deletes(reader: _Walk) -> Ranges:
    deletes: Ranges = {}
    for _ in range(reader.varuint()):
        client, count = reader.varuint(), reader.varuint()
        ranges = deletes.setdefault(client, [])
        reader.known = reader.known and client <= _MAX_CLIENT
        for _ in range(count):
            clock, length = reader.varuint(), reader.varuint()
            if reader.known:
                reader.cuts += ((client, clock), (client, clock + length))
                reader.known = clock + length <= _MAX_CLOCK
            if length:  # y-py writes empty deletes; they cover nothing
                ranges.append((clock, clock + length))
    return {client: merge_ranges(ranges) for client, ranges in deletes.items() if ranges}


def decode(update: bytes) -> Coverage:
    """The ranges ``update`` inserts and deletes; raises :class:`MalformedUpdate`."""
    reader = _Walk(update)
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
    reader = _Walk(update)
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
    return sum(1 for _ in itertools.takewhile(lambda part: part is not None and covers(whole, part), parts))


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
    reader = lib0.Reader(data, MalformedUpdate)
    count = reader.varuint()
    if count > (len(data) - reader.pos) // 2:
        raise MalformedUpdate(f"state vector claims {count} clients in {len(data)} bytes")
    clocks = {reader.varuint(): reader.varuint() for _ in range(count)}  # (a key is read before its value)
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
    structs = [None if (coverage := decode_or_none(update)) is None else coverage.structs for update in updates]
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
    #: A shape both engines are known to read (see the module doc): it
    #: needs no validator process. False: ask the engines (or not decided:
    #: ``read_layout(decide=True)`` decides).
    known_safe: bool = False


def read_layout(update: bytes, strict: bool = False, decide: bool = False) -> Layout:
    """Every struct of ``update`` with its refs and byte span, and its delete
    set; raises :class:`MalformedUpdate` (also for ids past 2**53 - 1).

    ``strict`` (what the server stores from now on: :mod:`yrelay.app.core.write_path`)
    also refuses what pycrdt and y-py read but Yjs 13.6, the browser
    clients' engine, cannot even decode, and no Yjs encoder writes: a
    client in two sections (Yjs keeps the last one only, so it would not
    hold what the others do), a type ref past 6, a string that is not
    UTF-8 (lib0's decoder is fatal), JSON content ``JSON.parse`` throws
    on, and a sub-document whose options are undefined or null. (What Yjs
    decodes but throws on integrating, and
    which carries nothing, is left out of what is stored instead:
    :func:`stored_form`.) Entries stored before are read leniently (a
    rebuilt state vector must count what the append script counted).

    ``decide``: the same walk decides :attr:`Layout.known_safe` (else False)."""
    reader = _Walk(update, strict, decide)
    sections = []
    seen: set[int] = set()
    total = 0
    for _ in range(reader.varuint()):
        count, client, clock = reader.varuint(), reader.varuint(), reader.varuint()
        if strict or reader.known:
            if strict and client in seen:
                raise MalformedUpdate(f"client {client} has two sections (Yjs reads only the last): {_YJS}")
            reader.known = reader.known and count > 0 and client <= _MAX_CLIENT and client not in seen
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
                reader.known = False  # live edits carry neither
                structs.append(Struct(clock, length, ref == _SKIP, (), start, reader.pos))
            else:
                refs: list[tuple[int, int]] = []
                length = reader.item(info, refs)
                for pair in refs:
                    highest = max(highest, *pair)
                if reader.known:
                    reader.decide_item(client, clock, length, info, refs)
                structs.append(Struct(clock, length, False, tuple(refs), start, reader.pos))
            clock += length
        _check_safe(client, clock, highest)
        sections.append(Section(client, tuple(structs)))
    delete_start = reader.pos
    deletes = _read_deletes(reader)
    if reader.pos != len(update):
        raise MalformedUpdate("trailing bytes after the delete set")
    _check_safe(*(value for ranges in deletes.values() for pair in ranges for value in pair), *deletes)
    return Layout(tuple(sections), delete_start, deletes, reader.known and reader.decided(sections))


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
