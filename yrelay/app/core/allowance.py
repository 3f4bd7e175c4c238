"""What one connection may still send: its session's update rate, its own
presence rate, and its subject's deployment-wide buckets and subscription
count (docs/operations.md#limits).

Over an update rate, or the answers a connection or its subject may be
sent, the connection waits (:meth:`.pacing.Pacer.hold`: its socket is read
more slowly) instead of refusing: a refused update would turn every update
of the same Yjs client behind it into ``missing_dependency`` (issue 30).
It is slowed for as long as it sends faster, never closed for it (the hard
bound of :mod:`.pacing` is for floods of frames). Over the presence
rate, an awareness update is refused with ``rate_limited`` (a dropped state
heals with its next renewal). The subject is the token's, or with auth off
the client's address; its buckets are acquired on first use and released
with the connection.
"""

from __future__ import annotations

from yrelay.app.core.pacing import Pacer
from yrelay.app.core.services import AllowanceServices
from yrelay.app.quotas import SharedBucket, SubjectBuckets
from yrelay.auth import NoAuthenticator, Principal
from yrelay.protocol import ErrorCode, ProtocolError, Update
from yrelay.storage.keys import subject_id
from yrelay.transport.buckets import TokenBucket


class Allowance:
    """One connection's rates and its share of its subject's quotas."""

    __slots__ = ("_services", "_address", "_principal", "_session", "_rate", "_presence_rate", "_subject", "pacer")

    def __init__(self, services: AllowanceServices, address: str):
        self._services = services
        self._address = address
        #: How fast the connection is read (every frame passes it first).
        self.pacer = Pacer(services.settings, services.metrics)
        self._principal: Principal | None = None
        self._session: str | None = None
        #: The session's update rate (shared with its other connections here).
        self._rate: TokenBucket | None = None
        #: Presence updates of this connection, all documents together.
        self._presence_rate = TokenBucket(services.settings.presence_per_second, services.settings.presence_burst)
        #: The subject's deployment-wide buckets (acquired on first use).
        self._subject: SubjectBuckets | None = None

    def open(self, session: str, principal: Principal) -> None:
        """``hello`` was answered: the session's rate applies from now on."""
        self._session, self._principal = session, principal
        self._rate = self._services.limits.sessions.acquire(session)
        self.pacer.trust()

    async def take_update(self, frame: Update) -> None:
        """One update's tokens: the session's, then the subject's, waiting
        for each (no Redis call for most updates: quotas.py)."""
        assert self._rate is not None
        while not self._rate.take():
            await self.pacer.hold(self._rate.retry_after_ms() / 1000, "session_updates", bounded=False)
        await self._wait_for(self.subject().updates, "subject_updates")

    async def take_answer(self) -> None:
        """A request whose answer may be larger than itself (a subscribe,
        a sync, an awareness query): a control token, and the connection's
        and the subject's answers paid for; waits for each."""
        await self.pacer.answer()
        await self._wait_for(self.subject().answers, "subject_answers")

    def answered(self, sent: int) -> None:
        """An answer of ``sent`` bytes to such a request went out."""
        self.pacer.charge(sent)
        if self._subject is not None or self._principal is not None:
            self.subject().answers.spend(-(-sent // 1024))  # KiB, rounded up

    async def _wait_for(self, bucket: SharedBucket, limit: str) -> None:
        while (wait := await bucket.take()) is not None:
            await self.pacer.hold(wait / 1000, limit, bounded=False)

    async def take_awareness(self, doc: str) -> None:
        """One awareness update's tokens, or ``rate_limited``."""
        settings = self._services.settings
        if not self._presence_rate.take():
            raise ProtocolError(
                ErrorCode.RATE_LIMITED,
                f"over {settings.presence_per_second:g} awareness updates/s on this connection",
                doc=doc,
                retry_after_ms=self._presence_rate.retry_after_ms(),
            )
        wait = await self.subject().presence.take()
        if wait is not None:
            raise ProtocolError(
                ErrorCode.RATE_LIMITED,
                f"over {settings.subject_presence_per_second:g} awareness "
                "updates/s for this user, all connections together",
                doc=doc,
                retry_after_ms=wait,
            )

    async def open_subscription(self, doc: str) -> None:
        """Count one more live subscription of the subject, or ``too_many_subscriptions``."""
        if not await self._services.limits.subjects.open_subscription(self.subject().subject):
            raise ProtocolError(
                ErrorCode.TOO_MANY_SUBSCRIPTIONS,
                f"at most {self._services.settings.max_subscriptions_per_subject} live subscriptions per user, "
                "all connections together; unsubscribe from some",
                doc=doc,
            )

    def close_subscription(self) -> None:
        self._services.limits.subjects.close_subscription(self.subject().subject)

    def subject(self) -> SubjectBuckets:
        """The deployment-wide limits of who is connected (docs/operations.md#limits)."""
        if self._subject is None:
            self._subject = self._services.limits.subjects.acquire(self.subject_id())
        return self._subject

    def subject_id(self) -> str:
        """Who is connected, wherever one user is counted or recognised (its
        limits, the owner of its presence clientIDs): the token's subject, or
        with auth off the client address as the server sees it (behind a
        ``trusted_proxies`` proxy, its ``X-Forwarded-For``): with no identity
        at all, the address is what stays the same when a client reconnects."""
        if isinstance(self._services.authenticator, NoAuthenticator) or self._principal is None:
            return subject_id("addr:" + self._address)
        return subject_id("sub:" + self._principal.subject)

    def release(self, subscriptions: int) -> None:
        """The connection ended with ``subscriptions`` live: give everything back."""
        limits = self._services.limits
        if self._rate is not None and self._session is not None:
            limits.sessions.release(self._session)
        if self._subject is not None:
            if subscriptions:
                limits.subjects.close_subscription(self._subject.subject, subscriptions)
            limits.subjects.release(self._subject.subject)
            self._subject = None
