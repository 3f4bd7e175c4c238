"""Yjs awareness updates (y-protocols/awareness.js), decoded and encoded
without y-py: the server checks them, remembers one entry per client and
relays them, but never applies them to anything.

Wire format (``encodeAwarenessUpdate``): varuint count, then per entry
varuint clientID, varuint clock, varstring state, where the state is the
UTF-8 JSON text of the client's state and ``null`` means "removed". lib0
varuints carry 7 bits per byte, low groups first, high bit = more follows;
a varstring is a varuint byte length and the UTF-8 bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

#: Entries one update may carry (a browser sends one: its own).
MAX_ENTRIES = 16
#: JavaScript numbers are exact below 2^53; lib0 reads nothing larger.
MAX_UINT = 2**53 - 1

REMOVED = "null"


class AwarenessError(ValueError):
    """Bytes that are not an awareness update this server accepts."""


@dataclass(frozen=True)
class AwarenessEntry:
    """One client's state at one clock; ``state`` is the JSON text as sent."""

    client_id: int
    clock: int
    state: str

    @property
    def removed(self) -> bool:
        return self.state == REMOVED

    def removal(self) -> "AwarenessEntry":
        """What a client that saw this entry accepts as "the client left":
        a null state at a higher clock (y-protocols ignores older clocks;
        at the largest clock it takes a null state at the same one)."""
        return AwarenessEntry(self.client_id, min(self.clock + 1, MAX_UINT), REMOVED)

    def encode(self) -> bytes:
        state = self.state.encode()
        return _varuint(self.client_id) + _varuint(self.clock) + _varuint(len(state)) + state


def encode_update(entries: Iterable[AwarenessEntry]) -> bytes:
    encoded = [entry.encode() for entry in entries]
    return join_encoded(encoded)


def join_encoded(encoded: list[bytes]) -> bytes:
    """An update from entries already encoded one by one (as they are stored)."""
    return _varuint(len(encoded)) + b"".join(encoded)


def decode_update(data: bytes, max_entries: int = MAX_ENTRIES) -> list[AwarenessEntry]:
    """Every entry of ``data``, or :class:`AwarenessError`: trailing bytes,
    too many entries and states that are not a JSON object or null are
    refused, so nothing stored or relayed can break a browser's JSON.parse."""
    reader = _Reader(data)
    count = reader.varuint()
    if count > max_entries:
        raise AwarenessError(f"at most {max_entries} entries per awareness update, got {count}")
    entries = [AwarenessEntry(reader.varuint(), reader.varuint(), _check_state(reader.varstring()))
               for _ in range(count)]
    if not reader.done():
        raise AwarenessError("trailing bytes after the last entry")
    return entries


def _check_state(text: str) -> str:
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise AwarenessError("a state is not valid JSON") from None
    if value is None:
        return REMOVED  # however it was spelled
    if not isinstance(value, dict):
        raise AwarenessError("a state must be a JSON object or null")
    return text


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")  # Python accepts NaN and Infinity; JSON.parse does not


def _varuint(value: int) -> bytes:
    if not 0 <= value <= MAX_UINT:
        raise AwarenessError(f"{value} does not fit a lib0 varuint")
    out = bytearray()
    while value > 0x7F:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)
    return bytes(out)


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def done(self) -> bool:
        return self.pos == len(self.data)

    def varuint(self) -> int:
        value, shift = 0, 0
        while True:
            if self.pos >= len(self.data):
                raise AwarenessError("update ends inside a number")
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if value > MAX_UINT:
                raise AwarenessError("number larger than 2^53 - 1")
            if byte < 0x80:
                return value
            shift += 7

    def varstring(self) -> str:
        length = self.varuint()
        end = self.pos + length
        if end > len(self.data):
            raise AwarenessError("update ends inside a state")
        raw, self.pos = self.data[self.pos:end], end
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise AwarenessError("a state is not UTF-8") from None


__all__ = ["MAX_ENTRIES", "AwarenessEntry", "AwarenessError", "decode_update", "encode_update", "join_encoded"]
