"""An :class:`~yrelay.reconciliation.storage.IdSet` kept in Redis.

Two keys: a sorted set holding the ids, every score 0, so that Redis orders
them bytewise (UTF-8 bytewise is Python's str order, which the protocol
uses), and a hash holding the set's digest (``count``, ``hash`` as 32 hex
digits). ``idset_update.lua`` changes members and digest in one step, and
XORs only ids that really joined or left, so the stored digest is exact and
reading it is O(1). Redis cannot hash (no xxh3 in its Lua), so Python hashes
each id before sending it, and range fingerprints are computed here from the
ids of the range, read in pages.

In Redis Cluster the two keys must share a hash tag.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import cast

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from yrelay.reconciliation.digest import Digest, hash_hex, item_hash, xor_hashes
from yrelay.reconciliation.storage import WHOLE, Part, Range, parts_of
from yrelay.storage.replies import text
from yrelay.storage.scripts import Scripts

#: Ids per script call: bounds how long one call blocks Redis.
UPDATE_BATCH = 1_000
#: Ids per ZRANGEBYLEX read.
PAGE_SIZE = 10_000


def _lex(span: Range) -> tuple[str, str]:
    lower, upper = span
    return ("[" + lower) if lower else "-", "+" if upper is None else "(" + upper


class RedisIdSet:
    """A set of ids in Redis with a maintained digest (see the module doc)."""

    def __init__(self, redis: Redis, members_key: str, digest_key: str, scripts: Scripts | None = None):
        self.redis = redis
        self.members_key = members_key
        self.digest_key = digest_key
        self.scripts = scripts or Scripts(redis)

    # -- changes -------------------------------------------------------------

    async def add(self, items: Iterable[str]) -> int:
        """Add ids; returns how many were new. Members and digest change
        together (one script call per :data:`UPDATE_BATCH` ids)."""
        return await self._update("add", items)

    async def remove(self, items: Iterable[str]) -> int:
        """Remove ids; returns how many were present."""
        return await self._update("remove", items)

    async def _update(self, operation: str, items: Iterable[str]) -> int:
        listed = list(items)
        changed = 0
        for start in range(0, len(listed), UPDATE_BATCH):
            args = [operation]
            for item in listed[start : start + UPDATE_BATCH]:
                args += (item, hash_hex(item_hash(item)))
            reply = await self.scripts.idset_update(keys=[self.members_key, self.digest_key], args=args)
            changed += int(reply[0])
        return changed

    async def recompute(self, fix: bool = True, attempts: int = 10) -> tuple[Digest, Digest]:
        """Hash every member again; returns ``(stored, actual)`` digests.

        With ``fix``, a wrong stored digest is overwritten, inside a
        WATCH/MULTI on both keys so that a change made during the scan
        (which would make ``actual`` stale) aborts and the scan runs again."""
        for _ in range(attempts):
            async with self.redis.pipeline(transaction=True) as pipe:
                await pipe.watch(self.members_key, self.digest_key)
                stored = _digest(await pipe.hmget(self.digest_key, ["count", "hash"]))
                actual = (await self.fingerprints([WHOLE]))[0]
                if not fix or stored == actual:
                    return stored, actual
                _multi(pipe)
                pipe.hset(self.digest_key, mapping={"count": actual.count, "hash": hash_hex(actual.hash)})
                try:
                    await pipe.execute()
                except WatchError:
                    continue
                return stored, actual
        raise RuntimeError(f"{self.members_key} kept changing during {attempts} recomputes")

    # -- reads (IdSet) -------------------------------------------------------

    async def digest(self) -> Digest:
        return _digest(await self.redis.hmget(self.digest_key, ["count", "hash"]))

    async def counts(self, ranges: Sequence[Range]) -> list[int]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for span in ranges:
                pipe.zlexcount(self.members_key, *_lex(span))
            return [int(count) for count in await pipe.execute()]

    async def fingerprints(self, ranges: Sequence[Range]) -> list[Digest]:
        return [Digest(len(ids), xor_hashes(ids)) for ids in await self.items(ranges)]

    async def parts(self, ranges: Sequence[Range], parts: int) -> list[list[Part]]:
        return [parts_of(ids, span, parts) for ids, span in zip(await self.items(ranges), ranges, strict=True)]

    async def items(self, ranges: Sequence[Range], limit: int | None = None) -> list[list[str]]:
        """Pages of every range read in one pipeline per round: each range
        continues after its last id until it runs out or reaches ``limit``."""
        found: list[list[str]] = [[] for _ in ranges]
        cursors = [_lex(span) for span in ranges]
        todo = list(range(len(ranges)))
        while todo:
            wants = [PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - len(found[i])) for i in todo]
            async with self.redis.pipeline(transaction=False) as pipe:
                for index, want in zip(todo, wants, strict=True):
                    pipe.zrangebylex(self.members_key, *cursors[index], start=0, num=want)
                pages = await pipe.execute()
            more = []
            for index, want, page in zip(todo, wants, pages, strict=True):
                found[index] += map(text, page)
                if len(page) == want and (limit is None or len(found[index]) < limit):
                    cursors[index] = ("(" + found[index][-1], cursors[index][1])
                    more.append(index)
            todo = more
        return found


def _digest(fields: Sequence[bytes | str | None]) -> Digest:
    count, value = fields
    return Digest(int(count or 0), int(text(value), 16) if value else 0)


def _multi(pipe: Pipeline) -> None:
    """``pipe.multi()``, which redis-py's asyncio pipeline leaves untyped:
    typed here, once (it returns None, starting the queued transaction)."""
    cast(Callable[[], None], pipe.multi)()
