"""What one connection may still send: its session's update rate, its own
presence rate, and its subject's deployment-wide buckets and subscription
count (docs/operations.md#limits).

Over a rate, the frame is refused with ``rate_limited`` and the time to wait;
nothing is stored or relayed. The subject is the token's, or with auth off
the client's address; its buckets are acquired on first use and released
with the connection.
"""

from __future__ import annotations

from ..auth import NoAuthenticator, Principal
from ..keys import subject_id
from ..protocol import AnyUpdate, ErrorCode, ProtocolError
from .context import ServerContext
from .limits import TokenBucket
from .quotas import SubjectBuckets


class Allowance:
    """One connection's rates and its share of its subject's quotas."""

    __slots__ = ("_ctx", "_address", "_principal", "_session", "_rate", "_presence_rate", "_subject")

    def __init__(self, ctx: ServerContext, address: str):
        self._ctx = ctx
        self._address = address
        self._principal: Principal | None = None
        self._session: str | None = None
        #: The session's update rate (shared with its other connections here).
        self._rate: TokenBucket | None = None
        #: Presence updates of this connection, all documents together.
        self._presence_rate = TokenBucket(ctx.settings.presence_per_second, ctx.settings.presence_burst)
        #: The subject's deployment-wide buckets (acquired on first use).
        self._subject: SubjectBuckets | None = None

    def open(self, session: str, principal: Principal) -> None:
        """``hello`` was answered: the session's rate applies from now on."""
        self._session, self._principal = session, principal
        self._rate = self._ctx.limits.sessions.acquire(session)

    async def take_update(self, frame: AnyUpdate) -> None:
        """One update's tokens, or ``rate_limited`` (the client resends after
        ``retry_after_ms``). No Redis call for most updates: quotas.py."""
        settings = self._ctx.settings
        assert self._rate is not None
        if not self._rate.take():
            raise ProtocolError(ErrorCode.RATE_LIMITED, f"over {settings.updates_per_second:g} updates/s",
                                doc=frame.doc, clock=frame.clock, retry_after_ms=self._rate.retry_after_ms())
        wait = await self.subject().updates.take()
        if wait is not None:
            raise ProtocolError(ErrorCode.RATE_LIMITED, f"over {settings.subject_updates_per_second:g} "
                                "updates/s for this user, all connections together", doc=frame.doc, clock=frame.clock,
                                retry_after_ms=wait)

    async def take_awareness(self, doc: str) -> None:
        """One awareness update's tokens, or ``rate_limited``."""
        settings = self._ctx.settings
        if not self._presence_rate.take():
            raise ProtocolError(ErrorCode.RATE_LIMITED, f"over {settings.presence_per_second:g} awareness updates/s "
                                "on this connection", doc=doc, retry_after_ms=self._presence_rate.retry_after_ms())
        wait = await self.subject().presence.take()
        if wait is not None:
            raise ProtocolError(ErrorCode.RATE_LIMITED, f"over {settings.subject_presence_per_second:g} awareness "
                                "updates/s for this user, all connections together", doc=doc, retry_after_ms=wait)

    async def open_subscription(self, doc: str) -> None:
        """Count one more live subscription of the subject, or ``too_many_subscriptions``."""
        if not await self._ctx.limits.subjects.open_subscription(self.subject().subject):
            raise ProtocolError(ErrorCode.TOO_MANY_SUBSCRIPTIONS, f"at most "
                                f"{self._ctx.settings.max_subscriptions_per_subject} live subscriptions per user, "
                                "all connections together; unsubscribe from some", doc=doc)

    def close_subscription(self) -> None:
        self._ctx.limits.subjects.close_subscription(self.subject().subject)

    def subject(self) -> SubjectBuckets:
        """The deployment-wide limits of who is connected: the token's
        subject, or with auth off the client address (docs/operations.md#limits)."""
        if self._subject is None:
            if isinstance(self._ctx.authenticator, NoAuthenticator) or self._principal is None:
                identity = "addr:" + self._address
            else:
                identity = "sub:" + self._principal.subject
            self._subject = self._ctx.limits.subjects.acquire(subject_id(identity))
        return self._subject

    def release(self, subscriptions: int) -> None:
        """The connection ended with ``subscriptions`` live: give everything back."""
        limits = self._ctx.limits
        if self._rate is not None and self._session is not None:
            limits.sessions.release(self._session)
        if self._subject is not None:
            if subscriptions:
                limits.subjects.close_subscription(self._subject.subject, subscriptions)
            limits.subjects.release(self._subject.subject)
            self._subject = None
