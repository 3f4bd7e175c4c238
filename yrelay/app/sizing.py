"""How many entries to ask Redis for, so one stream read stays near a byte
budget. XRANGE and XREAD count entries, not bytes: a read sized for typing
(500 entries of 30 bytes) would be 500 MB of pastes. Reads start small and
grow (x4 a read) while the entries are small; the largest entry of the last
read sets the ceiling."""

from __future__ import annotations

from collections.abc import Sequence

from yrelay.storage.reads import Entry

#: The largest update a read may meet before it has seen one (bytes).
FIRST_GUESS = 256 * 1024


def first_count(max_count: int, max_bytes: int) -> int:
    return max(1, min(max_count, max_bytes // FIRST_GUESS))


def next_count(count: int, entries: Sequence[Entry], max_count: int, max_bytes: int) -> int:
    if not entries:
        return count
    largest = max(len(entry.update) for entry in entries)
    return max(1, min(max_count, max_bytes // max(largest, 1), count * 4))
