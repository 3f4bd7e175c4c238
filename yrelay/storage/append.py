"""The one append: every write to a document's stream goes through the
:class:`Appender` and its ``append`` Lua script (:func:`append_one` is the
same path for one update, for tools, benches and tests).

Group commit: everything submitted during one Redis round trip
goes out together, one append-script call per document, in one pipeline.

On this machine batching is the difference between ~10k and ~60k XADD/s. Order
is kept: updates of one document are appended in the order they were submitted.
A failing document (say, a key of the wrong type) fails only its own updates.
The same pipeline marks the documents as changed for GC (``listing.mark_changed``)
and, on one Redis, announces them to the fan-outs (:mod:`yrelay.storage.change_feed`).

The script admits an update only if the document can apply it (causal
admission, :mod:`yrelay.yjs.admission`). A refused update fails with
:class:`NotAdmitted`, except a sync push (a diff that may carry content its
sender could not apply either): its causally ready part is submitted again
in its place, and what was left out is reported with the result.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

from redis.exceptions import NoScriptError
from redis.typing import EncodableT

from yrelay.storage import packed
from yrelay.storage.change_feed import announce, announce_in
from yrelay.storage.client import UNREACHABLE
from yrelay.storage.clocks import bring_clocks_up_to_date
from yrelay.storage.keys import clocks_key, dedup_key, meta_key, stream_key
from yrelay.storage.listing import mark_changed
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import DocumentStore
from yrelay.storage.replicas import ReplicationTimeout, ReplicaWait
from yrelay.storage.replies import text
from yrelay.storage.tombstones import is_deleted_error, unlist
from yrelay.tasks import BackgroundTask, TaskSet
from yrelay.yjs.admission import Needs, needs_of, ready_part
from yrelay.yjs.update_format import Layout, MalformedUpdate, Ranges, read_layout

log = logging.getLogger(__name__)

#: The key layout this server writes (``meta.layout``); the append script
#: refuses a document written by a newer one (rolling upgrades).
LAYOUT = 2


class NotAdmitted(Exception):
    """The document cannot apply the update (causal admission refused it)."""

    def __init__(self, lacking: dict[int, int], state: dict[int, int]):
        super().__init__(f"missing content of Yjs clients {sorted(lacking)}")
        #: Clients whose content the update lacks -> the document's clock.
        self.lacking = lacking
        #: Every client the update involves -> the document's clock.
        self.state = state


@dataclass(frozen=True)
class AppendResult:
    """An update's place in the stream (``entry_id`` None: nothing of a sync
    push could be stored)."""

    entry_id: str | None
    duplicate: bool
    #: A sync push's struct ranges left out (the document cannot apply them).
    dropped: Ranges = field(default_factory=dict)


@dataclass
class _Item:
    doc: str
    session: str
    clock: int
    update: bytes
    needs: Needs
    future: asyncio.Future[AppendResult]
    #: Set for a sync push not split yet: its layout, to cut the ready part.
    split: Layout | None = None
    dropped: Ranges = field(default_factory=dict)


class Appender:
    """The process's group commit (module doc); ``submit`` queues, a
    background loop sends each round trip's queue as one batch."""

    def __init__(
        self,
        store: DocumentStore,
        replicas: ReplicaWait | None = None,
        announce: Callable[[list[str]], Coroutine[Any, Any, None]] | None = None,
        stored: Callable[[str, StreamId], None] | None = None,
    ):
        self.store = store
        #: Told of each entry its writer is answered with (the fan-out checks
        #: them after a failover: :mod:`yrelay.storage.rewind`), before the answer.
        self.stored = stored
        #: ``ack_replicas``: each batch ends with a WAIT (:mod:`.replicas`).
        self.replicas = replicas
        #: Told of each batch's documents once it is stored (the cluster
        #: wake-up: :func:`yrelay.storage.change_feed.announce_buckets`).
        self.announce = announce
        self._pending: list[_Item] = []
        self._wake = asyncio.Event()
        self._loop = BackgroundTask("yrelay-appender", self._run)
        #: State-vector rebuilds and sync-push cuts under way (kept: the loop
        #: holds tasks weakly).
        self._side_tasks = TaskSet("yrelay-appender-side")

    def start(self) -> None:
        self._loop.start()

    async def settle(self) -> None:
        """Wait for the side work under way (a refused document's unlisting,
        state-vector rebuilds): :func:`append_one` stops its appender right
        after its update's answer, and must not cancel what goes with it."""
        await self._side_tasks.wait()

    async def stop(self) -> None:
        await self._loop.stop()  # first: nothing spawns side tasks after their cancel
        self._side_tasks.cancel()
        await self._side_tasks.wait()
        for item in self._pending:
            item.future.cancel()

    def submit(
        self, doc: str, session: str, clock: int, update: bytes, needs: Needs, sync_layout: Layout | None = None
    ) -> asyncio.Future[AppendResult]:
        """Queue one update; the future resolves once it is in the stream, or
        fails with :class:`NotAdmitted`. ``sync_layout`` marks a sync push."""
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        self._queue(_Item(doc, session, clock, update, needs, future, sync_layout))
        return future

    def _queue(self, item: _Item) -> None:
        self._pending.append(item)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            if batch:
                await self._append_batch(batch)

    async def _append_batch(self, batch: list[_Item]) -> None:
        by_doc: dict[str, list[_Item]] = defaultdict(list)
        for item in batch:
            by_doc[item.doc].append(item)
        try:
            async with packed.pipeline(self.store.redis) as pipe:  # packed on a standalone Redis
                for doc, items in by_doc.items():
                    args = append_args([(i.session, i.clock, i.update, i.needs) for i in items])
                    await self.store.scripts.append(keys=append_keys(doc), args=args, client=pipe)
                mark_changed(pipe, list(by_doc))
                announce_in(pipe, list(by_doc))
                wait_of: dict[str, int] = {}
                if self.replicas is not None:  # on the connection(s) of the writes, after them
                    wait_of = self.replicas.queue(pipe, {doc: append_keys(doc)[0] for doc in by_doc})
                results = await pipe.execute(raise_on_error=False)
                await self._load_and_rerun(pipe, results, list(by_doc))
            unconfirmed = await self._unconfirmed(list(by_doc), results, wait_of)
        except Exception as exc:  # noqa: BLE001 - whatever failed the batch (Redis unreachable), every caller gets it
            log.warning("append batch failed: %s", exc)
            for item in batch:
                _fail(item, exc)
            return
        if self.announce is not None:
            self._side_tasks.spawn(self.announce(list(by_doc)))
        # the replies after the scripts' are the batch's own
        for (doc, items), result in zip(by_doc.items(), results, strict=False):
            if result == [b"stale"]:
                self._side_tasks.spawn(self._catch_up_then_retry(doc, items))
            else:
                self._resolve(doc, items, result, doc not in unconfirmed)

    async def _load_and_rerun(self, pipe: object, results: list[Any], docs: list[str]) -> None:
        """Packed, the batch skips redis-py's ``SCRIPT EXISTS`` before every
        batch (a round trip): appends refused NOSCRIPT (Redis restarted
        without its script cache) run again, with the WAIT after them, once
        the script is loaded; their replies replace the refusals in
        ``results``, and they are announced again (the batch's announcement
        came before them). Nothing else of the batch runs twice."""
        if not isinstance(pipe, packed.Batch):
            return
        refused = [doc for doc, result in zip(docs, results, strict=False) if isinstance(result, NoScriptError)]
        wait = pipe.commands[-1:] if self.replicas is not None else []
        waited = await packed.rerun_refused_scripts(pipe, results, [self.store.scripts.append], then=wait)
        if wait and waited:
            results[-1] = waited[-1]
        if refused:
            await announce(self.store.redis, refused)

    async def _unconfirmed(self, docs: list[str], results: list[Any], wait_of: dict[str, int]) -> set[str]:
        """The documents whose entries ``ack_replicas`` replicas did not
        confirm. Each document's WAIT is the one of its node (``wait_of``:
        its index among the pipeline's last replies; one WAIT on one Redis):
        a slow replica of one shard holds back that shard's documents only.
        A WAIT whose documents were all resends answered from the dedup
        covered no write of theirs, so it waits again behind a probe write."""
        if self.replicas is None:
            return set()
        waits = max(wait_of.values()) + 1
        replies = results[-waits:]
        groups: dict[int, list[str]] = defaultdict(list)
        for doc in docs:
            groups[wait_of[doc]].append(doc)
        unconfirmed: set[str] = set()
        for index, members in groups.items():
            codes = {
                entry[1]
                for doc, result in zip(docs, results, strict=False)  # the WAITs' replies follow
                if doc in members and isinstance(result, list)
                for entry in result
                if isinstance(entry, list) and len(entry) > 1
            }
            if not self.replicas.enough([replies[index]]) or (
                1 in codes and 0 not in codes and not await self.replicas.after_read_only(self.store.redis, members[0])
            ):
                unconfirmed.update(members)
        return unconfirmed

    async def _catch_up_then_retry(self, doc: str, items: list[_Item]) -> None:
        """The document holds entries its clocks do not account for yet
        (written before admission): rebuild them, then append again."""
        try:
            await bring_clocks_up_to_date(self.store, doc)
        except Exception as exc:  # noqa: BLE001 - the items' senders get whatever failed the rebuild
            log.warning("rebuilding the state vector of %s failed: %s", doc, exc, extra={"doc": doc})
            for item in items:
                _fail(item, exc)
            return
        for item in items:
            self._queue(item)

    def _resolve(self, doc: str, items: list[_Item], result: object, replicated: bool = True) -> None:
        if isinstance(result, Exception):
            if is_deleted_error(result):  # the client's news, not ours; the batch's mark_changed listed it again
                self._side_tasks.spawn(unlist(self.store.redis, doc))
            else:  # a node out of reach (failover) is no fault of the document
                level = logging.WARNING if isinstance(result, UNREACHABLE) else logging.ERROR
                log.log(level, "append to %s failed: %s", doc, result, extra={"doc": doc})
            for item in items:
                _fail(item, result)
            return
        rows = cast("list[list[Any]]", result)  # the append script's reply: a row per item
        for item, (entry_id, code, *refusal) in zip(items, rows, strict=True):
            if code != 2 and not replicated:  # stored, not confirmed: the client resends
                _fail(item, ReplicationTimeout(text(entry_id)))
            elif code != 2:
                if self.stored is not None:
                    self.stored(doc, StreamId.parse(text(entry_id)))
                _succeed(item, AppendResult(text(entry_id), bool(code), item.dropped))
            elif item.split is not None:
                self._side_tasks.spawn(self._append_ready_part(item, flat_clocks(refusal[1])))
            else:
                _fail(item, NotAdmitted(flat_clocks(refusal[0]), flat_clocks(refusal[1])))

    async def _append_ready_part(self, item: _Item, clocks: dict[int, int]) -> None:
        """A refused sync push: submit the part the document can apply (the
        clocks only grow, so it is admitted unless Redis lost data meanwhile).
        Cut in a thread: a push may be 16 MiB of structs."""
        assert item.split is not None
        try:
            part = await asyncio.to_thread(ready_part, item.update, item.split, clocks)
        except Exception as exc:  # noqa: BLE001 - never leave the sender without an answer
            log.warning("cutting a sync push of %s failed: %s", item.doc, exc, extra={"doc": item.doc})
            _fail(item, exc)
            return
        if part.update is None:
            _succeed(item, AppendResult(None, False, part.dropped))
            return
        self._queue(
            _Item(item.doc, item.session, item.clock, part.update, part.needs, item.future, dropped=part.dropped)
        )


def _succeed(item: _Item, result: AppendResult) -> None:
    if not item.future.done():
        item.future.set_result(result)


def _fail(item: _Item, exc: BaseException) -> None:
    if not item.future.done():
        item.future.set_exception(exc)


async def append_one(
    store: DocumentStore, doc: str, session: str, clock: int, update: bytes, needs: Needs | None = None
) -> tuple[str, bool]:
    """Append one update, unvalidated, through an :class:`Appender` of its
    own (servers validate and keep one; tools, benches and tests use this).
    ``needs`` defaults to :func:`needs_or_nothing`. The entry id and whether
    it was a resend answered from the dedup; raises :class:`NotAdmitted`
    when the document cannot apply it."""
    # Loaded first, as a pipeline of redis-py did: not refused NOSCRIPT, run again and announced twice.
    await store.redis.script_load(store.scripts.append.script)
    appender = Appender(store)
    appender.start()
    future = appender.submit(doc, session, clock, update, needs_or_nothing(update) if needs is None else needs)
    try:
        await asyncio.wait({future})  # a refusal too: the side work it leaves ends before it is raised
        await appender.settle()
    finally:
        await appender.stop()
    result = future.result()
    assert result.entry_id is not None  # None only for a sync push
    return result.entry_id, result.duplicate


def append_keys(doc: str) -> list[str]:
    """KEYS of the append script, in its order."""
    return [stream_key(doc), meta_key(doc), dedup_key(doc), clocks_key(doc)]


def append_args(items: list[tuple[str, int, bytes, Needs]]) -> list[EncodableT]:
    """ARGV of the append script for ``(session, clock, update, needs)`` items."""
    args: list[EncodableT] = [LAYOUT]
    for session, clock, update, needs in items:
        args += [session, clock, update, *needs.script_args()]
    return args


def flat_clocks(flat: list[bytes]) -> dict[int, int]:
    """``[client, clock, client, clock, ...]`` from the script -> a dict."""
    return {int(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}


def needs_or_nothing(update: bytes) -> Needs:
    """What ``update`` needs to apply; nothing when it does not decode (for
    tools that append without the server's validation: benches, seeding)."""
    try:
        return needs_of(read_layout(update))
    except MalformedUpdate:
        return Needs()
