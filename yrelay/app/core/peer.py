"""What the connection core says to one client, and how a wire protocol
plugs into the core: the two protocols every endpoint's codec implements.

The core (:mod:`.connection`, :mod:`.documents`, :mod:`.subscription`,
:mod:`.sending`, :mod:`.write_path`, :mod:`.presence`) knows no wire
format. It tells a client things (:class:`Peer`: a document's entries, a
sync answer, an update stored, a refusal...) and is told things by the
client's codec calling the connection's commands
(:class:`.connection.Connection`: ``write``, ``ack``, ``subscribe``,
``sync``, ``awareness``...). A codec is both directions of one wire format
plus the endpoint's small policy (:class:`Codec`): ``/ws`` speaks JSON
frames (:mod:`yrelay.app.wire.ws`), ``/yws`` y-protocols
(:mod:`yrelay.app.wire.yws`). A new protocol is a new codec and an
endpoint; the core's limits, fairness, backpressure and authentication
come with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from yrelay.app.core.handshake import CutOff
from yrelay.app.fanout import Batch
from yrelay.app.limits import Refusal
from yrelay.protocol import ProtocolError, ResyncReason
from yrelay.reconciliation.stream_digest import WindowDigest
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import Entry

#: Names one delivery of a fan-out batch (its first entry, its count, and
#: whose own entries were left out): every subscriber sending the same
#: entries shares the codec's encoding of them (:attr:`.fanout.Batch.frames`).
FrameKey = tuple[object, ...]


class Peer(Protocol):
    """What the core tells one client; each method returns once it was
    handed to the socket (a slow reader holds its caller here: backpressure).
    Those that carry a document's content return how many bytes they sent
    (the connection's answer rates book them)."""

    #: :meth:`deliver_now` can write at all (skip its checks when not).
    writes_now: bool

    async def subscribed(self, doc: str, offset: StreamId, window: WindowDigest | None) -> None:
        """The subscription resumes after ``offset`` (``window``: the server's drift digest)."""

    async def snapshot(self, doc: str, offset: StreamId, update: bytes) -> int:
        """The document's folded state up to ``offset``, to a new subscriber."""

    async def deliver(self, doc: str, entries: list[Entry], key: FrameKey, batch: Batch | None) -> int:
        """Stream entries, in order; ``batch``: the fan-out batch they come
        from (its encodings are shared by every subscriber), None for a page
        read from the stream."""

    def deliver_now(self, doc: str, entries: list[Entry], key: FrameKey, batch: Batch) -> bool:
        """The same, written at once from the fan-out's dispatch if the
        socket can take it now without a task (False: nothing was sent)."""

    async def sync_answer(self, doc: str, offset: StreamId, diff: bytes, state_vector: bytes) -> int:
        """The two-way exchange's answer: what the client lacks, and the
        server's state vector (the client answers with what the server lacks)."""

    async def synced(self, doc: str, offset: StreamId) -> None:
        """The client holds everything admitted when its subscribe or sync was answered."""

    async def resync_required(self, doc: str, reason: ResyncReason) -> None:
        """The client must resync (a two-way exchange) before deliveries go on."""

    async def unsubscribed(self, doc: str) -> None:
        """The subscription ended at the client's request."""

    async def appended(
        self, doc: str, clock: int, entry_id: str | None, duplicate: bool, dropped: dict[int, list[tuple[int, int]]]
    ) -> None:
        """The update ``(doc, clock)`` is stored as ``entry_id``."""

    async def refused(self, error: ProtocolError) -> None:
        """Something the client sent was not done, or its subscription cannot go on."""

    async def presence(self, doc: str, update: bytes) -> None:
        """Other clients' awareness states (a y-protocols awareness update)."""


class Codec(Peer, Protocol):
    """One wire format at the edge of the core, and its endpoint's policy."""

    #: The websocket subprotocol answered to a client that offers it.
    subprotocol: str
    #: Sessions are tracked and their deliveries acked (at-least-once), or
    #: never pin a stream (a client that keeps up with the fan-out, or
    #: reconnects and syncs).
    tracked: bool
    #: The client's first message must be ``hello`` (within ``hello_timeout``);
    #: else the codec authenticates as the socket opens (:meth:`opened`).
    hello_first: bool

    async def refuse_connection(self, refusal: Refusal) -> None:
        """A connection limit refused the socket: say why, as the protocol can."""

    async def opened(self) -> None:
        """The socket was accepted; the codec's own opening (a handshake that
        needs no first frame authenticates and subscribes here)."""

    async def receive(self, message: Mapping[str, Any]) -> None:
        """One websocket message (paced already): decode it and call the
        connection's commands; a :class:`ProtocolError` it raises is refused."""

    async def ending(self, cut: CutOff) -> None:
        """The connection is cut off (its close frame follows): say why first, if the protocol can."""


__all__ = ["Codec", "FrameKey", "Peer"]
