"""What a consumer receives: one document's new entries, or its snapshot."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from yrelay.consumers.progress import AckResult
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import Entry


@dataclass
class Batch:
    """Entries of one document, in stream order, for one member.

    ``snapshot`` is set when the group (re)starts the document from its
    snapshot (``restart`` says why: ``new`` for a document the group never
    read, ``evicted`` when GC evicted the group, ``trimmed`` when the stream
    was trimmed past the member's position): the document folded up to
    ``offset``; a service rebuilds its view of the document from it.
    """

    doc: str
    entries: list[Entry]
    #: The assignment version the member holds the document under.
    version: int
    #: What :meth:`ack` records: the last entry's id (the snapshot's offset).
    offset: StreamId
    snapshot: bytes | None = None
    restart: str | None = None
    _ack: Callable[[Batch], Awaitable[AckResult]] | None = field(default=None, repr=False)
    #: The document was deleted (DELETE /ops/docs/{doc}): drop your copy;
    #: ``entries`` hold what came before the deletion, if any. (After
    #: ``_ack``: the reader builds snapshot batches positionally.)
    deleted: bool = False

    @property
    def updates(self) -> list[bytes]:
        """The Yjs updates, in order (apply them to a Y.Doc, pycrdt or y-py)."""
        return [entry.update for entry in self.entries]

    @property
    def ids(self) -> list[str]:
        return [str(entry.id) for entry in self.entries]

    async def ack(self) -> AckResult:
        """Record the document as processed through :attr:`offset`. Refused
        (``STALE``) when another member took the document over: this member
        no longer reads it, and the other resumes from the last accepted ack
        (so everything after it is processed again there: at least once).
        ``EVICTED``: GC evicted the group; the next batch of the document
        starts again from its snapshot."""
        assert self._ack is not None, "a batch built by hand cannot be acked"
        return await self._ack(self)
