"""The client side of a document's drift digest: which stream ids it holds.

A client holds the entries delivered to it and the entries its own updates
became (``appended`` names their ids), on top of a base it got whole: the
snapshot it started from, or the state a resync brought (``since``). Its
digest over ``(since, offset]`` must equal the server's over the same window
(:mod:`yrelay.reconciliation.stream_digest`); when the server's window starts
later (GC trimmed past ``since``), :meth:`HeldEntries.rebase` drops what the
server no longer counts.

Ids are kept individually, sorted, so the digest over any window above the
base is a running total minus the few ids past the window's end (its own
updates appended after the last delivery). Memory is bounded by ``max_ids``:
past it the oldest ids are dropped and the window starts later (the base
moves up). That is sound, since the window only has to cover the recent tail
a failover can lose; the server then reads the ids between its trim point
and the new base to leave them out, which GC keeps short.
"""

from __future__ import annotations

import bisect

from yrelay.reconciliation.digest import Digest, item_hash
from yrelay.storage.offsets import ZERO, StreamId

#: Ids a client keeps per document before its window's base moves up.
DEFAULT_MAX_IDS = 50_000


class HeldEntries:
    """De-duplicated stream ids above ``since``, with their running digest."""

    def __init__(self, since: StreamId = ZERO, max_ids: int = DEFAULT_MAX_IDS):
        self.since = since
        self.max_ids = max_ids
        self._ids: list[StreamId] = []
        self._hashes: dict[StreamId, int] = {}
        self._total = 0

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def last(self) -> StreamId:
        """The highest id held (``since`` when none is)."""
        return self._ids[-1] if self._ids else self.since

    def ids(self) -> list[StreamId]:
        """The held ids above ``since``, in order (what a client persists)."""
        return list(self._ids)

    def add(self, entry_id: StreamId) -> bool:
        """Count ``entry_id`` once (resent deliveries and duplicate acks
        repeat ids; XORing one twice would cancel it)."""
        if entry_id <= self.since or entry_id in self._hashes:
            return False
        value = item_hash(str(entry_id))
        self._hashes[entry_id] = value
        self._total ^= value
        if self._ids and entry_id < self._ids[-1]:
            bisect.insort(self._ids, entry_id)
        else:
            self._ids.append(entry_id)
        if len(self._ids) > self.max_ids:
            self.rebase(self._ids[len(self._ids) - self.max_ids - 1])
        return True

    def rebase(self, since: StreamId) -> None:
        """Forget ids at or below ``since``; the window now starts there."""
        if since <= self.since:
            return
        cut = bisect.bisect_right(self._ids, since)
        for entry_id in self._ids[:cut]:
            self._total ^= self._hashes.pop(entry_id)
        del self._ids[:cut]
        self.since = since

    def reset(self, since: StreamId) -> None:
        """After a resync to ``since``: the base is the server's state there,
        even if that is older than what the client held (a lost tail)."""
        self.rebase(since)
        self.since = since

    def digest(self, through: StreamId) -> Digest:
        """Count and hash of the held ids in ``(since, through]``."""
        cut = bisect.bisect_right(self._ids, through)
        value = self._total
        for entry_id in self._ids[cut:]:
            value ^= self._hashes[entry_id]
        return Digest(count=cut, hash=value)
