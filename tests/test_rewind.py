"""A stream that went back (a failover to a replica that lagged, a restore)
is found for every reader, whoever read the entries it lost: the fan-out,
or a subscriber that read ahead of it (a /yws feed's sync answer and its
catch-up, a /ws sync answer). Issue 39: a /yws client whose server had just
restarted held entries its fan-out had never read; the check after the
failover looked only at the fan-out's ids and the connection stayed open.

On one Redis, with the loss made by hand (dump, append, restore): fast and
exact. tests/test_yws_failover.py runs the same on a real cluster."""

from __future__ import annotations

import pycrdt
import pytest

from conftest import eventually
from gcutil import dump_document
from test_drift import restore_document
from yrelay.app.context import ServerContext
from yrelay.app.core.subscription import SubscriptionState
from yrelay.app.fanout import Fanout
from yrelay.app.subscribers import SubscriptionRegistry
from yrelay.app.wire.yws import CLOSE_REWOUND
from yrelay.config import Settings
from yrelay.gc.deletion import delete_document
from yrelay.storage.append import append_one
from yrelay.storage.keys import meta_key, stream_key
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import DocumentStore, StreamRewound
from yrelay.yjs import yprotocol
from ywspeer import untracked_subscription


class Source:
    """One Yjs writer's updates, appended straight to the store."""

    def __init__(self, store: DocumentStore, doc: str, client_id: int):
        self.store, self.doc = store, doc
        self.ydoc = pycrdt.Doc(client_id=client_id)
        self.text = self.ydoc.get("text", type=pycrdt.Text)
        self.clock = 0

    async def write(self, word: str) -> StreamId:
        state = self.ydoc.get_state()
        self.text += word
        entry_id, _ = await append_one(
            self.store, self.doc, f"writer-{self.ydoc.client_id}", self.clock, self.ydoc.get_update(state)
        )
        self.clock += 1
        return StreamId.parse(entry_id)


async def lose_tail(redis_client, store: DocumentStore, doc: str) -> tuple[StreamId, StreamId]:
    """``doc`` gets an entry, then loses it, then gets another from another
    writer: (the lost id, the new one), the new one after the lost one."""
    backup = await dump_document(redis_client, doc)
    lost = await Source(store, doc, 7).write("<lost>")
    await restore_document(redis_client, doc, backup)
    new = await Source(store, doc, 8).write("<new>")
    assert new > lost
    return lost, new


async def test_a_held_read_raises_when_its_start_is_gone_not_when_trimmed_or_deleted(redis_client):
    store = DocumentStore(redis_client)
    first = await Source(store, "doc", 5).write("<first>")
    lost, new = await lose_tail(redis_client, store, "doc")
    assert [entry.id for entry in await store.read_page("doc", lost, 10)] == [new]  # what a reader used to get
    with pytest.raises(StreamRewound):
        await store.read_page("doc", lost, 10, held=True)
    assert [entry.id for entry in await store.read_page("doc", first, 10, held=True)] == [new]

    await redis_client.xdel(stream_key("doc"), str(first))  # as GC's trim leaves it
    await redis_client.hset(meta_key("doc"), "trimmed_through", str(first))
    assert [entry.id for entry in await store.read_page("doc", first, 10, held=True)] == [new]

    await delete_document(redis_client, "doc", 60)  # the marker follows: the reader learns of the deletion
    assert len(await store.read_page("doc", new, 10, held=True)) == 1


async def test_the_check_after_a_failure_looks_for_what_each_subscriber_was_sent(redis_client):
    """The fan-out had read the document up to an entry that survived; a
    subscriber had been sent one more (read by itself), which the stream
    lost: that subscriber's document is found rewound."""
    store = DocumentStore(redis_client)
    await Source(store, "ahead", 5).write("<first>")
    await Source(store, "behind", 5).write("<first>")
    fanout = Fanout(redis_client, store, SubscriptionRegistry(), block_ms=1000, count=100)  # its loop not started

    class Reader:
        def __init__(self, doc: str):
            self.doc, self.session, self.cursor, self.rewound = doc, f"reader-{doc}", None, 0

        def stream_rewound(self) -> None:
            self.rewound += 1

    ahead, behind = Reader("ahead"), Reader("behind")
    ahead.cursor = await fanout.register(ahead)
    behind.cursor = await fanout.register(behind)
    ahead.cursor, _ = await lose_tail(redis_client, store, "ahead")  # sent to it, never read by the fan-out
    await lose_tail(redis_client, store, "behind")  # lost too, but nobody here had it

    fanout.documents.failed()  # the reader saw Redis fail
    await fanout.documents._check_rewound()
    assert (ahead.rewound, behind.rewound) == (1, 0)


async def test_a_feed_whose_answer_the_stream_lost_closes_instead_of_skipping_on(redis_client, redis_url):
    """The sync answer held an entry the stream then lost, and a new entry
    came after: the feed must not send the new one as if it followed (the
    client would hold what the server lost and never be told): it closes
    with 1013, so the client's reconnect sync gives it back."""
    ctx = await ServerContext.open(Settings.from_env(insecure_no_auth=True), redis_url)
    try:
        await Source(ctx.store, "answered", 5).write("<first>")
        lost, _ = await lose_tail(redis_client, ctx.store, "answered")
        feed, socket = untracked_subscription(ctx, "answered")
        await eventually(lambda: feed.state is SubscriptionState.RESYNC_REQUIRED)  # waits for the client's sync
        feed.live_from(lost)  # what its sync answer had been read up to
        await eventually(lambda: socket.closed)
        assert socket.closed[0][0] == CLOSE_REWOUND and not socket.sent, (
            socket.closed,
            [yprotocol.decode(s) for s in socket.sent],
        )
        await feed.close()
    finally:
        await ctx.close()
