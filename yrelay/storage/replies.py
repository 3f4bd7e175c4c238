"""Turning Redis replies (bytes, or str for values Lua built) into our types.

One place for it, so every module reads ids and names the same way.
"""

from __future__ import annotations

from typing import cast

import redis.exceptions

from yrelay.storage.offsets import StreamId


def text(raw: bytes | str) -> str:
    """A reply as text (Redis answers bytes; a few script replies are str)."""
    return raw.decode() if isinstance(raw, bytes) else raw


def stream_id(raw: bytes | str | None) -> StreamId | None:
    """A stream id reply, or None for a missing (nil or empty) one."""
    return StreamId.parse(text(raw)) if raw else None


#: A stream entry as redis-py reads it from a RESP2 connection (yrelay's): id and field map.
RawEntry = tuple[bytes, dict[bytes, bytes]]


def stream_entries(reply: object) -> list[RawEntry]:
    """An ``XRANGE``/``XREVRANGE`` reply (None: none) as yrelay's clients get
    it. redis-py types each id and field as maybe ``str`` or None, for
    clients decoding responses or speaking RESP3; yrelay's do neither."""
    return cast(list[RawEntry], reply or [])


def scored(reply: object) -> list[tuple[bytes, float]]:
    """A ``ZRANGE ... WITHSCORES`` reply as yrelay's RESP2 clients get it:
    (member, score) pairs (redis-py's type covers the RESP3 shape too)."""
    return cast(list[tuple[bytes, float]], reply)


def is_wrong_type(exc: BaseException) -> bool:
    """Redis refused a command on a key that holds another type
    (``WRONGTYPE``): that key stays broken until someone repairs it, so its
    reader sets it aside and reads the others. Every other refusal (``BUSY``
    while a script runs long, ``MASTERDOWN``, ``LOADING``...) is Redis's
    passing state: retried, nothing set aside."""
    return isinstance(exc, redis.exceptions.ResponseError) and str(exc).startswith("WRONGTYPE")
