"""DELETE /ops/docs/{doc} from the users' side, on a real server and a real
redis-server: a subscribed client gets `error document_deleted` and its
subscription ends, a consumer group member gets a batch with `deleted`, a
webhook receiver a body with `"deleted": true`, a new subscriber an empty
document; a write racing the delete is refused and brings nothing back."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import redis.exceptions
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from conftest import eventually, running_server, serving
from consumerutil import LEASE
from yrelay.consumers import AckResult, Batch, ConsumerGroup
from yrelay.consumers.webhook import Webhook
from yrelay.storage.append import append_one
from yrelay.storage.embedded import free_port
from yrelay.storage.keys import bucket_documents_key, bucket_gc_due_key, document_bucket, stream_key
from yrelay.storage.reads import DocumentStore
from yrelay.yjs import crdt


async def listed(redis_client, doc: str) -> float | None:
    """The document's score in the registry (its bucket), None when unlisted."""
    return await redis_client.zscore(bucket_documents_key(document_bucket(doc)), doc)


TOKEN = "ops-secret-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DOC = "notes/gone"


async def test_a_deleted_document_ends_subscriptions_reaches_groups_and_webhooks_and_stays_deleted(
    redis_url, redis_client, make_client
):
    bodies: list[dict] = []

    async def hook(request: Request) -> Response:
        bodies.append(json.loads(await request.body()))
        return Response(status_code=204)

    port = free_port()
    async with (
        running_server(redis_url, ops_token=TOKEN, gc_interval=0) as url,
        serving(Starlette(routes=[Route("/hook", hook, methods=["POST"])]), port),
    ):
        http = httpx.AsyncClient(base_url=url.replace("ws://", "http://").removesuffix("/ws"), timeout=10)
        writer = await make_client(url)
        written = await writer.subscribe(DOC)
        crdt.insert_text(written.ydoc, 0, "secret plans")
        await writer.wait_idle()
        reader = await make_client(url)
        read = await reader.subscribe(DOC)
        await eventually(lambda: read.text == "secret plans")

        batches: list[Batch] = []
        acks: list[AckResult] = []
        member = await ConsumerGroup(redis_client, "del-group", member="m1", lease=LEASE).__aenter__()
        hooks = await ConsumerGroup(redis_client, "del-hooks", member="h1", lease=LEASE).__aenter__()
        webhook = Webhook(hooks, f"http://127.0.0.1:{port}/hook", "whsec")

        async def consume() -> None:
            async for batch in member.batches():
                batches.append(batch)
                acks.append(await batch.ack())

        tasks = [asyncio.create_task(consume()), asyncio.create_task(webhook.run())]
        await eventually(lambda: any(b.ids for b in batches) and any(b["ids"] for b in bodies), timeout=10)

        response = await http.delete(f"/ops/docs/{DOC}", headers=AUTH)
        assert response.status_code == 200, response.text
        assert response.json()["sessions"] == 2

        # Subscribers: told, their subscription ended (not resubscribed on reconnect).
        await eventually(lambda: read.deleted.is_set() and written.deleted.is_set(), timeout=10)
        assert reader.error_codes["document_deleted"] == 1 and DOC not in reader.docs
        # The group and the webhook: a deletion event, acked.
        await eventually(
            lambda: any(b.deleted for b in batches) and any(b["deleted"] for b in bodies) and len(acks) == len(batches),
            timeout=10,
        )  # the batch's ack answered too
        deletion = next(b for b in batches if b.deleted)
        assert deletion.doc == DOC and deletion.updates == [] and acks[batches.index(deletion)] is AckResult.ACKED
        body = next(b for b in bodies if b["deleted"])
        assert body["doc"] == DOC and body["updates"] == [] and body["delivery"].startswith("notes%2Fgone:")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await member.leave()
        await hooks.leave()

        # Gone from the listings; what stays is the tombstone (the marker alone in the stream).
        assert await listed(redis_client, DOC) is None
        assert await redis_client.zscore(bucket_gc_due_key(document_bucket(DOC)), DOC) is None
        assert await redis_client.xlen(stream_key(DOC)) == 1
        left = {key.decode() for key in await redis_client.keys("yrelay:{notes/gone}:*")}
        assert left <= {
            "yrelay:{notes/gone}:stream",
            "yrelay:{notes/gone}:meta",
            "yrelay:{notes/gone}:groups",
            "yrelay:{notes/gone}:groups:leases",
        }, left
        assert 0 < await redis_client.ttl(stream_key(DOC)) <= 3600

        # A write racing the delete (here: after it) is refused and writes nothing.
        with pytest.raises(redis.exceptions.ResponseError, match="YRELAY_DELETED"):
            await append_one(
                DocumentStore(redis_client), DOC, "late-session-0000000", 1, crdt.encode_state(written.ydoc)
            )
        assert await listed(redis_client, DOC) is None  # its pipeline's listing undone
        # A new subscriber sees an empty document, and cannot write to it while the tombstone lives.
        fresh = await make_client(url)
        again = await fresh.subscribe(DOC)
        assert again.text == ""
        crdt.insert_text(again.ydoc, 0, "new")
        try:
            await eventually(
                lambda: fresh.error_codes["document_deleted"] >= 1, timeout=10
            )  # a resend may race the answer
        except AssertionError:
            raise AssertionError(f"errors {fresh.errors}, pending {fresh.pending}") from None
        assert await redis_client.xlen(stream_key(DOC)) == 1
        for _ in range(100):  # the refused write's pipeline listed it again; undone
            if await listed(redis_client, DOC) is None:
                break
            await asyncio.sleep(0.05)
        assert await listed(redis_client, DOC) is None
        assert (await http.delete("/ops/docs/never-existed", headers=AUTH)).status_code == 404
        assert (await http.delete(f"/ops/docs/{DOC}")).status_code == 401
        await http.aclose()


async def test_writes_racing_the_delete_leave_nothing_but_the_tombstone(redis_client):
    """Appends run while the document is deleted: each lands before the
    marker (and is deleted with the rest) or is refused; none comes after it,
    and no clock, dedup field or snapshot of the old document survives."""
    from yrelay.gc.deletion import delete_document
    from yrelay.storage.keys import clocks_key, dedup_key, meta_key, snapshot_key
    from yrelay.storage.offsets import StreamId

    store = DocumentStore(redis_client)
    doc = "race/doc"
    ydoc = crdt.new_doc()
    stored: list[StreamId] = []
    refused = 0

    async def write(n: int) -> None:
        nonlocal refused
        for i in range(n):
            crdt.insert_text(ydoc, 0, f"{i} ")
            try:
                entry_id, _ = await append_one(store, doc, "racer-session-000001", i + 1, crdt.encode_state(ydoc))
                stored.append(StreamId.parse(entry_id))
            except redis.exceptions.ResponseError as exc:
                assert "YRELAY_DELETED" in str(exc)
                refused += 1

    writing = asyncio.create_task(write(300))
    while len(stored) < 20:
        await asyncio.sleep(0.005)
    deleted = await delete_document(redis_client, doc, 60)
    await writing
    assert refused > 0 and stored and all(entry < deleted.marker for entry in stored)
    entries = await redis_client.xrange(stream_key(doc))
    assert [StreamId.parse(e[0].decode()) for e in entries] == [deleted.marker]
    assert not await redis_client.exists(clocks_key(doc), dedup_key(doc), snapshot_key(doc))
    assert (await redis_client.hget(meta_key(doc), "deleted")).decode() == str(deleted.marker)
    # Idempotent while the tombstone lives: the same marker, nothing rewritten.
    assert (await delete_document(redis_client, doc, 60)).marker == deleted.marker


async def test_a_yws_connection_is_closed_with_4404_and_its_writes_refused(redis_url, redis_client):
    from yrelay.gc.deletion import delete_document
    from ywspeer import YwsPeer

    async with running_server(redis_url) as url:
        base = url.removesuffix("/ws")
        peer = await YwsPeer.connect(base, "yws/gone")
        await peer.edit("hello")
        for _ in range(100):
            if await redis_client.xlen(stream_key("yws/gone")):
                break
            await asyncio.sleep(0.05)
        await delete_document(redis_client, "yws/gone", 60)
        await eventually(lambda: peer.closed is not None)
        assert peer.closed[0] == 4404 and peer.closed[1].startswith("document_deleted"), peer.closed
        late = await YwsPeer.connect(base, "yws/gone")
        await late.edit("again")
        await eventually(lambda: late.closed is not None)
        assert late.closed[0] == 4500 and late.closed[1].startswith("document_deleted"), late.closed
        assert await redis_client.xlen(stream_key("yws/gone")) == 1
