"""One connection's presence on one document (:class:`Member`), and the two
refusals the relay gives a member: clientIDs another owner speaks for, and a
document with as many present clients as it keeps. Kept apart from the relay
(:mod:`.presence`) because a member is what a connection holds."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from yrelay.tasks import spawn
from yrelay.yjs.awareness import AwarenessEntry

Send = Callable[[dict[str, Any]], Awaitable[None]]

#: Frames queued for one slow socket before the oldest are dropped (every
#: client renews its state, so a dropped one heals within 15 s).
MAX_QUEUED = 64


class NotOwner(Exception):
    """Entries for clientIDs another owner (subject, or client address with
    auth off) spoke for within the timeout."""

    def __init__(self, client_ids: list[int]):
        super().__init__(f"clientID {', '.join(map(str, client_ids))} belongs to another user")
        self.client_ids = client_ids


class PresenceFull(Exception):
    """The document already has ``max_clients`` clientIDs claimed."""

    def __init__(self, limit: int):
        super().__init__(f"the document has {limit} present clients, the most it keeps; retry later")


class Member:
    """One connection's presence on one document: the clientIDs it speaks
    for (with their last clock, for the removal when it leaves) and an
    outbox so one slow socket never holds the relay up."""

    def __init__(self, doc: str, session: str, origin: str, send: Send, owner: str):
        self.doc = doc
        self.session = session
        self.origin = origin
        #: Who may take this member's clientIDs over (Allowance.subject_id: the subject, or the address).
        self.owner = owner
        self.clocks: dict[int, int] = {}
        self.listening = False
        #: When it started listening (event loop time): a greeting read that
        #: began after it may serve this member too (presence.Presence.greet).
        self.listening_since = 0.0
        self._send = send
        #: The newest MAX_QUEUED; a list, as an empty deque is a 760-byte block per idle member.
        self._outbox: list[dict[str, Any]] = []
        self._drain: asyncio.Task[None] | None = None

    def push(self, frame: dict[str, Any]) -> None:
        if not self.listening:
            return  # not answered `subscribed` yet: the greeting will carry it
        if len(self._outbox) >= MAX_QUEUED:
            del self._outbox[0]
        self._outbox.append(frame)
        if self._drain is None or self._drain.done():
            self._drain = spawn(self._drain_outbox(), name="yrelay-presence-drain")

    async def _drain_outbox(self) -> None:
        try:
            while self._outbox:
                await self._send(self._outbox.pop(0))
        except Exception:  # noqa: BLE001 - the socket is gone (however it says so); the connection cleans up
            self._outbox.clear()

    def claim(self, entries: list[AwarenessEntry]) -> None:
        for entry in entries:
            if entry.removed:
                self.clocks.pop(entry.client_id, None)
            else:
                self.clocks[entry.client_id] = max(entry.clock, self.clocks.get(entry.client_id, 0))

    def clients_after(self, entries: list[AwarenessEntry]) -> int:
        """How many clientIDs this member would speak for after ``entries``."""
        live = set(self.clocks)
        for entry in entries:
            (live.discard if entry.removed else live.add)(entry.client_id)
        return len(live)

    def removals(self) -> list[AwarenessEntry]:
        return [AwarenessEntry(client, clock, "null").removal() for client, clock in self.clocks.items()]

    def stop(self) -> None:
        self.listening = False
        self._outbox.clear()
