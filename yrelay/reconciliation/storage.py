"""What reconciliation needs from a set of ids, and the in-memory set.

Both peers see their set as sorted ids and talk about half-open ranges
``[lower, upper)`` of it: ``lower`` is a string ("" is the very start),
``upper`` a string or None (the very end). Every method takes a batch of
ranges, because one protocol message asks about thousands of them and a
Redis-backed set answers a batch in one pipeline instead of one round trip
per range.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

from xxhash import xxh3_128_intdigest

from yrelay.reconciliation.digest import Digest, DigestSet, xor_hashes

#: ``(lower, upper)``: ids ``x`` with ``lower <= x`` and (``upper`` is None or ``x < upper``).
Range = tuple[str, str | None]

WHOLE: Range = ("", None)


@dataclass(frozen=True, slots=True)
class Part:
    """One sub-range of a split range, with the digest of its ids."""

    lower: str
    upper: str | None
    digest: Digest


class IdSet(Protocol):
    """The reads reconciliation makes of one peer's set (both peers, both
    implementations). The set must not change while a reconciliation that
    reads it is running; the final digest check catches it if it did."""

    async def digest(self) -> Digest:
        """Count and hash of the whole set."""

    async def counts(self, ranges: Sequence[Range]) -> list[int]:
        """How many ids each range holds."""

    async def fingerprints(self, ranges: Sequence[Range]) -> list[Digest]:
        """Count and hash of each range."""

    async def parts(self, ranges: Sequence[Range], parts: int) -> list[list[Part]]:
        """Each range cut into ``min(parts, count)`` sub-ranges of about equal
        count (one empty part for an empty range), with their digests. Cut
        points are :func:`separator` bounds: the shortest prefix that still
        falls between two neighbouring ids, so they are short on the wire."""

    async def items(self, ranges: Sequence[Range], limit: int | None = None) -> list[list[str]]:
        """The sorted ids of each range, at most ``limit`` of each."""


def separator(before: str, after: str) -> str:
    """The shortest prefix ``p`` of ``after`` with ``before < p <= after``
    (given ``before < after``): a range bound between two neighbours."""
    return after[: common_prefix(before, after) + 1]


def common_prefix(left: Sequence[object], right: Sequence[object]) -> int:
    """How many leading items (characters, bytes) ``left`` and ``right`` share."""
    common = 0
    for a, b in zip(left, right, strict=False):
        if a != b:
            break
        common += 1
    return common


def cut_ranks(count: int, parts: int) -> list[int]:
    """Ranks (0-based, within the range) where each part after the first
    starts, for ``min(parts, count)`` parts of about equal size."""
    parts = min(parts, count)
    return [count * index // parts for index in range(1, parts)]


def cut(
    ids: Sequence[str], start: int, end: int, span: Range, parts: int, digest: Callable[[int, int], Digest]
) -> list[Part]:
    """``span``, whose sorted ids are ``ids[start:end]``, cut as
    :meth:`IdSet.parts` says; ``digest(i, j)`` is the digest of ``ids[i:j]``."""
    cuts = [start + rank for rank in cut_ranks(end - start, parts)]
    inner = [separator(ids[index - 1], ids[index]) for index in cuts]
    lowers: list[str] = [span[0], *inner]
    uppers: list[str | None] = [*inner, span[1]]
    edges = [start, *cuts, end]
    return [
        Part(lowers[index], uppers[index], digest(edges[index], edges[index + 1])) for index in range(len(edges) - 1)
    ]


def parts_of(ids: Sequence[str], span: Range, parts: int) -> list[Part]:
    """:meth:`IdSet.parts` of one range from its sorted ids, for a store that
    has to read them anyway."""
    return cut(ids, 0, len(ids), span, parts, lambda i, j: Digest(j - i, xor_hashes(ids[i:j])))


class MemoryIdSet:
    """An :class:`IdSet` in memory: a sorted list beside a prefix-XOR array.

    ``prefix[i]`` is the XOR of the hashes of the first ``i`` sorted ids, so
    a range's hash is ``prefix[j] ^ prefix[i]`` after two bisects: O(log n).
    A change invalidates the prefix array from its position on, and the next
    read rebuilds that tail; reconciliation runs between changes, so a burst
    of changes costs one rebuild (at most about 0.3 s for a million ids).
    """

    def __init__(self, items: Iterable[str] = ()):
        self._set = DigestSet(items)
        self._sorted = sorted(self._set)
        self._prefix: list[int] = [0]
        self._valid = 1  # prefix[:_valid] is up to date

    # -- changes -------------------------------------------------------------

    def add(self, items: Iterable[str]) -> int:
        """Add ids; returns how many were new."""
        new = [item for item in items if self._set.add(item)]
        if len(new) > 16:  # one sort of a mostly sorted list beats many inserts
            self._sorted.extend(new)
            self._sorted.sort()
            self._invalidate(bisect.bisect_left(self._sorted, min(new)))
        else:
            for item in new:
                position = bisect.bisect_left(self._sorted, item)
                self._sorted.insert(position, item)
                self._invalidate(position)
        return len(new)

    def remove(self, items: Iterable[str]) -> int:
        """Remove ids; returns how many were present."""
        removed = 0
        for item in items:
            if self._set.remove(item):
                position = bisect.bisect_left(self._sorted, item)
                del self._sorted[position]
                self._invalidate(position)
                removed += 1
        return removed

    def _invalidate(self, position: int) -> None:
        self._valid = min(self._valid, position + 1)

    def _prefixes(self) -> list[int]:
        size = len(self._sorted) + 1
        if self._valid < size or len(self._prefix) != size:
            valid = min(self._valid, size)
            del self._prefix[valid:]
            tail = map(xxh3_128_intdigest, map(str.encode, self._sorted[valid - 1 :]))
            self._prefix.extend(accumulate(tail, operator.xor, initial=self._prefix[-1]))
            del self._prefix[valid]  # accumulate repeats its initial value first
            self._valid = size
        return self._prefix

    # -- reads (IdSet) -------------------------------------------------------

    def __len__(self) -> int:
        return len(self._set)

    def __contains__(self, item: object) -> bool:
        return item in self._set

    def _indices(self, span: Range) -> tuple[int, int]:
        lower, upper = span
        start = bisect.bisect_left(self._sorted, lower) if lower else 0
        end = len(self._sorted) if upper is None else bisect.bisect_left(self._sorted, upper)
        return start, max(start, end)

    def _digest(self, start: int, end: int) -> Digest:
        prefix = self._prefixes()
        return Digest(end - start, prefix[end] ^ prefix[start])

    async def digest(self) -> Digest:
        return self._set.digest

    async def counts(self, ranges: Sequence[Range]) -> list[int]:
        return [end - start for start, end in map(self._indices, ranges)]

    async def fingerprints(self, ranges: Sequence[Range]) -> list[Digest]:
        return [self._digest(*self._indices(span)) for span in ranges]

    async def parts(self, ranges: Sequence[Range], parts: int) -> list[list[Part]]:
        return [cut(self._sorted, *self._indices(span), span, parts, self._digest) for span in ranges]

    async def items(self, ranges: Sequence[Range], limit: int | None = None) -> list[list[str]]:
        spans = [self._indices(span) for span in ranges]
        return [self._sorted[start : end if limit is None else min(end, start + limit)] for start, end in spans]
