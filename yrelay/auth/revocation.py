"""Revoked tokens, shared by every server process through Redis.

A sorted set maps each revoked token id (the JWT ``jti``) to the time the
token would be refused anyway (its ``exp`` plus the ``auth_leeway`` that
``hello`` grants), so entries purge themselves once they no longer matter,
and never earlier. A revocation of a token that is refused already is an
error (:class:`AlreadyExpired`), not a silent no-op. Every process keeps a copy, refreshed every few seconds, and
its connections check their token against it: a revoked session is cut off
within about one refresh interval, without a Redis call per frame.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import cast

from redis.asyncio import Redis

from yrelay.storage.keys import revoked_tokens_key
from yrelay.storage.replies import text
from yrelay.tasks import BackgroundTask, lost_redis, wait_event

log = logging.getLogger(__name__)

#: How long a revocation is kept when the token's expiry is not known.
DEFAULT_KEEP = 30 * 24 * 3600.0


class AlreadyExpired(ValueError):
    """The token's ``exp`` (plus the leeway) has passed: it is refused
    already, and a revocation of it would be purged at once."""


class Revocations:
    def __init__(self, redis: Redis, refresh_interval: float = 2.0, leeway: float = 5.0):
        self.redis = redis
        self.refresh_interval = refresh_interval
        #: Seconds tokens are accepted past ``exp`` (``Settings.auth_leeway``).
        self.leeway = leeway
        self._revoked: frozenset[str] = frozenset()
        self._loop = BackgroundTask("yrelay-revocations", self._run)
        self._stopping = asyncio.Event()

    async def revoke(self, token_id: str, expires_at: float | None = None) -> None:
        """Revoke ``token_id`` everywhere, until ``expires_at`` (the token's
        ``exp``) plus the leeway; without ``expires_at``, for ``DEFAULT_KEEP``."""
        now = time.time()
        until = expires_at + self.leeway if expires_at is not None else now + DEFAULT_KEEP
        if until <= now:
            raise AlreadyExpired(
                f"the token expired at {expires_at:.0f} (+{self.leeway:g} s leeway) "
                "and is refused already; nothing to revoke"
            )
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zadd(revoked_tokens_key(), {token_id: until})
            pipe.zremrangebyscore(revoked_tokens_key(), "-inf", now)
            await pipe.execute()
        self._revoked = self._revoked | {token_id}

    def is_revoked(self, token_id: str | None) -> bool:
        return token_id is not None and token_id in self._revoked

    async def refresh(self) -> None:
        members = cast("list[bytes | str]", await self.redis.zrangebyscore(revoked_tokens_key(), time.time(), "+inf"))
        self._revoked = frozenset(text(m) for m in members)

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        """Let the loop finish its refresh and return (no cancel: a cancel that
        lands inside a Redis call can be swallowed by the client library)."""
        self._stopping.set()
        await self._loop.stop(cancel=False)

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.refresh()
            except Exception as exc:
                if not lost_redis(exc):  # a master killed under a cluster client can raise inside redis-py
                    raise
                log.warning("could not refresh revoked tokens (keeping the last list): %r", exc)
            await wait_event(self._stopping, self.refresh_interval)
