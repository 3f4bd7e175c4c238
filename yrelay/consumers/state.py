"""The current state of each document a member reads, for services that
want text rather than updates.

::

    states = DocumentStates(redis)
    async for batch in group.batches():
        doc = await states.apply(batch)
        index(batch.doc, states.text(batch.doc))
        await batch.ack()

A snapshot batch replaces the document. A document seen for the first time
mid-stream (taken over from another member, or after this process
restarted) is loaded first from Redis (snapshot + stream): that may already
hold the batch's updates and later ones, which Yjs applies idempotently, so
the state is never behind the batch. So is a document that comes back under
a new assignment version: while another member held it, that member
processed entries this copy never saw. A deletion batch drops the copy.
Documents are pycrdt documents (the server's engine), which integrate
updates in any order.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import pycrdt
from redis.asyncio import Redis

from yrelay.consumers.batch import Batch
from yrelay.storage.reads import DocumentStore


def _apply_all(doc: pycrdt.Doc[Any], updates: list[bytes]) -> None:
    for update in updates:
        if update:
            doc.apply_update(update)


class DocumentStates:
    def __init__(self, redis: Redis, text_name: str = "text"):
        """``text_name``: the shared text :meth:`text` reads (the demo
        editor's and the Python client's is ``text``)."""
        self.store = DocumentStore(redis)
        self.text_name = text_name
        self.documents: dict[str, pycrdt.Doc[Any]] = {}
        #: doc -> the assignment version its copy was built under.
        self.versions: dict[str, int] = {}

    async def apply(self, batch: Batch) -> pycrdt.Doc[Any]:
        """The document with ``batch`` applied (an empty one for a deletion)."""
        if batch.deleted:
            self.forget(batch.doc)
            return pycrdt.Doc()
        doc = self.documents.get(batch.doc) if self.versions.get(batch.doc) == batch.version else None
        updates = batch.updates
        if batch.snapshot is not None:
            doc, updates = pycrdt.Doc(), [batch.snapshot, *updates]
        elif doc is None:
            snapshot, entries = await self.store.load_entries(batch.doc)
            doc, updates = pycrdt.Doc(), [snapshot.update, *(entry.update for entry in entries), *updates]
        _apply_all(doc, updates)
        self.documents[batch.doc] = doc
        self.versions[batch.doc] = batch.version
        return doc

    def text(self, doc: str) -> str:
        """The document's text ('' for a document not seen)."""
        if doc not in self.documents:
            return ""
        return str(self.documents[doc].get(self.text_name, type=pycrdt.Text))

    def forget(self, doc: str) -> None:
        self.documents.pop(doc, None)
        self.versions.pop(doc, None)

    def keep_only(self, docs: Collection[str]) -> None:
        """Drop every copy but those of ``docs`` (the documents a member
        still holds): memory follows the member's share, not every document
        it ever read."""
        for doc in [doc for doc in self.documents if doc not in docs]:
            self.forget(doc)
