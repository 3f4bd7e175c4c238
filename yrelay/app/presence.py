"""Presence (Yjs awareness): the process-wide relay of who is where.

Awareness is ephemeral and best-effort: it never touches a document's
stream, and a Redis failure only costs presence, never the document sync
path. Local connections of a document get each update directly; other
processes get it over one pub/sub channel per document (this process's one
pub/sub connection listens to the channels of documents with a local
member). A small per-document hash keeps each present client's last entry,
so a newcomer sees everyone at once; entries not renewed within
``presence_timeout`` are neither sent nor kept.

Limits (docs/operations.md#limits): a second hash holds who may speak for
each clientID (its owner: the token's subject, or with auth off the client
address), at most ``max_clients`` of them per document, kept past the
owner's leaving for the timeout; a greeting carries at most
``greeting_bytes`` of states. A client that leaves is removed at its own
clock (:meth:`~yrelay.yjs.awareness.AwarenessEntry.removal`).

A connection holds one :class:`Member` per document it is present on: the
clientIDs it speaks for and an outbox, so one slow socket never holds the
relay up; :class:`NotOwner` and :class:`PresenceFull` are the relay's two
refusals of a member's update.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from yrelay.backoff import Reconnect
from yrelay.storage.keys import doc_of_presence_channel, presence_channel, presence_key, presence_owners_key
from yrelay.storage.scripts import source
from yrelay.tasks import BackgroundTask, lost_redis, spawn, wait_event
from yrelay.yjs.awareness import AwarenessEntry, encode_update, join_encoded

log = logging.getLogger(__name__)

#: How a member's awareness updates reach its connection (its codec says them).
Send = Callable[[bytes], Awaitable[None]]

#: Frames queued for one slow socket before the oldest are dropped (every
#: client renews its state, so a dropped one heals within 15 s).
MAX_QUEUED = 64
#: How long a newcomer waits for its channel subscription before reading.
SUBSCRIBE_WAIT = 1.0
#: Seconds a read of a document's states serves further greetings of it
#: (those whose member was listening before the read began: whatever changed
#: since was relayed to them). An awareness query answered from Redis each
#: time was the 34,000x amplifier of issue 30.
GREETING_REUSE = 1.0


def _untyped(method: object) -> Callable[[], Awaitable[None]]:
    """A redis-py ``PubSub`` method its library leaves unannotated
    (``connect``, ``aclose``), typed as what it is: a coroutine of nothing."""
    return cast("Callable[[], Awaitable[None]]", method)


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
        #: began after it may serve this member too (:meth:`Presence.greet`).
        self.listening_since = 0.0
        self._send = send
        #: The newest MAX_QUEUED; a list, as an empty deque is a 760-byte block per idle member.
        self._outbox: list[bytes] = []
        self._drain: asyncio.Task[None] | None = None

    def push(self, update: bytes) -> None:
        if not self.listening:
            return  # not answered `subscribed` yet: the greeting will carry it
        if len(self._outbox) >= MAX_QUEUED:
            del self._outbox[0]
        self._outbox.append(update)
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


class Presence:
    def __init__(
        self,
        redis: Redis,
        listener: Redis,
        *,
        timeout: float,
        process_id: str,
        max_clients: int = 500,
        greeting_bytes: int = 1024 * 1024,
    ):
        self.redis = redis
        self.listener = listener  # its own client: the pub/sub connection stays subscribed
        self.timeout_ms = int(timeout * 1000)
        self.max_clients = max_clients
        self.greeting_bytes = greeting_bytes
        self.instance = f"{process_id}:{secrets.token_hex(4)}"  # unique even for two apps in one process
        self.members: dict[str, set[Member]] = {}
        self._channels: dict[str, asyncio.Event] = {}  # subscribed (event set once Redis confirmed)
        self._pubsub: PubSub | None = None
        self._channel_lock = asyncio.Lock()
        self._ids = itertools.count(1)
        #: Per document, the newest read of its states: when it began, and the read.
        self._readings: dict[str, tuple[float, asyncio.Task[list[Any] | None]]] = {}
        self._reconnect = Reconnect()
        self._put = redis.register_script(source("presence_put"))
        self._forget = redis.register_script(source("presence_forget"))
        self._read = redis.register_script(source("presence_read"))
        self.scripts = (self._put, self._forget, self._read)
        #: Totals for the metrics: client updates stored, frames queued to local members.
        self.updates = 0
        self.relayed = 0
        self._loop = BackgroundTask("yrelay-presence", self._run)

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        await self.listener.aclose()

    # ------------------------------------------------------------ members

    def join(self, doc: str, session: str, send: Send, owner: str) -> Member:
        member = Member(doc, session, f"{self.instance}/{next(self._ids)}", send, owner)
        self.members.setdefault(doc, set()).add(member)
        return member

    async def greet(self, member: Member) -> int:
        """Start relaying to ``member`` and send it the states of the others
        (again, for an awareness query); the bytes of states sent. The
        channel is subscribed before the hash is read, so a state stored
        after the read is also published after the subscription."""
        loop = asyncio.get_running_loop()
        if not member.listening:
            member.listening, member.listening_since = True, loop.time()
        await asyncio.shield(self._sync_channel(member.doc))  # a closing connection must not cut a SUBSCRIBE in half
        ready = self._channels.get(member.doc)
        if ready is not None:
            await wait_event(ready, SUBSCRIBE_WAIT)
        values = await self._states(member, loop)
        if values is None:
            return 0
        entries = [entry for session, entry in map(_parse_value, values) if session != member.session]
        if not entries:
            return 0
        update = join_encoded(entries)
        member.push(update)
        return len(update)

    async def _states(self, member: Member, loop: asyncio.AbstractEventLoop) -> list[Any] | None:
        """The document's states from a read that began after ``member``
        listened and at most ``GREETING_REUSE`` ago (shared by every greeting
        that needs one meanwhile), else from a new read; None: Redis failed.
        The read is a task of its own: a greeting that is cancelled (its
        connection closed) does not take the others' answer with it."""
        doc, now = member.doc, loop.time()
        reading = self._readings.get(doc)
        if reading is None or member.listening_since > reading[0] or now - reading[0] > GREETING_REUSE:
            task = loop.create_task(self._read_states(doc))
            reading = self._readings[doc] = (now, task)
            # the states (up to greeting_bytes) are let go once they cannot serve anyone
            task.add_done_callback(lambda _: loop.call_later(GREETING_REUSE, self._forget_reading, doc, task))
        return await asyncio.shield(reading[1])

    async def _read_states(self, doc: str) -> list[Any] | None:
        try:
            values: list[Any] = await self._read(keys=[presence_key(doc)], args=[self.timeout_ms, self.greeting_bytes])
        except Exception as exc:
            if not lost_redis(exc):
                raise
            log.debug("presence of %s not read: %s", doc, exc)
            self._forget_reading(doc, asyncio.current_task())
            return None
        return values

    def _forget_reading(self, doc: str, task: asyncio.Future[Any] | None) -> None:
        reading = self._readings.get(doc)
        if reading is not None and reading[1] is task:
            del self._readings[doc]

    async def update(self, member: Member, entries: list[AwarenessEntry]) -> None:
        """Store and relay one client update, or raise :class:`NotOwner` or
        :class:`PresenceFull` (nothing stored or relayed then)."""
        try:
            answer = await self._put(keys=self._keys(member.doc), args=self._put_args(member, entries))
        except Exception as exc:
            if not lost_redis(exc):
                raise
            log.debug("presence of %s not stored: %s", member.doc, exc)
            answer = [b"owner", *self._refused_locally(member, entries)]
        if answer and answer[0] == b"full":
            raise PresenceFull(self.max_clients)
        if len(answer) > 1:
            raise NotOwner(sorted({int(client) for client in answer[1:]}))
        member.claim(entries)
        self.updates += 1
        for other in self.members.get(member.doc, ()):
            if other is not member and other.owner == member.owner:
                other.clocks = {c: k for c, k in other.clocks.items() if c not in member.clocks}  # taken over
        await self._relay(member, encode_update(entries))

    async def leave(self, member: Member) -> None:
        """Relay the removal of every clientID ``member`` spoke for, then
        forget it (and the channel, for the document's last local member)."""
        member.stop()
        members = self.members.get(member.doc)
        if members is not None:
            members.discard(member)
            if not members:
                del self.members[member.doc]
        removals = member.removals()
        if removals:
            gone = await self._forget_owned(member, [entry.client_id for entry in removals])
            await self._relay(member, encode_update([entry for entry in removals if entry.client_id in gone]))
        await self._sync_channel(member.doc)

    @staticmethod
    def _keys(doc: str) -> list[str]:
        return [presence_key(doc), presence_owners_key(doc)]

    def _put_args(self, member: Member, entries: list[AwarenessEntry]) -> list[Any]:
        args: list[Any] = [member.session, member.origin, member.owner, self.timeout_ms, self.max_clients]
        for entry in entries:
            args += [entry.client_id, b"" if entry.removed else entry.encode()]
        return args

    def _refused_locally(self, member: Member, entries: list[AwarenessEntry]) -> list[int]:
        """Without Redis, at least this process's own members are protected."""
        owned = {
            client
            for other in self.members.get(member.doc, ())
            if other.owner != member.owner
            for client in other.clocks
        }
        return [entry.client_id for entry in entries if entry.client_id in owned]

    async def _forget_owned(self, member: Member, clients: list[int]) -> set[int]:
        try:
            gone = await self._forget(keys=self._keys(member.doc), args=[member.origin, self.timeout_ms, *clients])
        except Exception as exc:
            if not lost_redis(exc):
                raise
            log.debug("presence of %s not forgotten: %s", member.doc, exc)
            return set(clients)  # the entries expire by themselves
        return {int(client) for client in gone}

    async def _relay(self, sender: Member, update: bytes) -> None:
        """To every other local member now, and to other processes."""
        if update == encode_update([]):
            return
        self._deliver(sender.doc, update, skip=sender)
        try:
            await self.redis.publish(presence_channel(sender.doc), sender.origin.encode() + b"\n" + update)
        except Exception as exc:
            if not lost_redis(exc):
                raise
            log.debug("presence of %s not published: %s", sender.doc, exc)

    def _deliver(self, doc: str, update: bytes, skip: Member | None = None) -> None:
        for member in list(self.members.get(doc, ())):
            if member is not skip and member.listening:
                member.push(update)
                self.relayed += 1

    # ------------------------------------------------------------ pub/sub

    async def _sync_channel(self, doc: str) -> None:
        """Listen to ``doc``'s channel exactly while it has local members.
        Best-effort: after a failure the reader reconnects and subscribes
        to every document that has members then."""
        async with self._channel_lock:
            pubsub, wanted = self._pubsub, doc in self.members
            if pubsub is None or wanted == (doc in self._channels):
                return
            try:
                if wanted:
                    self._channels[doc] = asyncio.Event()
                    await pubsub.subscribe(presence_channel(doc))
                else:
                    del self._channels[doc]
                    await pubsub.unsubscribe(presence_channel(doc))
            except Exception as exc:
                if not lost_redis(exc):
                    raise
                log.debug("presence channel of %s: %s", doc, exc)

    async def _run(self) -> None:
        while True:
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if lost_redis(exc):
                    log.warning("presence reader lost Redis (%r); retrying in %.1fs", exc, self._reconnect.delay)
                else:
                    log.exception("presence reader failed; retrying in %.1fs", self._reconnect.delay)
                await self._reconnect.wait()

    async def _listen(self) -> None:
        pubsub = self.listener.pubsub()
        try:
            await _untyped(pubsub.connect)()
            async with self._channel_lock:
                self._pubsub = pubsub
                self._channels = {doc: asyncio.Event() for doc in self.members}
                if self._channels:
                    await pubsub.subscribe(*map(presence_channel, self._channels))
            self._reconnect.succeeded()
            while True:
                message = await pubsub.get_message(timeout=1.0)
                if message is not None:
                    self._on_message(message)
        finally:
            self._pubsub = None
            self._channels = {}
            await asyncio.gather(_untyped(pubsub.aclose)(), return_exceptions=True)

    def _on_message(self, message: dict[str, Any]) -> None:
        doc = doc_of_presence_channel(_text(message["channel"]))
        if message["type"] == "subscribe" and doc in self._channels:
            self._channels[doc].set()
        elif message["type"] == "message":
            origin, _, update = message["data"].partition(b"\n")
            if not origin.decode().startswith(self.instance + "/"):  # local members already have it
                self._deliver(doc, update)


def _parse_value(value: bytes) -> tuple[str, bytes]:
    """A stored field: ``<ms>|<session>|<origin>|<entry>`` -> (session, entry)."""
    _, session, _, entry = value.split(b"|", 3)
    return session.decode(), entry


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


__all__ = ["Member", "NotOwner", "Presence", "PresenceFull"]
