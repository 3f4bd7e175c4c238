"""Per-document drift digests: count + XOR of xxh3_128 over stream ids.

The server's digest of a document covers the entries its stream holds, the
ids in ``(trimmed_through, last_id]``. The count is the stream's length. The
hash is kept in the meta hash as ``digest_hash`` over ``(trimmed_through,
digest_through]``; entries appended after ``digest_through`` are in the stream
but not hashed yet. That split is what makes the digest exact at every
instant without hashing in Lua (Redis has no xxh3): an append changes nothing
but the stream (the unhashed tail grows), a trim XORs the removed ids out in
the same script that removes them (``gc_trim.lua``, with hashes computed
here), and whoever reads the tail hashes it and folds it in with a
compare-and-set (``digest_advance.lua``). Resubscribes and
``--verify-digests`` do that; a trim XORs out the ids it removes whether
they were folded in yet or not.

A client's digest covers the ids it holds in a window ``(since, offset]``;
:meth:`StreamDigests.window` computes the server's digest over the same
window from the stored one by XORing out what lies outside it, which the
client's catch-up reads anyway.

Only server-assigned stream ids are hashed, each entry once: XOR is linear
and duplicates cancel, so ids a client chose, or counted twice, could hide
drift (see docs/reconciliation.md).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.typing import EncodableT

from yrelay.reconciliation.digest import Digest, hash_hex, item_hash, xor_hashes
from yrelay.storage.keys import meta_key, stream_key
from yrelay.storage.listing import all_documents
from yrelay.storage.offsets import ZERO, StreamId
from yrelay.storage.replies import stream_entries, stream_id, text
from yrelay.storage.scripts import Scripts

log = logging.getLogger(__name__)

#: Most entries the window script may read (it blocks Redis meanwhile: about
#: 35 ms for 20,000 entries of 1 KB). Past it the window is not compared and
#: the client resyncs; an unhashed tail is folded in pages first, uncapped.
WINDOW_ID_CAP = 20_000
ZERO_HASH = "0" * 32


@dataclass(frozen=True)
class WindowDigest:
    """A digest over the entries in ``(since, offset]`` and the session's own
    entries in ``(offset, through]`` (``through`` defaults to ``offset``)."""

    since: StreamId
    offset: StreamId
    digest: Digest
    through: StreamId | None = None

    @property
    def end(self) -> StreamId:
        return max(self.through or self.offset, self.offset)

    def to_wire(self) -> dict[str, object]:
        wire: dict[str, object] = {"since": str(self.since), **self.digest.to_wire()}
        if self.end > self.offset:
            wire["through"] = str(self.end)
        return wire


@dataclass(frozen=True)
class DigestCheck:
    """The outcome of recomputing one document's stored digest."""

    doc: str
    stored: str
    actual: str
    fixed: bool

    @property
    def wrong(self) -> bool:
        return self.stored != self.actual


class StreamDigests:
    """Reads, advances and verifies the drift digests of documents."""

    def __init__(self, redis: Redis, scripts: Scripts | None = None, *, cap: int = WINDOW_ID_CAP):
        self.redis = redis
        self.scripts = scripts or Scripts(redis)
        self.cap = cap

    async def window(
        self, doc: str, since: StreamId, offset: StreamId, through: StreamId | None = None, session: str = ""
    ) -> WindowDigest | None:
        """The server's digest over ``(max(since, trimmed_through), offset]``,
        plus ``session``'s own entries in ``(offset, through]``.

        None when more than ``cap`` ids would have to be hashed. Also folds the
        unhashed tail into the stored digest (best effort: a concurrent trim
        wins, and the next reader folds it)."""
        args: list[EncodableT] = [str(since), str(offset), self.cap, str(max(through or offset, offset)), session]
        raw = await self.scripts.digest_window(keys=[stream_key(doc), meta_key(doc)], args=args)
        if not int(raw[-1]) and await self.advance(doc):  # a long unhashed tail: fold it in pages, then retry
            raw = await self.scripts.digest_window(keys=[stream_key(doc), meta_key(doc)], args=args)
        base_raw, through_raw, stored_raw, last_raw, length, unhashed, below, above, own, complete = raw
        if not int(complete):
            return None
        base, stored = stream_id(base_raw) or ZERO, text(stored_raw)
        total = int(stored, 16) ^ xor_hashes(map(text, unhashed))
        if unhashed:
            await self._advance(doc, base_raw, through_raw, stored, text(unhashed[-1]), total)
        outside = [text(entry_id) for entry_id in (*below, *above)]
        held_own = [text(entry_id) for entry_id in own]
        digest = Digest(
            count=int(length) - len(outside) + len(held_own), hash=total ^ xor_hashes(outside) ^ xor_hashes(held_own)
        )
        return WindowDigest(max(base, since), offset, digest, through)

    async def _advance(self, doc: str, base: bytes, through: bytes, stored: str, new_through: str, total: int) -> bool:
        applied = await self.scripts.digest_advance(
            keys=[meta_key(doc)], args=[text(base), text(through), stored, new_through, hash_hex(total)]
        )
        return bool(int(applied))

    async def advance(self, doc: str, page_size: int = 1000) -> bool:
        """Fold the whole unhashed tail into the stored digest, a page at a
        time (no cap, nothing held in Redis for long); True if it moved."""
        base, through, stored = await self._state(doc)
        total, last = int(stored, 16), through
        async for ids in self._ids_after(doc, through, page_size):
            total ^= xor_hashes(ids)
            last = StreamId.parse(ids[-1])
        if last == through:
            return False
        return await self._advance(doc, str(base).encode(), str(through).encode(), stored, str(last), total)

    async def recompute(self, doc: str, fix: bool = True, page_size: int = 1000) -> DigestCheck:
        """Hash every id in the stream again and compare with the stored digest.

        Fixes a wrong one (and folds the unhashed tail) with the same
        compare-and-set as readers use, retrying if a trim ran meanwhile."""
        while True:
            base, through, stored = await self._state(doc)
            actual, total, last = 0, 0, base
            async for ids in self._ids_after(doc, base, page_size):
                for entry_id in ids:
                    value = item_hash(entry_id)
                    total ^= value
                    if StreamId.parse(entry_id) <= through:
                        actual ^= value
                last = StreamId.parse(ids[-1])
            check = DigestCheck(doc, stored, hash_hex(actual), fixed=False)
            if not fix or (not check.wrong and last == through):
                return check
            new_through = max(last, through)
            if await self._advance(doc, str(base).encode(), str(through).encode(), stored, str(new_through), total):
                return DigestCheck(doc, stored, hash_hex(actual), fixed=check.wrong)

    async def _state(self, doc: str) -> tuple[StreamId, StreamId, str]:
        """(base, through, hash) normalised as ``digest_state`` in the Lua prelude."""
        base_raw, through_raw, hash_raw = await self.redis.hmget(
            meta_key(doc), ["trimmed_through", "digest_through", "digest_hash"]
        )
        base = stream_id(base_raw) or ZERO
        through = stream_id(through_raw) or base
        if through <= base:
            return base, base, ZERO_HASH
        return base, through, text(hash_raw) if hash_raw else ZERO_HASH

    async def _ids_after(self, doc: str, after: StreamId, page_size: int) -> AsyncIterator[list[str]]:
        cursor = str(after)
        while True:
            page = stream_entries(await self.redis.xrange(stream_key(doc), min=f"({cursor}", max="+", count=page_size))
            if not page:
                return
            ids = [text(entry_id) for entry_id, _ in page]
            yield ids
            cursor = ids[-1]

    async def recompute_all(self, fix: bool = True, page_size: int = 1000) -> list[DigestCheck]:
        """:meth:`recompute` for every document in the registry; returns the
        checks that found a wrong digest."""
        wrong: list[DigestCheck] = []
        async for docs in all_documents(self.redis, page_size):
            for doc in docs:
                check = await self.recompute(doc, fix=fix)
                if check.wrong:
                    log.warning(
                        "drift digest of %s was wrong (stored %s, actual %s)%s",
                        doc,
                        check.stored,
                        check.actual,
                        "; fixed" if check.fixed else "",
                        extra={"doc": doc},
                    )
                    wrong.append(check)
        return wrong
