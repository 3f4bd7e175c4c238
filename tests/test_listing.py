"""The document registry and GC due set split into buckets (yrelay/storage/listing.py):
no shared key per append, pages merged in id order, the unsplit keys of an
older release folded in once."""

from __future__ import annotations

import asyncio

from yrelay.app.context import ServerContext
from yrelay.config import Settings
from yrelay.gc import DueSet
from yrelay.storage.append import append_one
from yrelay.storage.keys import (
    DOCUMENT_BUCKETS,
    bucket_documents_key,
    bucket_gc_due_key,
    document_bucket,
    documents_key,
    gc_due_key,
)
from yrelay.storage.listing import all_documents, documents_page, fold_unbucketed, mark_changed, registry_counts
from yrelay.storage.reads import DocumentStore

DOCS = sorted(f"team-{i % 7}/doc-{i:03d}" for i in range(150))


async def register(redis, docs: list[str]) -> None:
    async with redis.pipeline(transaction=False) as pipe:
        mark_changed(pipe, docs)
        await pipe.execute()


async def test_an_append_writes_its_bucket_only(redis_client):
    await append_one(DocumentStore(redis_client), "solo", "s", 1, b"\x00\x00")
    bucket = document_bucket("solo")
    assert await redis_client.zrange(bucket_documents_key(bucket), 0, -1) == [b"solo"]
    assert await redis_client.zscore(bucket_gc_due_key(bucket), "solo") == 0
    assert not await redis_client.exists(documents_key(), gc_due_key())
    assert await registry_counts(redis_client) == (1, 1)


async def test_pages_are_merged_across_buckets_in_id_order(redis_client):
    await register(redis_client, DOCS)
    assert len({document_bucket(doc) for doc in DOCS}) == DOCUMENT_BUCKETS  # spread over every bucket
    for page in (1, 7, 1000):
        pages = [p async for p in all_documents(redis_client, page)]
        assert all(len(p) <= page for p in pages)
        assert [doc for p in pages for doc in p] == DOCS
    prefixed = [doc async for p in all_documents(redis_client, 4, prefix="team-3/") for doc in p]
    assert prefixed == [doc for doc in DOCS if doc.startswith("team-3/")]
    assert await documents_page(redis_client, None, 10) == DOCS[:10]
    assert await documents_page(redis_client, DOCS[60], 5) == DOCS[61:66]
    assert await documents_page(redis_client, DOCS[-1], 5) == []
    assert await registry_counts(redis_client) == (150, 150)


async def test_gc_claims_from_every_bucket_and_releases_with_their_leases(redis_client):
    await register(redis_client, DOCS)
    due = DueSet(redis_client)
    first = await due.claim(100, lease_ms=60_000)
    second = await due.claim(100, lease_ms=60_000)
    assert len(first.docs) == 100 and len(second.docs) == 50
    assert sorted(first.docs + second.docs) == DOCS  # each claimed once
    await due.release(first, dict.fromkeys(first.docs, True), next_due_ms=0)
    await due.release(second, dict.fromkeys(second.docs, False), next_due_ms=0)
    assert await due.pending() == 50
    assert sorted((await due.claim(200, lease_ms=60_000)).docs) == sorted(second.docs)


async def test_a_server_folds_the_unsplit_keys_of_an_older_release(redis_url, redis_client):
    # What a release before the buckets left: one registry, one due set.
    await redis_client.zadd(documents_key(), dict.fromkeys(DOCS, 0))
    await redis_client.zadd(gc_due_key(), {doc: 5_000 for doc in DOCS[:40]})
    # A document appended since by a new server: it is due now (0), and its
    # older, later due time must not push it back.
    await register(redis_client, [DOCS[0]])
    ctx = await ServerContext.open(Settings.from_env(gc_interval=0), redis_url)
    await ctx.close()
    assert not await redis_client.exists(documents_key(), gc_due_key())
    assert [doc async for page in all_documents(redis_client, 50) for doc in page] == DOCS
    assert await registry_counts(redis_client) == (150, 40)
    assert await redis_client.zscore(bucket_gc_due_key(document_bucket(DOCS[0])), DOCS[0]) == 0
    assert await redis_client.zscore(bucket_gc_due_key(document_bucket(DOCS[1])), DOCS[1]) == 5_000


async def test_folding_is_idempotent_and_safe_with_several_processes(redis_client):
    await redis_client.zadd(documents_key(), dict.fromkeys(DOCS, 0))
    await redis_client.zadd(gc_due_key(), dict.fromkeys(DOCS, 7))
    moved = await asyncio.gather(*(fold_unbucketed(redis_client) for _ in range(4)))
    assert sum(moved) >= 300
    assert await fold_unbucketed(redis_client) == 0
    assert await registry_counts(redis_client) == (150, 150)
    assert [doc async for page in all_documents(redis_client, 1000) for doc in page] == DOCS
