"""An asyncio yrelay client that binds y-py documents to a server.

It is the reference implementation of docs/protocol.md on the client side,
and what the tests, the checker and the benchmarks drive.

Guarantees it keeps: every local change stays in the send buffer until the
server acks it (appended to the stream), and is resent with exponential
backoff + jitter; after ``max_attempts`` the client reconnects and resyncs
every document in full (a two-way state-vector exchange). Deliveries are
acked cumulatively per document once applied.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import websockets
from websockets.exceptions import ConnectionClosed

from yrelay import protocol
from yrelay.reconciliation import ReconciliationError
from yrelay.reconciliation.digest import Digest
from yrelay.reconciliation.held_entries import HeldEntries
from yrelay.storage.offsets import StreamId
from yrelay.yjs import crdt

from .backoff import Backoff
from .persistence import ClientStateFile, PersistedDocument, PersistedState, PersistedUpdate
from .sendbuffer import SendBuffer
from .subscription_check import SubscriptionCheck, compare_subscriptions

log = logging.getLogger(__name__)

#: Errors after which resending the same update can never succeed.
FATAL_UPDATE_ERRORS = {
    "invalid_update",
    "update_too_large",
    "malformed_frame",
    "invalid_doc_id",
    "frame_too_large",
    "forbidden",
}


class RetryLater(ConnectionError):
    """The server refused the connection (``overloaded``, ``too_many_connections``)."""

    def __init__(self, frame: dict[str, Any]):
        super().__init__(f"{frame.get('code')}: {frame.get('message')}")
        self.delay = float(frame.get("retry_after_ms") or 0) / 1000


@dataclass
class AckedUpdate:
    """An update the server confirmed is in the stream (for checkers)."""

    doc: str
    clock: int
    id: str
    update: bytes


@dataclass
class ClientDocument:
    """One subscribed document: its y-py doc and its place in the stream."""

    name: str
    ydoc: crdt.Doc
    offset: str | None = None
    #: Set when the client gave up resending: resync in full on resubscribe.
    needs_sync: bool = False
    #: Stream ids held, for the drift digest sent on every resubscribe.
    held: HeldEntries = field(default_factory=HeldEntries)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    _parts: list[bytes] = field(default_factory=list)
    _batch: list[bytes] = field(default_factory=list)
    _batch_timer: asyncio.TimerHandle | None = None
    _replica: crdt.Replica | None = None

    @property
    def replica(self) -> crdt.Replica:
        if self._replica is None:
            self._replica = crdt.Replica(self.ydoc)
        return self._replica

    @property
    def text(self) -> str:
        return crdt.text_of(self.ydoc)


class YrelayClient:
    def __init__(
        self,
        url: str | list[str],
        *,
        session: str | None = None,
        backoff: Backoff = Backoff(),  # noqa: B008 - a frozen dataclass: one shared default is safe
        batch_delay: float = 0.0,
        subscription_check_interval: float | None = 300.0,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        state_file: ClientStateFile | None = None,
        persist_interval: float = 1.0,
        token: str | Callable[[], str] | None = None,
    ):
        """``batch_delay`` > 0 turns on Nagle-like batching: local updates of a
        document made within that many seconds are merged into one send.
        ``subscription_check_interval``: seconds between checks of the whole
        subscription set against the server's (None: only on request).
        ``state_file``: persist the session, documents and unacked updates
        there (:mod:`yrelay.client.persistence`) and start from what it holds;
        local edits are journaled before they are sent, everything else is
        written at most ``persist_interval`` seconds after it changed.
        ``token``: the credential sent in ``hello`` (docs/security.md); a
        callable is asked again on every reconnect, so it can refresh it."""
        #: Servers to try, in turn, on every reconnect.
        self.urls = [url] if isinstance(url, str) else list(url)
        self.session = session
        self.token = token
        self.backoff = backoff
        self.batch_delay = batch_delay
        self.subscription_check_interval = subscription_check_interval
        self.on_event = on_event
        self.docs: dict[str, ClientDocument] = {}
        self.buffer = SendBuffer(backoff)
        self.acked: list[AckedUpdate] = []
        self.errors: list[dict[str, Any]] = []
        self.resyncs = 0
        #: Resubscribes where the drift digests differed (either side noticed).
        self.drifts = 0
        self.connected = asyncio.Event()
        self._ws: Any = None
        self._applying_remote = False
        self._closing = False
        self._runner: asyncio.Task[None] | None = None
        self._answers: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._refs = itertools.count(1)
        self._check_lock = asyncio.Lock()
        self.state_file = state_file
        self.persist_interval = persist_interval
        self._dirty = False
        self._persister: asyncio.Task[None] | None = None
        if state_file is not None:
            self._restore(state_file.load())

    # ------------------------------------------------------------- public API

    async def connect(self, timeout: float = 10.0) -> YrelayClient:
        self._runner = asyncio.create_task(self._run(), name="yrelay-client")
        if self.state_file is not None:
            self._persister = asyncio.create_task(self._persist_loop(), name="yrelay-client-persist")
        await asyncio.wait_for(self.connected.wait(), timeout)
        return self

    async def close(self) -> None:
        self._closing = True
        if self._ws is not None:
            await self._ws.close()
        for task in (self._runner, self._persister):
            if task:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.state_file is not None:
            self.persist()
            self.state_file.close()

    async def __aenter__(self) -> YrelayClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def subscribe(self, name: str, ydoc: crdt.Doc | None = None, timeout: float = 10.0) -> ClientDocument:
        """Bind ``ydoc`` (a new one by default) to document ``name`` and wait
        until it holds the server's state. With a state file, a document it
        restored is returned as it is (it resubscribed on connect)."""
        restored = self.docs.get(name) if self.state_file is not None and ydoc is None else None
        if restored is not None:
            await asyncio.wait_for(restored.synced.wait(), timeout)
            return restored
        doc = ClientDocument(name, ydoc if ydoc is not None else crdt.new_doc())
        self.docs[name] = doc
        crdt.observe_updates(doc.ydoc, lambda update: self._local_update(doc, update))
        await self._send_quietly(_subscribe_frame(doc))
        await asyncio.wait_for(doc.synced.wait(), timeout)
        return doc

    async def unsubscribe(self, name: str) -> None:
        self.docs.pop(name, None)
        await self._send_quietly({"op": "unsubscribe", "doc": name})

    @property
    def pending(self) -> int:
        return len(self.buffer) + sum(len(doc._batch) for doc in self.docs.values())

    async def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until every local change is acked."""

        async def idle() -> None:
            while self.pending:
                await asyncio.sleep(0.02)

        await asyncio.wait_for(idle(), timeout)

    async def check_subscriptions(self, timeout: float = 30.0) -> SubscriptionCheck:
        """Compare the subscribed documents with those the server tracks for
        this session; re-create missing subscriptions (with a resync) and
        remove extra ones. Documents still waiting for their first answer
        are left out (the server may not have tracked them yet)."""
        async with self._check_lock:
            documents = [name for name, doc in self.docs.items() if doc.synced.is_set()]
            check = await asyncio.wait_for(compare_subscriptions(documents, self._request), timeout)
            for name in check.missing:
                doc = self.docs[name]
                doc.needs_sync = True
                doc.synced.clear()
                await self._send_quietly(_subscribe_frame(doc))
            for name in check.extra:
                if name not in self.docs:  # not one still waiting for its first answer
                    await self._send_quietly({"op": "unsubscribe", "doc": name})
            if not check.in_sync:
                self._emit("subscriptions_repaired", {"missing": check.missing, "extra": check.extra})
            return check

    async def _request(self, frame: dict[str, Any], answer_op: str) -> dict[str, Any]:
        """Send ``frame`` with a fresh ``ref`` and wait for the ``answer_op``
        frame echoing it (a late answer to an abandoned request is ignored)."""
        ws = self._ws
        if ws is None:
            raise ConnectionError("not connected")
        ref = next(self._refs)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._answers[ref] = future
        try:
            await ws.send(json.dumps({**frame, "ref": ref}))
            answer = await future
        finally:
            self._answers.pop(ref, None)
        if answer["op"] != answer_op:
            raise ConnectionError(f"expected {answer_op}, got {answer['op']}")
        return answer

    def _answer(self, frame: dict[str, Any]) -> None:
        future = self._answers.get(frame.get("ref", -1))
        if future is not None and not future.done():
            future.set_result(frame)

    _on_subscriptions = _answer
    _on_reconcile_reply = _answer

    async def _check_loop(self) -> None:
        assert self.subscription_check_interval is not None
        while True:
            await asyncio.sleep(self.subscription_check_interval)
            try:
                await self.check_subscriptions()
            except (TimeoutError, ConnectionError, ConnectionClosed, ReconciliationError) as exc:
                log.info("subscription check did not finish: %r", exc)

    async def drop_connection(self) -> None:
        """Close the socket (tests, network changes): the client reconnects by itself."""
        if self._ws is not None:
            await self._ws.close(code=4000)

    # ------------------------------------------------------------ local edits

    def _local_update(self, doc: ClientDocument, update: bytes) -> None:
        if self._applying_remote:
            return
        if self.batch_delay <= 0:
            self._enqueue(doc.name, update)
            return
        doc._batch.append(update)
        self._journal(0, doc.name, update)
        if doc._batch_timer is None:
            loop = asyncio.get_running_loop()
            doc._batch_timer = loop.call_later(self.batch_delay, self._flush_batch, doc)

    def _flush_batch(self, doc: ClientDocument) -> None:
        doc._batch_timer = None
        updates, doc._batch = doc._batch, []
        if updates:
            self._enqueue(doc.name, updates[0] if len(updates) == 1 else crdt.merge_updates(updates))

    def _enqueue(self, doc: str, update: bytes) -> None:
        item = self.buffer.add(doc, update)
        self._journal(item.clock, doc, update)  # write-ahead: an update the server acks is always on disk
        if self.connected.is_set():
            self.buffer.mark_sent(item)
            asyncio.ensure_future(self._send_quietly(_update_frame(item)))

    # ------------------------------------------------------------ connection

    async def _run(self) -> None:
        attempt = 0
        while not self._closing:
            retry_after = 0.0
            url = self.urls[attempt % len(self.urls)]
            try:
                async with websockets.connect(url, max_size=None, open_timeout=10) as ws:
                    self._ws = ws
                    await self._handshake(ws)
                    attempt = 0
                    helpers = [asyncio.create_task(self._retry_loop())]
                    if self.subscription_check_interval:
                        helpers.append(asyncio.create_task(self._check_loop()))
                    try:
                        async for message in ws:
                            self._handle(json.loads(message))
                    finally:
                        for helper in helpers:
                            helper.cancel()
            except asyncio.CancelledError:
                raise
            except (TimeoutError, OSError, ConnectionClosed, websockets.InvalidHandshake) as exc:
                log.debug("connection lost: %r", exc)
                retry_after = getattr(exc, "delay", 0.0)  # RetryLater: the server said when
            finally:
                self._ws = None
                self.connected.clear()
            if self._closing:
                return
            self._emit("disconnected", {})
            await asyncio.sleep(max(self.backoff.delay(attempt), retry_after))
            attempt += 1

    async def _handshake(self, ws: Any) -> None:
        token = self.token() if callable(self.token) else self.token
        try:
            await ws.send(json.dumps({"op": "hello", "session": self.session, "token": token}))
        except ConnectionClosed:
            pass  # refused: its error frame (read below) came before the close
        welcome = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if welcome.get("op") == "error" and "retry_after_ms" in welcome:
            raise RetryLater(welcome)
        if welcome.get("op") == "error":  # e.g. unauthorized: kept for the app, then retried with backoff
            self._on_error(welcome)
        if welcome.get("op") != "welcome":
            raise ConnectionError(f"expected welcome, got {welcome}")
        self.session = welcome["session"]
        self.persist()  # a crash from here on resumes this session
        for doc in self.docs.values():
            doc.synced.clear()
            await ws.send(json.dumps(_subscribe_frame(doc)))
        self.buffer.reset_attempts()
        for item in self.buffer.all():
            self.buffer.mark_sent(item)
            await ws.send(json.dumps(_update_frame(item)))
        self.connected.set()
        self._emit("connected", {"session": self.session, "resumed": welcome["resumed"]})

    async def _retry_loop(self) -> None:
        """Resend unacked updates on their backoff schedule; past the maximum
        number of attempts, reconnect and resync every document in full."""
        while True:
            await asyncio.sleep(0.05)
            if self.buffer.exhausted():
                log.warning(
                    "updates unacked after %d attempts: reconnecting for a full resync", self.backoff.max_attempts
                )
                for doc in self.docs.values():
                    doc.needs_sync = True
                if self._ws is not None:
                    await self._ws.close(code=4000)
                return
            for item in self.buffer.due():
                self.buffer.mark_sent(item)
                await self._send_quietly(_update_frame(item))

    async def _send_quietly(self, frame: dict[str, Any]) -> None:
        ws = self._ws
        if ws is None:
            return  # sent again after the next handshake
        try:
            await ws.send(json.dumps(frame))
        except ConnectionClosed:
            pass

    def _emit(self, event: str, data: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(event, data)

    # ------------------------------------------------------------ server frames

    def _handle(self, frame: dict[str, Any]) -> None:
        handler = getattr(self, f"_on_{frame.get('op')}", None)
        if handler is None:
            log.warning("unexpected frame %s", str(frame)[:200])
            return
        handler(frame)
        self._dirty = True

    def _on_appended(self, frame: dict[str, Any]) -> None:
        item = self.buffer.pop(frame["clock"])
        doc = self.docs.get(frame["doc"])
        if doc is not None:
            doc.held.add(StreamId.parse(frame["id"]))  # also for a late or duplicate answer
        if item is not None:
            self.acked.append(AckedUpdate(item.doc, item.clock, frame["id"], item.update))
            self._emit("appended", frame)

    def _on_deliver(self, frame: dict[str, Any]) -> None:
        doc = self.docs.get(frame["doc"])
        if doc is None:
            return
        for entry in frame["entries"]:
            self._apply_remote(doc, protocol.b64decode(entry["update"]))
            doc.offset = _max_offset(doc.offset, entry["id"])
            doc.held.add(StreamId.parse(entry["id"]))
        self._ack(doc)

    def _on_subscribed(self, frame: dict[str, Any]) -> None:
        doc = self.docs.get(frame["doc"])
        if doc is None:
            return
        doc.offset = _max_offset(doc.offset, frame["offset"])
        if "digest" in frame and not self._digest_agrees(doc, frame):
            doc.needs_sync = False  # the sync below covers it
            self.drifts += 1
            self._emit("drift", {"doc": doc.name, "server": frame["digest"]})
            self._request_sync(doc)
        elif doc.needs_sync:
            doc.needs_sync = False
            self._request_sync(doc)
        else:
            doc.synced.set()

    @staticmethod
    def _digest_agrees(doc: ClientDocument, frame: dict[str, Any]) -> bool:
        """Compare with the server's digest over its window (which starts
        at or after ours: GC may have trimmed past our base)."""
        server = frame["digest"]
        doc.held.rebase(StreamId.parse(server["since"]))
        ours = doc.held.digest(StreamId.parse(server.get("through", frame["offset"])))
        return ours == Digest(count=server["count"], hash=int(server["hash"], 16))

    def _on_snapshot(self, frame: dict[str, Any]) -> None:
        doc = self.docs.get(frame["doc"])
        if doc is None:
            return
        update = self._collect(doc, frame)
        if update is not None:
            self._apply_remote(doc, update)
            doc.offset = _max_offset(doc.offset, frame["offset"])
            self._ack(doc)

    def _on_resync_required(self, frame: dict[str, Any]) -> None:
        doc = self.docs.get(frame["doc"])
        if doc is not None:
            if frame.get("reason") == "drift":
                self.drifts += 1
            self._emit("resync_required", frame)
            self._request_sync(doc)

    def _request_sync(self, doc: ClientDocument) -> None:
        self.resyncs += 1
        doc._parts.clear()
        vector = protocol.b64encode(crdt.state_vector(doc.ydoc))
        asyncio.ensure_future(self._send_quietly({"op": "sync", "doc": doc.name, "state_vector": vector}))

    def _on_sync_reply(self, frame: dict[str, Any]) -> None:
        doc = self.docs.get(frame["doc"])
        if doc is None:
            return
        update = self._collect(doc, frame)
        if update is None:
            return
        self._apply_remote(doc, update)
        doc.offset = frame["offset"]  # may move back: the server's history is the reference
        doc.held.reset(StreamId.parse(frame["offset"]))
        missing_on_server = crdt.encode_state(doc.ydoc, protocol.b64decode(frame["state_vector"]))
        if missing_on_server != crdt.EMPTY_UPDATE:
            self._enqueue(doc.name, missing_on_server)
        self._ack(doc)
        doc.synced.set()
        self._emit("synced", {"doc": doc.name, "offset": doc.offset})

    def _on_error(self, frame: dict[str, Any]) -> None:
        self.errors.append(frame)
        self._emit("error", frame)
        if "clock" in frame and frame.get("code") in FATAL_UPDATE_ERRORS:
            self.buffer.pop(frame["clock"])  # resending cannot help; keep the local edit
        elif "clock" in frame and frame.get("code") == "rate_limited":
            self.buffer.defer(frame["clock"], frame.get("retry_after_ms", 1000) / 1000)
        log.info("server error: %s", frame)

    def _on_unsubscribed(self, frame: dict[str, Any]) -> None:
        pass

    def _on_pong(self, frame: dict[str, Any]) -> None:
        pass

    # ------------------------------------------------------------ persistence

    def persist(self) -> None:
        """Write the whole state now (atomically; see :mod:`.persistence`)."""
        if self.state_file is None:
            return
        self._dirty = False
        documents = [
            PersistedDocument(
                doc.name,
                crdt.encode_state(doc.ydoc),
                doc.offset,
                str(doc.held.since),
                [str(entry_id) for entry_id in doc.held.ids()],
                doc._replica.suspects if doc._replica else [],
                doc.needs_sync,
            )
            for doc in self.docs.values()
        ]
        pending = [PersistedUpdate(item.clock, item.doc, item.update) for item in self.buffer.all()]
        pending += [PersistedUpdate(0, doc.name, update) for doc in self.docs.values() for update in doc._batch]
        self.state_file.save(PersistedState(self.session, self.buffer.clock, documents, pending))

    def _journal(self, clock: int, doc: str, update: bytes) -> None:
        if self.state_file is not None:
            self.state_file.append(PersistedUpdate(clock, doc, update))
            self._dirty = True

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(self.persist_interval)
            if self._dirty:
                self.persist()

    def _restore(self, state: PersistedState | None) -> None:
        """Start from a persisted state: the documents resubscribe on connect
        (with their offset and digest) and the unacked updates are resent."""
        if state is None:
            return
        self.session = state.session
        for saved in state.documents:
            doc = ClientDocument(
                saved.name,
                crdt.new_doc(),
                offset=saved.offset,
                needs_sync=saved.needs_sync,
                held=HeldEntries(StreamId.parse(saved.since)),
            )
            crdt.apply_update(doc.ydoc, saved.state)
            for update in saved.suspects:
                doc.replica.apply(update)
            for entry_id in saved.held:
                doc.held.add(StreamId.parse(entry_id))
            self.docs[doc.name] = doc
        for item in state.journal:  # local edits after the snapshot: in no saved state yet
            if item.doc not in self.docs:
                self.docs[item.doc] = ClientDocument(item.doc, crdt.new_doc())
            self.docs[item.doc].replica.apply(item.update)
        for doc in self.docs.values():
            crdt.observe_updates(doc.ydoc, lambda update, doc=doc: self._local_update(doc, update))
        pending = state.pending + state.journal
        clock = max([state.clock, *(item.clock for item in pending)])
        self.buffer.restore(clock, [(item.clock, item.doc, item.update) for item in pending if item.clock])
        for item in pending:
            if not item.clock:  # batched edits that never got a clock
                self.buffer.add(item.doc, item.update)

    # ------------------------------------------------------------ helpers

    @staticmethod
    def _collect(doc: ClientDocument, frame: dict[str, Any]) -> bytes | None:
        """Reassemble a chunked snapshot / sync reply; None until complete."""
        if frame["part"] == 0:
            doc._parts.clear()
        doc._parts.append(protocol.b64decode(frame["update"]))
        if frame["part"] + 1 < frame["parts"]:
            return None
        data, doc._parts = b"".join(doc._parts), []
        return data

    def _apply_remote(self, doc: ClientDocument, update: bytes) -> None:
        self._applying_remote = True
        try:
            doc.replica.apply(update)
        finally:
            self._applying_remote = False

    def _ack(self, doc: ClientDocument) -> None:
        if doc.offset is not None:
            asyncio.ensure_future(self._send_quietly({"op": "ack", "doc": doc.name, "offset": doc.offset}))


def _subscribe_frame(doc: ClientDocument) -> dict[str, Any]:
    """Resubscribe from the offset held, with the drift digest over the window."""
    frame: dict[str, Any] = {"op": "subscribe", "doc": doc.name, "offset": doc.offset}
    if doc.offset is not None:
        # Own updates appended after the last delivery are held too: a server
        # that lost them must see it (through > its last id, or a digest gap).
        through = max(doc.held.last, StreamId.parse(doc.offset))
        digest = doc.held.digest(through)
        frame["digest"] = {"since": str(doc.held.since), "through": str(through), **digest.to_wire()}
    return frame


def _update_frame(item: Any) -> dict[str, Any]:
    return {"op": "update", "doc": item.doc, "clock": item.clock, "update": protocol.b64encode(item.update)}


def _max_offset(current: str | None, new: str) -> str:
    if current is None or StreamId.parse(new) > StreamId.parse(current):
        return new
    return current
