"""The documents one connection is subscribed to: ``subscribe`` (the
document's limits, its presence member, a :class:`.Subscription` that
delivers it), ``unsubscribe`` (which also stops tracking the session), and
the lookups every other frame about a document goes through (``not_subscribed``
otherwise). The connection holds one of these and calls it one way.
"""

from __future__ import annotations

from yrelay.app.core.allowance import Allowance
from yrelay.app.core.peer import Peer
from yrelay.app.core.presence import ConnectionPresence
from yrelay.app.core.services import ReadServices
from yrelay.app.core.subscription import Subscription, SubscriptionState
from yrelay.app.limits import DeliveryBudget
from yrelay.auth import Principal
from yrelay.protocol import ErrorCode, ProtocolError
from yrelay.reconciliation.stream_digest import WindowDigest
from yrelay.storage.offsets import ZERO, StreamId


class ConnectionDocuments:
    """``peer`` is the connection's codec: every subscription speaks to the
    client through it (:class:`.peer.Peer`). ``tracked`` and
    ``deliver_now`` are the endpoint's policy (:class:`.peer.Codec`)."""

    __slots__ = ("_services", "_allowance", "_presence", "_peer", "_tracked", "_deliver_now", "subscriptions", "budget")

    def __init__(
        self,
        services: ReadServices,
        allowance: Allowance,
        presence: ConnectionPresence,
        peer: Peer,
        *,
        tracked: bool = True,
        deliver_now: bool = False,
    ):
        self._services = services
        self._allowance = allowance
        self._presence = presence
        self._peer = peer
        self._tracked = tracked
        self._deliver_now = deliver_now
        self.subscriptions: dict[str, Subscription] = {}
        #: Unacked deliveries of all this connection's documents.
        self.budget = DeliveryBudget(services.settings.max_unacked_per_connection)

    def __len__(self) -> int:
        return len(self.subscriptions)

    def get(self, doc: str, clock: int | None = None) -> Subscription:
        """The subscription to ``doc``; a frame about any other document is refused."""
        subscription = self.subscriptions.get(doc)
        if subscription is None:
            raise ProtocolError(ErrorCode.NOT_SUBSCRIBED, "subscribe to the document first", doc=doc, clock=clock)
        return subscription

    async def subscribe(
        self,
        doc: str,
        session: str,
        principal: Principal,
        requested: StreamId | None = None,
        claimed: WindowDigest | None = None,
    ) -> None:
        """Deliver ``doc`` to this connection from ``requested`` on (with the
        client's drift digest ``claimed``), in place of any subscription to
        it; the document's limits first."""
        if not principal.can_read(doc):
            raise ProtocolError(ErrorCode.FORBIDDEN, "this token does not allow this document", doc=doc)
        old = self.subscriptions.pop(doc, None)
        if old is not None:
            await old.close()
        elif len(self.subscriptions) >= self._services.settings.max_docs_per_connection:
            raise ProtocolError(
                ErrorCode.MALFORMED_FRAME,
                f"at most {self._services.settings.max_docs_per_connection} documents per connection",
                doc=doc,
            )
        else:
            await self._allowance.open_subscription(doc)
        self._presence.join(doc, session)
        subscription = Subscription(
            self._services,
            doc,
            session,
            self._peer,
            requested,
            claimed,
            budget=self.budget,
            owner=self,
            tracked=self._tracked,
            deliver_now=self._deliver_now,
        )
        self.subscriptions[doc] = subscription
        subscription.start()

    async def unsubscribe(self, doc: str, session: str) -> None:
        subscription = self.subscriptions.pop(doc, None)
        if subscription is not None:
            await subscription.close()
            self._allowance.close_subscription()
        await self._presence.leave(doc)
        if self._tracked:
            await self._services.tracker.untrack(doc, session)
        await self._peer.unsubscribed(doc)

    def answered(self, doc: str) -> None:
        """``doc``'s subscribe was answered: its presence greets the client."""
        self._presence.answered(doc)

    def booked(self, nbytes: int) -> None:
        """A subscription's answer bytes, against the connection's and the subject's answer rates."""
        self._allowance.answered(nbytes)

    async def deleted(self, doc: str) -> None:
        """The subscription to ``doc`` ended: the document was deleted."""
        subscription = self.subscriptions.get(doc)
        if subscription is not None and subscription.state is SubscriptionState.CLOSED:
            del self.subscriptions[doc]
            self._allowance.close_subscription()
            await self._presence.leave(doc)

    def check_resends(self) -> None:
        for subscription in list(self.subscriptions.values()):
            subscription.check_resend()

    async def close(self) -> None:
        """Stop delivering, locally only: the session stays tracked, so a
        quick reconnect resumes from its offset (but see :meth:`forget_empty`)."""
        for subscription in list(self.subscriptions.values()):
            await subscription.close()

    async def forget_empty(self, session: str) -> None:
        """The connection ended: stop tracking ``session`` in the documents
        nothing was ever written to. There is nothing to resume in them, and
        GC, which visits only documents with entries, would never drop the
        tracking: every page that opened an empty document and closed left a
        tracker entry and a session-set member in Redis for good, and one
        read-only token could leave thousands a minute (issue 36). A
        reconnecting client subscribes again at 0-0 and is tracked again."""
        # A cursor past 0-0: the document held entries (no Redis read for those).
        maybe_empty = [doc for doc, subscription in self.subscriptions.items() if subscription.cursor == ZERO]
        if self._tracked and maybe_empty:
            empty = await self._services.store.never_written(maybe_empty)
            if empty:
                await self._services.tracker.untrack_all(empty, session)
