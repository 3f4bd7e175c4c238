"""The binary encoding of reconciliation messages.

A message is a version byte and a run of entries. Entries cover consecutive
ranges of the sorted id space: each carries only its *upper* bound, its
lower bound being the previous entry's upper bound ("" for the first). A
range nobody has anything to say about is a SKIP entry, or is simply past
the last entry.

    message  = VERSION entry*
    entry    = head:varint [shared:varint suffix:bytes] payload
      head   = mode | (suffix length + 1) << 2, or mode | 0 for the bound +inf
      bound  = previous bound[:shared] + suffix (UTF-8); strictly increasing
    payload  = SKIP, LIST: nothing
               FINGERPRINT: count:varint  fingerprint:8 bytes (top of xxh3 XOR)
               IDS: k:varint  k x (suffix length:varint  shared:varint  suffix),
                    each id prefix-compressed against the previous one (the
                    first against the entry's lower bound)

A varint is a lib0 varuint (:mod:`yrelay.yjs.lib0`, at most 2**53 - 1).
Bounds are :func:`~yrelay.reconciliation.storage.separator` prefixes and
share a prefix with their predecessor, so one costs about three bytes and a
fingerprint entry about thirteen. Decoding trusts nothing: every violation
(truncation, overlong varints, bounds out of order, ids outside their range,
invalid UTF-8, a mode the direction does not allow, too many entries) raises
:class:`MalformedMessage`, and each loop is bounded by the input's length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from yrelay.reconciliation.storage import common_prefix
from yrelay.yjs.lib0 import Reader, write_varuint

VERSION = 1
FINGERPRINT_BYTES = 8
#: Longest bound or id accepted (document ids are at most 200 characters).
MAX_ID_BYTES = 1024


class Mode(IntEnum):
    SKIP = 0  # nothing to say about this range
    FINGERPRINT = 1  # count + fingerprint of the sender's ids in the range
    IDS = 2  # every id the sender holds in the range (replies)
    LIST = 3  # "send me your ids in this range" (requests)


_MODES = tuple(Mode)  # Mode(value) is slow; decoding looks modes up here
REQUEST_MODES = frozenset({Mode.SKIP, Mode.FINGERPRINT, Mode.LIST})
REPLY_MODES = frozenset({Mode.SKIP, Mode.FINGERPRINT, Mode.IDS})


class MalformedMessage(ValueError):
    """A message that is not a valid encoding, or breaks a limit."""


@dataclass(slots=True)
class Entry:
    """One non-SKIP range of a message, with its payload."""

    lower: str
    upper: str | None
    mode: Mode
    count: int = 0
    fingerprint: int = 0
    ids: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Message:
    """The non-SKIP entries, and how far the message reaches (its last
    bound: None is +inf, "" an empty message)."""

    entries: list[Entry]
    end: str | None


def fingerprint(hash_value: int) -> int:
    """The range fingerprint of a 128-bit XOR hash: its top 64 bits."""
    return hash_value >> (128 - 8 * FINGERPRINT_BYTES)


def _compressed(out: bytearray, previous: bytes, value: bytes) -> None:
    shared = common_prefix(previous, value)
    write_varuint(out, len(value) - shared)
    write_varuint(out, shared)
    out += value[shared:]


class Encoder:
    """Builds one message entry by entry. ``mark``/``rollback`` let a sender
    add an entry, see that the message grew past its limit, and take it back."""

    def __init__(self) -> None:
        self._out = bytearray([VERSION])
        self._position: str | None = ""  # lower bound of the next entry
        self._last = b""  # the previous bound, UTF-8
        self.entries = 0

    def __len__(self) -> int:
        return len(self._out)

    def mark(self) -> tuple[int, str | None, bytes, int]:
        return len(self._out), self._position, self._last, self.entries

    def rollback(self, mark: tuple[int, str | None, bytes, int]) -> None:
        size, self._position, self._last, self.entries = mark
        del self._out[size:]

    def _bound(self, mode: Mode, upper: str | None) -> None:
        if self._position is None or (upper is not None and upper <= self._position):
            raise ValueError("entries must be added in increasing order")
        self.entries += 1
        self._position = upper
        if upper is None:
            write_varuint(self._out, int(mode))
            return
        value = upper.encode()
        shared = common_prefix(self._last, value)
        write_varuint(self._out, int(mode) | (len(value) - shared + 1) << 2)
        write_varuint(self._out, shared)
        self._out += value[shared:]
        self._last = value

    def _entry(self, mode: Mode, lower: str, upper: str | None) -> None:
        """Open an entry of ``mode`` over ``[lower, upper)``, after a SKIP up to ``lower`` if needed."""
        if lower != self._position:
            self._bound(Mode.SKIP, lower)
        self._bound(mode, upper)

    def fingerprint(self, lower: str, upper: str | None, count: int, hash_value: int) -> None:
        self._entry(Mode.FINGERPRINT, lower, upper)
        write_varuint(self._out, count)
        self._out += fingerprint(hash_value).to_bytes(FINGERPRINT_BYTES, "big")

    def ids(self, lower: str, upper: str | None, ids: Sequence[str]) -> None:
        self._entry(Mode.IDS, lower, upper)
        write_varuint(self._out, len(ids))
        previous = lower.encode()
        for item in ids:
            value = item.encode()
            _compressed(self._out, previous, value)
            previous = value

    def list_request(self, lower: str, upper: str | None) -> None:
        self._entry(Mode.LIST, lower, upper)

    def finish(self) -> bytes:
        return bytes(self._out)

    def finish_at(self, end: str | None) -> bytes:
        """The message, extended with a SKIP if needed so that it visibly
        reaches ``end`` (None: +inf). Replies say how far they got this way."""
        if end != self._position:
            self._bound(Mode.SKIP, end)
        return bytes(self._out)


def id_sizes(lower: str, ids: Sequence[str], room: int) -> list[int]:
    """The running size of ``ids`` as an IDS payload after ``lower`` (without
    the count): ``sizes[k - 1]`` bytes hold the first ``k`` ids. Stops after
    the first size past ``room``."""
    scratch, sizes = bytearray(), []
    previous = lower.encode()
    for item in ids:
        value = item.encode()
        _compressed(scratch, previous, value)
        previous = value
        sizes.append(len(scratch))
        if len(scratch) > room:
            break
    return sizes


def _prefixed(reader: Reader, previous: bytes, suffix: int) -> bytes:
    """``previous[:shared] + suffix``: a bound or an id (shared is next)."""
    shared = reader.varuint()
    if shared > len(previous) or shared + suffix > MAX_ID_BYTES:
        raise MalformedMessage("bad prefix compression, or an id longer than allowed")
    return previous[:shared] + reader.uint8array(suffix)


def _text(value: bytes) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise MalformedMessage("id or bound is not UTF-8") from None


def decode(data: bytes, modes: frozenset[Mode], max_entries: int) -> Message:
    """Parse a message, allowing only ``modes`` and at most ``max_entries``
    entries (SKIPs included); MalformedMessage on anything wrong."""
    if not isinstance(data, (bytes, bytearray)) or not data or data[0] != VERSION:
        raise MalformedMessage("not a reconciliation message of this version")
    reader, entries = Reader(bytes(data), MalformedMessage, pos=1), []  # past the version
    lower: str | None = ""
    last = b""
    count = 0
    while not reader.done():
        count += 1
        if count > max_entries or lower is None:
            raise MalformedMessage("too many entries, or an entry past +inf")
        head = reader.varuint()
        mode, size = head & 3, head >> 2
        if mode not in modes:
            raise MalformedMessage(f"mode {mode} not allowed here")
        upper: str | None = None
        if size:
            last = _prefixed(reader, last, size - 1)
            upper = _text(last)
            if upper <= lower:
                raise MalformedMessage("bounds must increase")
        entry = Entry(lower, upper, _MODES[mode])
        if mode == Mode.FINGERPRINT:
            entry.count = reader.varuint()
            entry.fingerprint = int.from_bytes(reader.uint8array(FINGERPRINT_BYTES), "big")
        elif mode == Mode.IDS:
            entry.ids = _ids(reader, entry)
        if mode != Mode.SKIP:
            entries.append(entry)
        lower = upper
    return Message(entries, lower)


def _ids(reader: Reader, entry: Entry) -> list[str]:
    size = reader.varuint()
    if size > reader.remaining() // 2:  # every id takes >= 2 bytes
        raise MalformedMessage("id count larger than the message")
    ids: list[str] = []
    previous = entry.lower.encode()
    lowest = entry.lower
    for _ in range(size):
        previous = _prefixed(reader, previous, reader.varuint())
        item = _text(previous)
        if item < lowest or (ids and item <= ids[-1]) or (entry.upper is not None and item >= entry.upper):
            raise MalformedMessage("ids must be sorted, distinct and inside their range")
        ids.append(item)
    return ids
