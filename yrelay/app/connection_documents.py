"""The documents one connection is subscribed to: ``subscribe`` (the
document's limits, its presence member, a :class:`.Subscription` that
delivers it), ``unsubscribe`` (which also stops tracking the session), and
the lookups every other frame about a document goes through (``not_subscribed``
otherwise). The connection holds one of these and calls it one way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from yrelay import protocol
from yrelay.app.allowance import Allowance
from yrelay.app.connection_presence import ConnectionPresence
from yrelay.app.context import ServerContext
from yrelay.app.limits import DeliveryBudget
from yrelay.app.sending import SendPrepared
from yrelay.app.subscription import Send, Subscription, SubscriptionState
from yrelay.auth import Principal
from yrelay.protocol import ErrorCode, ProtocolError, Subscribe, Unsubscribe
from yrelay.reconciliation.digest import Digest
from yrelay.reconciliation.stream_digest import WindowDigest
from yrelay.storage.offsets import StreamId

SendFrame = Callable[[dict[str, Any] | str], Awaitable[None]]
#: Frames that answer a subscribe or a sync with a document's content: their
#: bytes are booked against the connection's and the subject's answer rates.
_ANSWER_OPS = frozenset({"snapshot", "sync_reply"})


class ConnectionDocuments:
    """``send`` is the connection's; a subscription's frames go through it
    and then tell presence that the subscribe was answered."""

    __slots__ = ("_ctx", "_allowance", "_presence", "_send", "_send_prepared", "subscriptions", "budget")

    def __init__(
        self,
        ctx: ServerContext,
        allowance: Allowance,
        presence: ConnectionPresence,
        send: SendFrame,
        send_prepared: SendPrepared | None = None,
    ):
        self._ctx = ctx
        self._allowance = allowance
        self._presence = presence
        self._send = send
        #: Writes a deliver frame framed once for many sockets now (False: it cannot).
        self._send_prepared = send_prepared
        self.subscriptions: dict[str, Subscription] = {}
        #: Unacked deliveries of all this connection's documents.
        self.budget = DeliveryBudget(ctx.settings.max_unacked_per_connection)

    def __len__(self) -> int:
        return len(self.subscriptions)

    def get(self, doc: str, clock: int | None = None) -> Subscription:
        """The subscription to ``doc``; a frame about any other document is refused."""
        subscription = self.subscriptions.get(doc)
        if subscription is None:
            raise ProtocolError(ErrorCode.NOT_SUBSCRIBED, "subscribe to the document first", doc=doc, clock=clock)
        return subscription

    async def subscribe(self, frame: Subscribe, session: str, principal: Principal) -> None:
        if not principal.can_read(frame.doc):
            raise ProtocolError(ErrorCode.FORBIDDEN, "this token does not allow this document", doc=frame.doc)
        requested = StreamId.parse(frame.offset) if frame.offset is not None else None
        claimed = _claimed(frame)
        old = self.subscriptions.pop(frame.doc, None)
        if old is not None:
            await old.close()
        elif len(self.subscriptions) >= self._ctx.settings.max_docs_per_connection:
            raise ProtocolError(
                ErrorCode.MALFORMED_FRAME,
                f"at most {self._ctx.settings.max_docs_per_connection} documents per connection",
                doc=frame.doc,
            )
        else:
            await self._allowance.open_subscription(frame.doc)
        self._presence.join(frame.doc, session)
        subscription = Subscription(
            self._ctx,
            frame.doc,
            session,
            self._document_sender(frame.doc),
            requested,
            claimed,
            budget=self.budget,
            on_deleted=partial(self._deleted, frame.doc),
            send_prepared=self._send_prepared,
        )  # not a lambda: it would keep the frame
        self.subscriptions[frame.doc] = subscription
        subscription.start()

    async def unsubscribe(self, frame: Unsubscribe, session: str) -> None:
        subscription = self.subscriptions.pop(frame.doc, None)
        if subscription is not None:
            await subscription.close()
            self._allowance.close_subscription()
        await self._presence.leave(frame.doc)
        await self._ctx.tracker.untrack(frame.doc, session)
        await self._send(protocol.unsubscribed(frame.doc))

    async def _deleted(self, doc: str) -> None:
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
        quick reconnect resumes from its offset."""
        for subscription in list(self.subscriptions.values()):
            await subscription.close()

    def _document_sender(self, doc: str) -> Send:
        """The subscription's send, which greets the connection's presence
        on ``doc`` once the subscribe is answered (the states of the others
        follow `subscribed` or `resync_required`, never precede it), and
        books the answer to a subscribe (its snapshot and catch-up up to
        ``synced``) or to a sync against the connection's answer rates."""

        async def send(frame: dict[str, Any] | str) -> None:
            await self._send(frame)
            if isinstance(frame, dict):  # a str is a delivery encoded once for many
                self._presence.sent(doc, frame)
            subscription = self.subscriptions.get(doc)
            if (subscription is not None and subscription.answering) or (
                isinstance(frame, dict) and frame["op"] in _ANSWER_OPS
            ):
                self._allowance.answered(_payload_bytes(frame))

        return send


def _payload_bytes(frame: dict[str, Any] | str) -> int:
    """What a frame carries of a document (a delivery encoded once: all of it)."""
    if isinstance(frame, str):
        return len(frame)
    if "update" in frame:
        return len(frame["update"])
    return sum(len(entry["update"]) for entry in frame.get("entries", ()))


def _claimed(frame: Subscribe) -> WindowDigest | None:
    """The client's drift digest, meaningful only with an offset to end its window."""
    if frame.digest is None or frame.offset is None:
        return None
    since, offset = StreamId.parse(frame.digest.since), StreamId.parse(frame.offset)
    through = StreamId.parse(frame.digest.through) if frame.digest.through is not None else offset
    if since > offset or through < offset:
        raise ProtocolError(ErrorCode.INVALID_OFFSET, "digest needs since <= offset <= through", doc=frame.doc)
    digest = Digest(count=frame.digest.count, hash=int(frame.digest.hash, 16))
    return WindowDigest(since, offset, digest, through)
