"""The ``yrelay`` Spark data source against a real redis-server filled by a real
server and clients: its rows are what XRANGE, ZRANGE and /ops's figures say."""

from __future__ import annotations

import asyncio

import pytest
import redis
from pyspark.errors import AnalysisException
from redis.asyncio import Redis

from conftest import eventually, running_server
from yrelay.spark_analytics.redis_connection import RedisUnreachable
from yrelay.spark_analytics.redis_options import SourceOptionError
from yrelay.spark_analytics.redis_pages import registered_documents, stream_pages, tracker_pages
from yrelay.spark_analytics.redis_rows import TRACKER_SCHEMA, arrow_batches, tracker_rows
from yrelay.spark_analytics.redis_source import redis_tables, register
from yrelay.storage.append import append_one
from yrelay.storage.embedded import free_port
from yrelay.storage.keys import stream_key, tracker_key
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import DocumentStore
from yrelay.tracker.lag import document_status
from yrelay.yjs import crdt

ENTRIES_DDL = "struct<doc:string,id:string,ms:bigint,seq:int,score:bigint,session:string,clock:bigint,bytes:int>"
TRACKER_DDL = "struct<doc:string,session:string,offset:string,score:bigint,ms:bigint,lag_entries:bigint,lag_ms:bigint>"


# ------------------------------------------------------------------ helpers


def edit(doc, text: str) -> None:
    crdt.insert_text(doc.ydoc, len(crdt.text_of(doc.ydoc)), text)


async def populate_through_server(redis_url: str, make_client) -> dict[str, str]:
    """Three documents edited by real clients; "carol" leaves "notes" early and
    lags behind. Returns the session id of each client. The server is stopped
    before returning, so Redis holds still while it is read."""
    async with running_server(redis_url, gc_interval=0) as url:
        alice, bob, carol = [await make_client(url) for _ in range(3)]
        notes_a, todo_a = await alice.subscribe("notes"), await alice.subscribe("todo")
        notes_b, readme_b = await bob.subscribe("notes"), await bob.subscribe("readme")
        notes_c = await carol.subscribe("notes")
        edit(notes_a, "hello ")
        edit(todo_a, "milk ")
        edit(readme_b, "read me ")
        await alice.wait_idle()
        await bob.wait_idle()
        await eventually(lambda: crdt.text_of(notes_c.ydoc) == "hello ")
        sessions = {"alice": alice.session, "bob": bob.session, "carol": carol.session}
        await carol.close()
        for word in ("one ", "two ", "three "):
            edit(notes_a, word)
            edit(notes_b, word.upper())
        edit(todo_a, "eggs ")
        await alice.wait_idle()
        await bob.wait_idle()
        await eventually(lambda: crdt.text_of(notes_a.ydoc) == crdt.text_of(notes_b.ydoc))
        await alice.close()
        await bob.close()
    return sessions


async def expected_entries(redis_client: Redis, docs: list[str], with_updates: bool = False) -> list[tuple]:
    rows = []
    for doc in docs:
        for raw_id, fields in await redis_client.xrange(stream_key(doc)):
            ident = StreamId.parse(raw_id.decode())
            row = (
                doc,
                str(ident),
                ident.ms,
                ident.seq,
                ident.score(),
                fields[b"s"].decode(),
                int(fields[b"c"]),
                len(fields[b"u"]),
            )
            rows.append((*row, fields[b"u"]) if with_updates else row)
    return rows


async def expected_tracker(redis_client: Redis, docs: list[str]) -> list[tuple]:
    rows = []
    for doc in docs:
        status = await document_status(redis_client, doc, with_sessions=True)
        lags = {lag.session: lag for lag in status.sessions or []}
        for member, score in await redis_client.zrange(tracker_key(doc), 0, -1, withscores=True):
            session, offset = member.decode(), StreamId.from_score(score)
            lag = lags[session]
            assert lag.offset == str(offset)
            rows.append((doc, session, str(offset), int(score), offset.ms, lag.lag_entries, lag.lag_ms))
    return rows


def rows_of(df) -> list[tuple]:
    return sorted(tuple(row) for row in df.collect())


def read(spark, url: str, **options: str):
    register(spark)
    return spark.read.format("yrelay").options(url=url, **options).load()


async def append_documents(redis_client: Redis, count: int) -> list[str]:
    """``count`` one-entry documents appended through the real append script."""
    store = DocumentStore(redis_client)
    await store.load_scripts()
    docs = [f"doc-{index:02d}" for index in range(count)]
    for doc in docs:
        await append_one(store, doc, "writer-session-0001", 1, b"\x00\x01\x02")
    return docs


# -------------------------------------------------------------------- tests


async def test_tables_match_what_redis_and_ops_report(spark, redis_url, redis_client, make_client):
    sessions = await populate_through_server(redis_url, make_client)
    docs = ["notes", "readme", "todo"]
    want_entries = await expected_entries(redis_client, docs)
    want_tracker = await expected_tracker(redis_client, docs)

    entries, tracker = await asyncio.to_thread(redis_tables, spark, redis_url)
    assert (entries.schema.simpleString(), tracker.schema.simpleString()) == (ENTRIES_DDL, TRACKER_DDL)
    assert await asyncio.to_thread(rows_of, entries) == sorted(want_entries)
    assert await asyncio.to_thread(rows_of, tracker) == sorted(want_tracker)

    # The scenario is what it claims: every client wrote, and carol lags on notes.
    assert {row[5] for row in want_entries} == {sessions["alice"], sessions["bob"]}
    carol = next(row for row in want_tracker if row[:2] == ("notes", sessions["carol"]))
    assert carol[5] >= 6
    assert len(want_entries) == 10 and len(want_tracker) == 5


async def test_a_subset_of_documents(spark, redis_url, redis_client, make_client):
    await populate_through_server(redis_url, make_client)
    entries, tracker = await asyncio.to_thread(redis_tables, spark, redis_url, ["todo", "never-written"])
    assert await asyncio.to_thread(rows_of, entries) == await expected_entries(redis_client, ["todo"])
    assert await asyncio.to_thread(rows_of, tracker) == sorted(await expected_tracker(redis_client, ["todo"]))

    notes = await asyncio.to_thread(read, spark, redis_url, kind="tracker", docs="notes")
    assert {row.doc for row in await asyncio.to_thread(notes.collect)} == {"notes"}


async def test_updates_are_shipped_only_on_request(spark, redis_url, redis_client, make_client):
    await populate_through_server(redis_url, make_client)
    with_updates = await asyncio.to_thread(read, spark, redis_url, docs="notes", withUpdates="true")
    assert with_updates.schema.simpleString() == ENTRIES_DDL[:-1] + ",update:binary>"
    want = await expected_entries(redis_client, ["notes"], with_updates=True)
    assert await asyncio.to_thread(rows_of, with_updates) == sorted(want)


async def test_documents_are_grouped_into_partitions(spark, redis_url, redis_client):
    docs = await append_documents(redis_client, 7)
    entries = await asyncio.to_thread(read, spark, redis_url, docsPerPartition="3")
    assert await asyncio.to_thread(entries.rdd.getNumPartitions) == 3
    assert [row[0] for row in await asyncio.to_thread(rows_of, entries)] == docs
    one = await asyncio.to_thread(read, spark, redis_url, kind="tracker")
    assert await asyncio.to_thread(one.rdd.getNumPartitions) == 1


def test_an_empty_redis_gives_empty_tables(spark, redis_url):
    entries, tracker = redis_tables(spark, redis_url)
    assert (entries.schema.simpleString(), tracker.schema.simpleString()) == (ENTRIES_DDL, TRACKER_DDL)
    assert entries.count() == 0 and tracker.count() == 0
    assert redis_tables(spark, redis_url, [])[0].count() == 0


def test_bad_options_and_unreachable_redis_are_named(spark, redis_url):
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    register(spark)
    with pytest.raises(AnalysisException, match="needs option 'url'"):
        spark.read.format("yrelay").load()
    with pytest.raises(AnalysisException, match="option 'kind' is 'streams'; expected one of 'entries', 'tracker'"):
        read(spark, redis_url, kind="streams")
    with pytest.raises(AnalysisException, match="option 'docsPerPartition' is 'many'"):
        read(spark, redis_url, docsPerPartition="many")
    with pytest.raises(AnalysisException, match=f"cannot reach Redis at {nowhere}"):
        read(spark, nowhere, docs="notes").collect()
    with pytest.raises(AnalysisException, match="has a fixed schema"):
        spark.read.format("yrelay").schema("doc string").option("url", redis_url).load().collect()

    with pytest.raises(RedisUnreachable, match=f"cannot reach Redis at {nowhere}"):
        redis_tables(spark, nowhere)
    with pytest.raises(RedisUnreachable, match=r"redis://:\*\*\*@127"):
        redis_tables(spark, nowhere.replace("//", "//:hunter2@"))
    with pytest.raises(SourceOptionError, match="expected a redis, rediss, unix URL"):
        redis_tables(spark, "http://localhost:6379")
    with pytest.raises(SourceOptionError, match="option 'docs': 'no spaces'"):
        redis_tables(spark, redis_url, ["no spaces"])


# ---------------------------------------------- paging and batching, no Spark


async def test_pages_cover_every_key_exactly_once(redis_url, redis_client):
    store = DocumentStore(redis_client)
    await store.load_scripts()
    for clock in range(23):
        await append_one(store, "long", "writer-session-0001", clock, bytes(clock))
    await redis_client.zadd(tracker_key("long"), {f"session-{n:02d}": n * 1000 for n in range(9)})
    docs = await append_documents(redis_client, 5)
    with redis.Redis.from_url(redis_url) as client:
        assert list(registered_documents(client, page=2)) == sorted([*docs, "long"])
        paged = [entry for page in stream_pages(client, "long", page=4) for entry in page]
        assert paged == client.xrange(stream_key("long"))
        assert [len(page) for page in stream_pages(client, "long", after=paged[19][0].decode(), page=4)] == [3]
        ranks = [row for page in tracker_pages(client, "long", page=4) for row in page]
        assert ranks == [(f"session-{n:02d}", n * 1000) for n in range(9)]


async def test_capped_lag_is_the_ops_lower_bound(redis_url, redis_client):
    store = DocumentStore(redis_client)
    await store.load_scripts()
    ids = [
        StreamId.parse((await append_one(store, "doc", "writer-session-0001", clock, b"u"))[0]) for clock in range(30)
    ]
    await redis_client.zadd(tracker_key("doc"), {"behind": ids[2].score(), "middle": ids[20].score()})
    status = await document_status(redis_client, "doc", with_sessions=True, count_cap=10)
    want = {lag.session: lag.lag_entries for lag in status.sessions or []}
    with redis.Redis.from_url(redis_url) as client:
        rows = list(tracker_rows(client, "doc", lag_cap=10))
    assert {row[1]: row[5] for row in rows} == want == {"behind": 10, "middle": 0}


def test_rows_are_cut_into_batches_of_the_schema():
    rows = [("d", f"s{n}", f"{n}-0", n * 1000, n, 0, 0) for n in range(10)]
    batches = list(arrow_batches(iter(rows), TRACKER_SCHEMA, size=4))
    assert [batch.num_rows for batch in batches] == [4, 4, 2]
    assert all(batch.schema.equals(TRACKER_SCHEMA) for batch in batches)
    assert list(arrow_batches(iter([]), TRACKER_SCHEMA)) == []
