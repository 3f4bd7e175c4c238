"""One connection's presence: a member of the process's relay
(:mod:`.presence`) per subscribed document, and the awareness updates it
sends. Presence is never stored in a document's stream; an update over a
limit (rates, ``max_awareness_bytes``, clientIDs per connection, clientIDs
another subject owns) is an ``error`` frame and nothing is stored or relayed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from yrelay.app.allowance import Allowance
from yrelay.app.context import ServerContext
from yrelay.app.payloads import decode_limited
from yrelay.app.presence import Member, NotOwner, PresenceFull
from yrelay.protocol import Awareness, ErrorCode, ProtocolError
from yrelay.yjs import awareness

#: Frames that answer a subscribe; presence greets the connection after them.
_ANSWERS = frozenset({"subscribed", "resync_required"})

SendFrame = Callable[[dict[str, Any]], Awaitable[None]]
Spawn = Callable[[Coroutine[Any, Any, None]], None]


class ConnectionPresence:
    """``send`` relays the others' states to this connection; ``spawn`` runs
    a greeting as a task the connection cancels when it closes."""

    __slots__ = ("_ctx", "_allowance", "_send", "_spawn", "members")

    def __init__(self, ctx: ServerContext, allowance: Allowance, send: SendFrame, spawn: Spawn):
        self._ctx = ctx
        self._allowance = allowance
        self._send = send
        self._spawn = spawn
        self.members: dict[str, Member] = {}

    def join(self, doc: str, session: str) -> None:
        """Subscribing to ``doc``: a member, greeted once the subscribe is
        answered. Its owner, who may take its clientIDs over, is its subject:
        the token's, or with auth off the client address
        (:meth:`.allowance.Allowance.subject_id`), so a client reconnecting
        after a server restart, a new session, gets its clientID back."""
        member = self.members.get(doc)
        if member is None:
            self.members[doc] = self._ctx.presence.join(doc, session, self._send, self._allowance.subject_id())
        else:
            member.listening = False  # subscribing again: greeted again once answered

    def sent(self, doc: str, frame: dict[str, Any] | str) -> None:
        """A frame of ``doc``'s subscription went out: after the answer to
        the subscribe come the states of the others, never before it."""
        member = self.members.get(doc)
        if member is not None and not member.listening and isinstance(frame, dict) and frame["op"] in _ANSWERS:
            self._spawn(self.greet(member))

    async def greet(self, member: Member) -> None:
        """Send ``member`` the others' states; their bytes count as an answer
        of the connection (:meth:`.allowance.Allowance.answered`)."""
        self._allowance.answered(await self._ctx.presence.greet(member))

    async def leave(self, doc: str) -> None:
        member = self.members.pop(doc, None)
        if member is not None:
            await self._ctx.presence.leave(member)

    async def leave_all(self) -> None:
        """The connection closed: its clientIDs are removed for the others."""
        for member in list(self.members.values()):
            await self._ctx.presence.leave(member)

    async def receive(self, frame: Awareness) -> None:
        """Relay a presence update of a subscribed document."""
        settings = self._ctx.settings
        await self._allowance.take_awareness(frame.doc)
        data = decode_limited(
            frame.update, settings.max_awareness_bytes, ErrorCode.AWARENESS_TOO_LARGE, frame.doc, None
        )
        await self.receive_update(frame.doc, data)

    async def receive_update(self, doc: str, data: bytes) -> None:
        """Relay the awareness update ``data`` (rates taken, size checked) of ``doc``."""
        settings = self._ctx.settings
        try:
            entries = awareness.decode_update(data)
        except awareness.AwarenessError as exc:
            raise ProtocolError(ErrorCode.MALFORMED_FRAME, f"awareness update: {exc}", doc=doc) from None
        member = self.members[doc]
        if member.clients_after(entries) > settings.max_presence_clients_per_connection:
            raise ProtocolError(
                ErrorCode.AWARENESS_TOO_MANY_CLIENTS,
                f"at most {settings.max_presence_clients_per_connection} clientIDs per connection and document",
                doc=doc,
            )
        try:
            await self._ctx.presence.update(member, entries)
        except NotOwner as exc:
            raise ProtocolError(ErrorCode.AWARENESS_NOT_OWNER, str(exc), doc=doc) from None
        except PresenceFull as exc:
            raise ProtocolError(ErrorCode.AWARENESS_TOO_MANY_CLIENTS, str(exc), doc=doc) from None
