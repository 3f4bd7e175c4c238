"""Stream ids, and their exact, order-preserving mapping to tracker scores.

A Redis stream id is ``<ms>-<seq>``. The tracker needs a single number per
session, so an id is mapped to ``ms * 1000 + seq``. That is exact and
order-preserving only while ``seq <= 999`` (and the result stays below 2**53,
true for millisecond timestamps until the year 287,000). Redis itself would
issue ``seq >= 1000`` within one busy millisecond, so yrelay never lets Redis
choose: the append script computes every id with :func:`next_stream_id`, which
moves to the next millisecond instead of going past ``MAX_SEQ``.
"""

from __future__ import annotations

import re
from typing import NamedTuple

MAX_SEQ = 999
SCORE_FACTOR = MAX_SEQ + 1
#: Largest value a float64 holds exactly (sorted-set scores are doubles).
MAX_EXACT_SCORE = 2**53

_ID_PATTERN = re.compile(r"^(\d{1,15})-(\d{1,3})$")


class InvalidOffset(ValueError):
    """Raised for a string that is not a stream id yrelay could have issued."""


class StreamId(NamedTuple):
    """A parsed stream id; tuples compare in stream order."""

    ms: int
    seq: int

    @classmethod
    def parse(cls, text: object) -> StreamId:
        """Parse ``"<ms>-<seq>"``; reject anything the append path cannot produce."""
        if not isinstance(text, str):
            raise InvalidOffset("an offset is a string like '1700000000000-0'")
        match = _ID_PATTERN.fullmatch(text)
        if match is None:
            raise InvalidOffset(f"not a stream id: {text[:40]!r}")
        ms, seq = int(match.group(1)), int(match.group(2))
        if seq > MAX_SEQ:
            raise InvalidOffset(f"sequence part above {MAX_SEQ}: {text!r}")
        return cls(ms, seq)

    @staticmethod
    def check(text: object) -> str:
        """``text`` if :meth:`parse` reads it, else :class:`InvalidOffset`
        saying why: the check alone, at a third of the cost (every ``ack``
        frame's offset is checked as it is decoded)."""
        if isinstance(text, str) and _ID_PATTERN.fullmatch(text) is not None:  # 3 digits: seq <= MAX_SEQ
            return text
        StreamId.parse(text)  # raises, naming what is wrong
        return str(text)

    @classmethod
    def from_score(cls, score: float) -> StreamId:
        """Inverse of :meth:`score`."""
        value = int(score)
        return cls(value // SCORE_FACTOR, value % SCORE_FACTOR)

    def score(self) -> int:
        """The tracker score: exact and order-preserving for ``seq <= MAX_SEQ``."""
        return self.ms * SCORE_FACTOR + self.seq

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"


#: The id before every entry: "the client holds nothing from the stream".
ZERO = StreamId(0, 0)


def next_stream_id(last: StreamId | None, now_ms: int) -> StreamId:
    """The id to give the next appended entry.

    Mirrors ``lua/append.lua`` (which is what really runs); kept in Python so
    the rule can be property-tested. Ids strictly increase and never carry a
    sequence above ``MAX_SEQ``: past it, the entry borrows the next millisecond.
    """
    if last is None or now_ms > last.ms:
        return StreamId(now_ms, 0)
    if last.seq < MAX_SEQ:
        return StreamId(last.ms, last.seq + 1)
    return StreamId(last.ms + 1, 0)
