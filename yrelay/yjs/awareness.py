"""Yjs awareness updates (y-protocols/awareness.js), decoded and encoded
without y-py: the server checks them, remembers one entry per client and
relays them, but never applies them to anything.

Wire format (``encodeAwarenessUpdate``): varuint count, then per entry
varuint clientID, varuint clock, varstring state, where the state is the
UTF-8 JSON text of the client's state and ``null`` means "removed" (the
lib0 encoding: :mod:`yrelay.yjs.lib0`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from yrelay.yjs import lib0

#: Entries one update may carry (a browser sends one: its own).
MAX_ENTRIES = 16
#: JavaScript numbers are exact below 2^53; lib0 reads nothing larger.
MAX_UINT = lib0.MAX_SAFE_INTEGER

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

    def removal(self) -> AwarenessEntry:
        """What a client that saw this entry accepts as "the client left":
        a null state at the same clock (y-protocols removes a state it holds
        on a null at its clock; y-websocket's server sends just that). Not a
        higher clock: a stock y-websocket client does not move its clock
        when it reconnects, so after a removal at clock + 1 the others
        ignored its re-sent state *and* its next renewal (at clock + 1), and
        it stayed invisible one renewal (15 s) longer than on y-websocket's
        server after every reconnect (issue 36)."""
        return AwarenessEntry(self.client_id, self.clock, REMOVED)

    def encode(self) -> bytes:
        out = bytearray()
        try:
            lib0.write_varuint(out, self.client_id)
            lib0.write_varuint(out, self.clock)
        except ValueError as exc:
            raise AwarenessError(str(exc)) from None
        lib0.write_varstring(out, self.state)
        return bytes(out)


def encode_update(entries: Iterable[AwarenessEntry]) -> bytes:
    encoded = [entry.encode() for entry in entries]
    return join_encoded(encoded)


def join_encoded(encoded: list[bytes]) -> bytes:
    """An update from entries already encoded one by one (as they are stored)."""
    return lib0.varuint(len(encoded)) + b"".join(encoded)


def decode_update(data: bytes, max_entries: int = MAX_ENTRIES) -> list[AwarenessEntry]:
    """Every entry of ``data``, or :class:`AwarenessError`: trailing bytes,
    too many entries and states that are not a JSON object or null are
    refused, so nothing stored or relayed can break a browser's JSON.parse."""
    reader = lib0.Reader(data, AwarenessError)
    count = reader.varuint()
    if count > max_entries:
        raise AwarenessError(f"at most {max_entries} entries per awareness update, got {count}")
    entries = [
        AwarenessEntry(reader.varuint(), reader.varuint(), _check_state(reader.varstring("state")))
        for _ in range(count)
    ]
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


__all__ = ["MAX_ENTRIES", "AwarenessEntry", "AwarenessError", "decode_update", "encode_update", "join_encoded"]
