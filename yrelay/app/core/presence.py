"""One connection's presence: a member of the process's relay
(:mod:`yrelay.app.presence`) per subscribed document, and the awareness updates it
sends. Presence is never stored in a document's stream; an update over a
limit (rates, ``max_awareness_bytes``, clientIDs per connection, clientIDs
another subject owns) is an ``error`` frame and nothing is stored or relayed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from yrelay.app.core.allowance import Allowance
from yrelay.app.core.peer import Peer
from yrelay.app.presence import Member, NotOwner, Presence, PresenceFull
from yrelay.config import Settings
from yrelay.protocol import ErrorCode, ProtocolError
from yrelay.yjs import awareness

Spawn = Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]


class ConnectionPresence:
    """``peer`` is told the others' states; ``spawn`` runs a greeting as a
    task the connection cancels when it closes."""

    __slots__ = ("_relay", "_settings", "_allowance", "_peer", "_spawn", "members", "_greeting")

    def __init__(self, relay: Presence, settings: Settings, allowance: Allowance, peer: Peer, spawn: Spawn):
        self._relay = relay
        self._settings = settings
        self._allowance = allowance
        self._peer = peer
        self._spawn = spawn
        self.members: dict[str, Member] = {}
        #: The greeting answering an awareness query, while it runs: queries
        #: meanwhile are answered by it (one at a time per connection).
        self._greeting: asyncio.Task[None] | None = None

    def join(self, doc: str, session: str) -> None:
        """Subscribing to ``doc``: a member, greeted once the subscribe is
        answered. Its owner, who may take its clientIDs over, is its subject:
        the token's, or with auth off the client address
        (:meth:`.allowance.Allowance.subject_id`), so a client reconnecting
        after a server restart, a new session, gets its clientID back."""
        member = self.members.get(doc)
        if member is None:
            self.members[doc] = self._relay.join(
                doc, session, partial(self._peer.presence, doc), self._allowance.subject_id()
            )
        else:
            member.listening = False  # subscribing again: greeted again once answered

    def answered(self, doc: str) -> None:
        """``doc``'s subscribe was answered: after the answer come the states
        of the others, never before it."""
        member = self.members.get(doc)
        if member is not None and not member.listening:
            self._spawn(self.greet(member))

    async def query(self, doc: str) -> None:
        """Send the others' states again (y-protocols' awareness query), at
        the rate of answers; a query while the last one's greeting still
        runs is answered by it."""
        await self._allowance.take_answer()
        member = self.members.get(doc)
        if member is not None and (self._greeting is None or self._greeting.done()):
            self._greeting = self._spawn(self.greet(member))

    async def greet(self, member: Member) -> None:
        """Send ``member`` the others' states; their bytes count as an answer
        of the connection (:meth:`.allowance.Allowance.answered`)."""
        self._allowance.answered(await self._relay.greet(member))

    async def leave(self, doc: str) -> None:
        member = self.members.pop(doc, None)
        if member is not None:
            await self._relay.leave(member)

    async def leave_all(self) -> None:
        """The connection closed: its clientIDs are removed for the others."""
        for member in list(self.members.values()):
            await self._relay.leave(member)

    async def receive(self, doc: str, data: bytes) -> None:
        """Relay the awareness update ``data`` of a subscribed document,
        within the rates and ``max_awareness_bytes``."""
        settings = self._settings
        await self._allowance.take_awareness(doc)
        if len(data) > settings.max_awareness_bytes:
            raise ProtocolError(
                ErrorCode.AWARENESS_TOO_LARGE, f"awareness exceeds {settings.max_awareness_bytes} bytes", doc=doc
            )
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
            await self._relay.update(member, entries)
        except NotOwner as exc:
            raise ProtocolError(ErrorCode.AWARENESS_NOT_OWNER, str(exc), doc=doc) from None
        except PresenceFull as exc:
            raise ProtocolError(ErrorCode.AWARENESS_TOO_MANY_CLIENTS, str(exc), doc=doc) from None
