"""Bugs the fault-injection suite found, each pinned by a small test."""

from __future__ import annotations

import redis.exceptions
from conftest import eventually, running_server

from yrelay import crdt
from yrelay.store import DocumentStore


async def test_a_sync_that_meets_a_redis_error_is_answered_when_redis_is_back(redis_url, make_client, monkeypatch):
    """Found by a chaos run (redis-kill right after a GC trim): the server took
    the client's sync request, failed to load the document, and forgot the
    request; the client, which sends ``sync`` once and waits, stayed
    unsynced for good."""
    async with running_server(redis_url, gc_interval=0) as url:
        writer, reader = await make_client(url), await make_client(url)
        wdoc, rdoc = await writer.subscribe("doc"), await reader.subscribe("doc")
        crdt.insert_text(wdoc.ydoc, 0, "<before>")
        await writer.wait_idle()
        await eventually(lambda: rdoc.text == "<before>")

        load_document = DocumentStore.load_document
        failures = []

        async def fails_once(self, doc, page_size=500):
            if not failures:
                failures.append(doc)
                raise redis.exceptions.ConnectionError("Connection closed by server.")
            return await load_document(self, doc, page_size)

        monkeypatch.setattr(DocumentStore, "load_document", fails_once)
        synced: list[dict] = []
        reader.on_event = lambda name, data: synced.append(data) if name == "synced" else None
        rdoc.synced.clear()
        reader._request_sync(rdoc)
        await eventually(lambda: synced and rdoc.synced.is_set(), timeout=15)
        assert failures == ["doc"]
        crdt.insert_text(wdoc.ydoc, 0, "<after>")
        await eventually(lambda: rdoc.text == "<after><before>")
