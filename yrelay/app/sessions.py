"""Session ids: issued by the server, resumable across reconnects and processes.

A session is the identity of one client replica (one Y.Doc set in one tab):
the tracker tracks it, origin filtering skips its own entries, and
de-duplication keys resent updates by (session, clock). The id is a 144-bit
random token; the server remembers it in Redis for ``session_ttl`` seconds
after its last connection, so any process can resume it.

A session belongs to the subject that opened it: another subject presenting
the id gets a new session instead, so a leaked session id alone does not let
anyone read a stranger's place in a document or resend as them.
"""

from __future__ import annotations

import secrets

from redis.asyncio import Redis

from yrelay.storage.keys import SESSION_ID_PATTERN, session_key


class SessionRegistry:
    def __init__(self, redis: Redis, ttl: int):
        self.redis = redis
        self.ttl = ttl

    async def open(self, requested: str | None, owner: str) -> tuple[str, bool]:
        """Resume ``requested`` if the server issued it to ``owner`` and it has
        not expired; otherwise issue a new id. Returns ``(session id, resumed)``."""
        if requested and SESSION_ID_PATTERN.fullmatch(requested):
            key = session_key(requested)
            if await self.redis.get(key) == owner.encode() and await self.redis.expire(key, self.ttl):
                return requested, True
        session = secrets.token_urlsafe(18)
        await self.redis.set(session_key(session), owner.encode(), ex=self.ttl)
        return session, False
