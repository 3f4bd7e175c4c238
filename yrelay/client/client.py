"""An asyncio yrelay client that binds Yjs documents to a server: pycrdt
documents by default, y-py ones with ``engine="y-py"`` (the ``ypy`` extra;
:mod:`yrelay.yjs.crdt`).

It is the reference implementation of docs/protocol.md on the client side,
and what the tests, the checker and the benchmarks drive.

Guarantees it keeps: every local change stays in the send buffer until the
server acks it (appended to the stream) or refuses it for good (then
``wait_idle()`` says so), and is resent with exponential
backoff + jitter when refused, or when unanswered while the connection
answers nothing (a server slowing it down answers late, in order); after
``max_attempts`` the client reconnects and resyncs
every document in full (a two-way state-vector exchange). Per document,
updates go out in clock order and a refused one holds back the later ones
(:mod:`.sendbuffer`). Deliveries are acked cumulatively per document once
applied. Features the server announces in ``welcome`` (docs/protocol.md#features)
are used when present: sync pushes, updates in parts, the ``synced`` frame.

Refusals are raised, never only logged (:mod:`yrelay.exceptions`): a token
the server refuses (:class:`Unauthorized`, at ``connect()`` at once), a
document it will not subscribe to (:class:`Forbidden`,
:class:`SubscribeRefused`), updates it will not store
(:class:`UpdatesRefused`, from ``wait_idle()``), no server within
``connect()``'s timeout (:class:`ServerUnreachable`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import websockets
from websockets.exceptions import ConnectionClosed

from yrelay import protocol
from yrelay.backoff import Backoff
from yrelay.client.persistence import ClientStateFile, PersistedDocument, PersistedState, PersistedUpdate
from yrelay.client.presence import RemotePresence
from yrelay.client.sendbuffer import PendingUpdate, SendBuffer
from yrelay.client.subscription_check import SubscriptionCheck, compare_subscriptions
from yrelay.exceptions import ClientError, Forbidden, ServerUnreachable, SubscribeRefused, Unauthorized, UpdatesRefused
from yrelay.observability.logs import WireFilter
from yrelay.reconciliation import ReconciliationError
from yrelay.reconciliation.digest import Digest
from yrelay.reconciliation.held_entries import HeldEntries
from yrelay.storage.keys import validate_doc_id
from yrelay.storage.offsets import StreamId
from yrelay.yjs import crdt
from yrelay.yjs.awareness import AwarenessError

log = logging.getLogger(__name__)
#: The websockets library's debug lines of this client's sockets, without
#: what they carry (a hello's token, frames): logs.WireFilter.
wire_log = logging.getLogger(__name__ + ".wire")
wire_log.addFilter(WireFilter())

#: Errors after which resending the same update can never succeed.
FATAL_UPDATE_ERRORS = {
    "invalid_update",
    "update_too_large",
    "malformed_frame",
    "invalid_doc_id",
    "frame_too_large",
    "forbidden",
    "document_deleted",
}
#: Errors that say the update was not stored for now (``unavailable``,
#: ``internal_error``, ``missing_dependency``, ``replication_timeout``) are
#: resent on its backoff; so is any other code about an update, as the web
#: client does.
#: Bytes of an update frame besides its base64 (op, doc id of at most 200
#: characters, clock, sync, part, parts): a part's slice leaves room for them.
FRAME_OVERHEAD = 512
#: Entries ``acked`` and ``errors`` keep (the newest): a long-running client
#: must not grow for ever; the totals are counted apart.
KEEP_ACKED = 10_000
KEEP_ERRORS = 1_000
#: Errors about a document (without a clock) that end its subscription for
#: good: the token does not cover it, on the first subscribe or a resubscribe
#: (after a reconnect with another token).
SUBSCRIBE_REFUSALS = {"forbidden"}
#: The same only as the answer to a document's first subscribe, which
#: ``subscribe()`` waits for (``malformed_frame``: over
#: ``max_docs_per_connection``). On a resubscribe they may pass (the server
#: may not have released the old connection's subscriptions yet), and
#: about a subscribed document they name another frame.
FIRST_SUBSCRIBE_REFUSALS = {"too_many_subscriptions", "malformed_frame", "invalid_offset"}
#: How often the waits of the public API look at their condition and at
#: what would end them (a refusal, the client stopped), in seconds.
POLL = 0.02
#: Server ops this client needs nothing from (answered elsewhere or informational).
IGNORED_OPS = {"unsubscribed", "pong", "welcome"}
#: Server ops about one document: their handler takes it too, and a frame
#: about a document not subscribed (any more) is ignored.
DOCUMENT_OPS = {"deliver", "subscribed", "snapshot", "resync_required", "sync_reply", "synced", "awareness"}
#: Acks are cumulative: one per document per this many seconds says all the
#: deliveries in between (an entry stays unacked at most this long after its
#: delivery, far below the server's ``resend_after``; docs/protocol.md#acks).
ACK_INTERVAL = 0.025
#: The close code by which the server asks for a pause: 4429 (held back by
#: its rates for too long). The reconnect waits the ``retry_after_ms`` of the
#: error frame before the close (SLOW_DOWN_DEFAULT seconds without one), and
#: at least the backoff. Not 1013: a server closes with it after a Redis
#: failover or outage, and the client should be back at once to resync
#: (a refusal at the connect, ``overloaded``, says when in its error frame).
SLOW_DOWN_CLOSES = {4429}
SLOW_DOWN_DEFAULT = 1.0
#: A connection ended by a slow-down close sooner than this (seconds) after
#: its ``welcome`` does not reset the reconnect backoff: repeated 4429s back
#: off up to the maximum (the server's hard bound ends a flooding connection
#: after ~12 s held back).
STABLE_CONNECTION = 60.0
#: Liveness: after IDLE_PING seconds without a frame from the server the
#: client sends ``ping``; after DEAD_AFTER seconds without one it takes the
#: connection for dead and reconnects. Not websockets' keepalive (a
#: websocket ping whose pong must be back within 20 s): a server slowing
#: this connection down (issue 30) reads its frames late, a ping queued
#: behind a long offline flush among them, while its answers to the earlier
#: frames keep arriving; any frame from the server shows it is alive.
IDLE_PING = 20.0
DEAD_AFTER = 60.0


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
    """One subscribed document: its Yjs document and its place in the stream."""

    name: str
    #: A ``pycrdt.Doc`` (the default engine) or a ``y_py.YDoc`` (``engine="y-py"``);
    #: the :mod:`yrelay.yjs.crdt` helpers take either.
    ydoc: crdt.Doc
    offset: str | None = None
    #: Set when the client gave up resending: resync in full on resubscribe.
    needs_sync: bool = False
    #: Stream ids held, for the drift digest sent on every resubscribe.
    held: HeldEntries = field(default_factory=HeldEntries)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    _parts: list[bytes] = field(default_factory=list)
    #: A ``sync`` was sent and its reply has not come yet.
    _sync_pending: bool = False
    _batch: list[bytes] = field(default_factory=list)
    _batch_timer: asyncio.TimerHandle | None = None
    #: Applies remote updates, keeping those that may stay pending (persisted).
    replica: crdt.Replica = field(init=False)
    #: Other clients' presence on this document (docs/protocol.md#presence).
    presence: RemotePresence = field(default_factory=RemotePresence)
    #: Set when an operator deleted the document: the subscription ended and
    #: the client no longer sends or resubscribes it (subscribe again for a new one).
    deleted: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set when the server refused the subscription (``subscribe()`` raises
    #: it): the document is no longer bound, its edits are not sent.
    refused: SubscribeRefused | None = None

    @property
    def awareness(self) -> dict[int, dict[str, Any]]:
        """The other clients' current awareness states, by Yjs clientID
        (outdated ones dropped first)."""
        self.presence.expire()
        return dict(self.presence.states)

    def __post_init__(self) -> None:
        self.replica = crdt.Replica(self.ydoc)

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
        engine: str = crdt.PYCRDT,
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
        callable is asked again on every reconnect, so it can refresh it.
        ``engine``: the library of the documents the client makes, ``"pycrdt"``
        or ``"y-py"`` (needs the ``ypy`` extra; raises
        :class:`yrelay.yjs.crdt.EngineMissing` without it); a document passed to
        :meth:`subscribe` may be of either."""
        crdt.check_engine(engine)
        self.engine = engine
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
        #: The newest acked updates and error frames (between KEEP_ACKED /
        #: KEEP_ERRORS and twice that); the totals below count every one.
        self.acked: list[AckedUpdate] = []
        self.errors: list[dict[str, Any]] = []
        self.acked_total = 0
        self.error_codes: Counter[str] = Counter()
        #: Why the client stopped connecting (:class:`Unauthorized`), until
        #: the next ``connect()``; None while it runs or reconnects.
        self.failure: ClientError | None = None
        #: Error frames of the updates refused for good since ``wait_idle()``
        #: last raised them (the newest KEEP_ERRORS; all of them counted).
        self._refused: list[dict[str, Any]] = []
        self._refused_total = 0
        #: Why the last connection attempt failed, for :class:`ServerUnreachable`.
        self._last_failure = ""
        self.resyncs = 0
        #: Resubscribes where the drift digests differed (either side noticed).
        self.drifts = 0
        self.connected = asyncio.Event()
        #: What the server announced in ``welcome``.
        self.features: frozenset[str] = frozenset()
        self.limits: dict[str, int] = {}
        self._ws: Any = None
        #: Seconds the server asked to wait before the next connection, said
        #: in an error frame about the connection (``rate_limited`` before a 4429).
        self._retry_after = 0.0
        self._heard = 0.0  # when the server last sent a frame (liveness)
        self._flush_lock = asyncio.Lock()
        self._flush_scheduled = False
        self._parts_lock = asyncio.Lock()  # one update in parts at a time per connection
        self._applying_remote = False
        self._closing = False
        self._runner: asyncio.Task[None] | None = None
        self._answers: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._refs = itertools.count(1)
        self._check_lock = asyncio.Lock()
        #: Documents with an ack on its way (sent once ACK_INTERVAL is up).
        self._acks_due: dict[str, asyncio.TimerHandle] = {}
        self.state_file = state_file
        self.persist_interval = persist_interval
        self._dirty = False
        self._persister: asyncio.Task[None] | None = None
        if state_file is not None:
            self._restore(state_file.load())

    # ------------------------------------------------------------- public API

    async def connect(self, timeout: float = 10.0) -> YrelayClient:
        """Open a session (``async with`` calls it) and keep it: from then
        on the client reconnects by itself, for as long as it runs.

        Raises :class:`Unauthorized` as soon as the server refuses the token
        (with its reason: missing, invalid, expired, revoked); retrying
        cannot help. Raises :class:`ServerUnreachable` when no session opened
        within ``timeout`` seconds, naming the URLs and the last attempt's
        failure (connection refused, HTTP 404, ``overloaded``): until then it
        keeps trying on its backoff, since a server may be restarting, or
        ask for a pause. After a failure nothing keeps running (as after
        ``close()``); the same client may connect again, e.g. with a new
        ``token``: its session, documents and unacked updates are kept."""
        self._closing = False
        self.failure = None
        self._last_failure = ""
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="yrelay-client")
        if self.state_file is not None and (self._persister is None or self._persister.done()):
            self._persister = asyncio.create_task(self._persist_loop(), name="yrelay-client-persist")
        try:
            opened = await self._until(self.connected.is_set, self._stopped_by, timeout)
        except BaseException:
            await self.close()
            raise
        if not opened:
            reason = self._last_failure  # before close(): its own close would read as the last failure
            await self.close()
            raise ServerUnreachable(self.urls, timeout, reason or "no answer yet")
        return self

    def _is_closing(self) -> bool:
        """``close()`` was called (a call, read again after an await: mypy
        would keep the attribute's value from the loop's check)."""
        return self._closing

    async def close(self) -> None:
        self._closing = True
        for due in self._acks_due.values():
            due.cancel()
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
        restored is returned as it is (it resubscribed on connect).

        Raises :class:`Forbidden` when the token does not cover ``name``,
        :class:`SubscribeRefused` for the server's other refusals
        (``too_many_subscriptions``, over ``max_docs_per_connection``): the
        document is then not bound. :class:`~yrelay.storage.keys.InvalidDocumentId`
        (a ``ValueError``) for a name the protocol does not allow, before
        anything is sent; the :class:`Unauthorized` that stopped the client;
        ``TimeoutError`` when it is not synced within ``timeout`` seconds
        (offline: it stays subscribed and syncs once connected)."""
        validate_doc_id(name)
        self._raise_if_stopped()
        restored = self.docs.get(name) if self.state_file is not None and ydoc is None else None
        doc = restored or ClientDocument(name, ydoc if ydoc is not None else crdt.new_doc(engine=self.engine))
        if restored is None:
            self.docs[name] = doc
            crdt.observe_updates(doc.ydoc, lambda update: self._local_update(doc, update))
            await self._send_quietly(_subscribe_frame(doc))
        if not await self._until(doc.synced.is_set, lambda: doc.refused or self._stopped_by(), timeout):
            raise self._timed_out(f"{name!r} did not sync", timeout, "it stays subscribed")
        return doc

    async def unsubscribe(self, name: str) -> None:
        self.docs.pop(name, None)
        await self._send_quietly({"op": "unsubscribe", "doc": name})

    @property
    def pending(self) -> int:
        return len(self.buffer) + sum(len(doc._batch) for doc in self.docs.values())

    async def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until no local change is pending; return only if every one
        made so far is in Redis.

        Raises :class:`UpdatesRefused` when the server refused updates that
        will never be stored (a read-only token: ``forbidden``;
        ``invalid_update``, ``update_too_large``, the document deleted, its
        subscription refused), once the others are answered (or all wait
        for a resend, e.g. edits that build on a refused one), listing each
        with its reason; each refusal is raised once. It raises rather than
        returning a result because the point of the call is "my edits are
        stored now": a result nobody checks would leave that silently false.
        The local documents keep the refused changes. Raises the
        :class:`Unauthorized` that stopped the client (the unacked updates
        stay pending: set a new ``token``, ``connect()``, wait again), and
        ``TimeoutError`` when updates are still unanswered after ``timeout``
        seconds (offline: they stay queued)."""
        if not await self._until(lambda: not self.pending or self._refusals_settled(), self._stopped_by, timeout):
            raise self._timed_out(f"{self.pending} local updates not acked", timeout, "they stay queued")
        if self._refused:
            refused, total = self._refused, self._refused_total
            self._refused, self._refused_total = [], 0
            raise UpdatesRefused(refused, total, self.pending)

    def _refusals_settled(self) -> bool:
        """Refusals to raise, and none on its way that could join them:
        every update still pending was refused for now and waits for its
        resend (``missing_dependency`` behind a refused one, ``unavailable``)."""
        return (
            bool(self._refused)
            and all(item.waiting for item in self.buffer.all())
            and not any(doc._batch for doc in self.docs.values())
        )

    def _timed_out(self, what: str, timeout: float, meanwhile: str) -> TimeoutError:
        """A wait of the public API ended by its timeout: what did not happen,
        whether the client is connected, and what becomes of it meanwhile."""
        state = "connected" if self.connected.is_set() else "not connected"
        return TimeoutError(f"{what} within {timeout:g} s ({state}; {meanwhile})")

    async def _until(self, done: Callable[[], bool], stopped: Callable[[], ClientError | None], timeout: float) -> bool:
        """Wait until ``done()`` (True), or ``timeout`` seconds (False);
        raise what ``stopped()`` returns meanwhile (a refusal, the client
        stopped), as soon as it does."""
        deadline = time.monotonic() + timeout
        while not done():
            failure = stopped()
            if failure is not None:
                raise failure.with_traceback(None)  # raised again by every waiter: no growing traceback
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL)
        return True

    def _stopped_by(self) -> ClientError | None:
        """Why the client no longer connects: the server refused its token,
        or its connection loop failed (a bug: said, not hidden in a task
        nobody awaits); None while it runs, or after ``close()``."""
        runner = self._runner
        crash = runner.exception() if runner is not None and runner.done() and not runner.cancelled() else None
        if self.failure is None and crash is not None:
            self.failure = ClientError(f"the client's connection loop failed: {crash!r}")
            self.failure.__cause__ = crash
        return self.failure

    def _raise_if_stopped(self) -> None:
        failure = self._stopped_by()
        if failure is not None:
            raise failure.with_traceback(None)

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

    async def _liveness(self, ws: Any) -> None:
        """Ping an idle connection; drop one the server has been silent on
        for DEAD_AFTER seconds (it reconnects)."""
        while True:
            await asyncio.sleep(min(IDLE_PING, DEAD_AFTER) / 4)
            silent = time.monotonic() - self._heard
            if silent >= DEAD_AFTER:  # abort: a close (and a ping) would wait for a send buffer that never drains
                log.info("nothing from the server for %.0f s: reconnecting", silent)
                ws.transport.abort()
                return
            if silent >= IDLE_PING:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._send_quietly({"op": "ping"}), IDLE_PING / 4)

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
        if self._applying_remote or doc.refused is not None:  # a refused subscription: not bound any more
            return
        if self.batch_delay <= 0:
            self._enqueue(doc.name, update)
            return
        doc._batch.append(update)
        self._journal(0, doc.name, update)
        if doc._batch_timer is None:
            doc._batch_timer = asyncio.get_running_loop().call_later(self.batch_delay, self._flush_batch, doc)

    def _flush_batch(self, doc: ClientDocument) -> None:
        doc._batch_timer = None
        updates, doc._batch = doc._batch, []
        if updates and doc.refused is None:
            self._enqueue(
                doc.name,
                updates[0] if len(updates) == 1 else crdt.merge_updates(updates, engine=crdt.engine_of(doc.ydoc)),
            )

    def _enqueue(self, doc: str, update: bytes, sync: bool = False) -> None:
        item = self.buffer.add(doc, update, sync=sync)
        self._journal(item.clock, doc, update)  # write-ahead: an update the server acks is always on disk
        if self.connected.is_set():
            self._kick()

    # ------------------------------------------------------------ sending updates

    def _kick(self) -> None:
        """Send what is due soon (once for many local edits in a row)."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        """Send every update that is due, in clock order (:meth:`SendBuffer.due`)."""
        async with self._flush_lock:
            self._flush_scheduled = False
            for item in self.buffer.due():
                if self._ws is None:
                    return
                await self._send_update(item)

    async def _send_update(self, item: PendingUpdate) -> None:
        limit = self.limits.get("max_update_bytes")
        if limit is not None and len(item.update) > limit:
            self._refuse_locally(item, limit)
            return
        frames = _update_frames(item, self._part_bytes())
        if len(frames) == 1:
            self.buffer.mark_sent(item)
            await self._send_quietly(frames[0])
            return
        item.sending = True  # later updates of its document wait for the last part
        asyncio.ensure_future(self._send_parts(item, frames))

    async def _send_parts(self, item: PendingUpdate, frames: list[dict[str, Any]]) -> None:
        """One update in parts; other documents' updates go out in between."""
        try:
            async with self._parts_lock:
                ws = self._ws  # every part on one socket: a new one starts again from part 0
                if ws is None:
                    return
                self.buffer.mark_sent(item)
                for frame in frames:
                    if item.waiting or self.buffer.get(item.clock) is not item:
                        return  # refused (or dropped) mid-way: the server ignores the rest anyway
                    await ws.send(json.dumps(frame))
                self.buffer.sent_in_full(item)
        except ConnectionClosed:
            pass
        finally:
            item.sending = False
            self._kick()

    def _part_bytes(self) -> int | None:
        """Bytes per part, when the server takes updates in parts."""
        frame_limit = self.limits.get("max_frame_bytes")
        if "update_parts" not in self.features or not frame_limit:
            return None
        return max((frame_limit - FRAME_OVERHEAD) // 4 * 3, 3)

    def _refuse_locally(self, item: PendingUpdate, limit: int) -> None:
        """Larger than the server takes: it can never be stored. Dropped from
        the buffer (the local document keeps the change), and said as an
        ``error`` event; the other updates and documents go on."""
        self.buffer.pop(item.clock)
        size = len(item.update)
        message = f"update of {size} bytes to {item.doc!r} is over the server's limit of {limit} bytes: not sent"
        frame = {
            "op": "error",
            "code": "update_too_large",
            "doc": item.doc,
            "clock": item.clock,
            "size": size,
            "limit": limit,
            "local": True,
            "message": message,
        }
        log.warning("%s", frame["message"])
        self._record_error(frame)
        self._refused_update(frame)
        self._emit("error", frame)

    # ------------------------------------------------------------ connection

    async def _run(self) -> None:
        attempt = 0
        opened = False  # a session opened since connect(): a refusal after it is news to the app, so a warning
        while not self._closing:
            retry_after = 0.0
            self._retry_after = 0.0
            welcomed_at: float | None = None
            close_code: int | None = None
            url = self.urls[attempt % len(self.urls)]
            try:
                async with websockets.connect(
                    url, max_size=None, open_timeout=10, ping_interval=None, logger=wire_log
                ) as ws:
                    self._ws = ws
                    await self._handshake(ws)
                    welcomed_at = self._heard = time.monotonic()
                    opened = True
                    helpers = [asyncio.create_task(self._retry_loop()), asyncio.create_task(self._liveness(ws))]
                    if self.subscription_check_interval:
                        helpers.append(asyncio.create_task(self._check_loop()))
                    try:
                        async for message in ws:
                            self._heard = time.monotonic()
                            self._handle(json.loads(message))
                    finally:
                        for helper in helpers:
                            helper.cancel()
            except Unauthorized as refused:  # a new connection with the same token gets the same answer
                self.failure = refused
                level = logging.WARNING if opened else logging.INFO  # at connect() its exception says it
                log.log(level, "%s: the client stopped (%d unacked updates kept)", refused, self.pending)
            except (TimeoutError, OSError, ConnectionClosed, websockets.InvalidHandshake) as exc:
                log.debug("connection lost: %r", exc)
                self._last_failure = _failure_of(url, exc)
                retry_after = getattr(exc, "delay", 0.0)  # RetryLater: the server said when
                if isinstance(exc, ConnectionClosed) and exc.rcvd is not None:
                    close_code = exc.rcvd.code
            finally:
                self._ws = None
                self.connected.clear()
                self._forget_presence()
            if self._is_closing():  # close() ran while this connection ended
                return
            self._emit("disconnected", {})
            if self.failure is not None:
                return
            slow_down = close_code in SLOW_DOWN_CLOSES
            if slow_down:
                retry_after = max(retry_after, self._retry_after or SLOW_DOWN_DEFAULT)
            # A session that opened resets the backoff, unless the server told it to slow down soon after.
            if welcomed_at is not None and not (slow_down and time.monotonic() - welcomed_at < STABLE_CONNECTION):
                attempt = 0
            await asyncio.sleep(max(self.backoff.delay(attempt), retry_after))
            attempt += 1

    async def _handshake(self, ws: Any) -> None:
        token = self.token() if callable(self.token) else self.token
        with contextlib.suppress(ConnectionClosed):  # refused: its error frame (read below) came before the close
            await ws.send(json.dumps({"op": "hello", "session": self.session, "token": token}))
        welcome = _frame_or_none(await asyncio.wait_for(ws.recv(), 10))
        if welcome is None:
            raise ConnectionError("the server's first frame is not a yrelay frame (is the URL the server's /ws?)")
        if welcome.get("op") == "error" and "retry_after_ms" in welcome:
            raise RetryLater(welcome)
        if welcome.get("op") == "error":  # kept for the app
            self._on_error(welcome)
            if welcome.get("code") == "unauthorized":
                raise Unauthorized(welcome)
        if welcome.get("op") != "welcome":
            raise ConnectionError(f"expected welcome, got {welcome}")
        self.session = welcome["session"]
        self.features = frozenset(welcome.get("features") or ())
        self.limits = dict(welcome.get("limits") or {})
        self.persist()  # a crash from here on resumes this session
        for doc in self.docs.values():
            doc.synced.clear()
            doc._sync_pending = False
            await ws.send(json.dumps(_subscribe_frame(doc)))
        self.buffer.reset_attempts()
        await self._flush()
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
                await self.drop_connection()
                return
            await self._flush()

    async def _send_quietly(self, frame: dict[str, Any]) -> None:
        ws = self._ws
        if ws is None:
            return  # sent again after the next handshake
        with contextlib.suppress(ConnectionClosed):
            await ws.send(json.dumps(frame))

    def _emit(self, event: str, data: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(event, data)

    # ------------------------------------------------------------ server frames

    def _handle(self, frame: dict[str, Any]) -> None:
        if frame.get("op") in IGNORED_OPS:
            return
        handler = getattr(self, f"_on_{frame.get('op')}", None)
        if handler is None:
            log.warning("unexpected frame %s", str(frame)[:200])
            return
        if frame["op"] not in DOCUMENT_OPS:
            handler(frame)
        elif (doc := self.docs.get(frame.get("doc", ""))) is not None:
            handler(doc, frame)
        self._dirty = True

    def _on_appended(self, frame: dict[str, Any]) -> None:
        self.buffer.answered()  # the connection is read: what was sent after this is answered in turn
        item = self.buffer.pop(frame["clock"])
        doc = self.docs.get(frame["doc"])
        stored = frame["id"] is not None  # None: a sync push of which nothing could be stored
        if doc is not None and stored:
            doc.held.add(StreamId.parse(frame["id"]))  # also for a late or duplicate answer
        if item is None:
            return
        if item.sync:
            self._pushed(item, frame)
        if stored:
            _keep_newest(self.acked, AckedUpdate(item.doc, item.clock, frame["id"], item.update), KEEP_ACKED)
            self.acked_total += 1
        self._emit("appended", frame)
        if item.sync:
            self._kick()  # the updates it held back

    def _pushed(self, push: PendingUpdate, frame: dict[str, Any]) -> None:
        """A sync push was answered: the updates of its document made before
        it are in it (they were in the local document it was encoded from),
        unless the server left out content of this document's own Yjs client."""
        dropped = frame.get("dropped") or {}
        if dropped:
            log.info(
                "sync push of %s: the server could not apply %s yet (they come back in a later sync)", push.doc, dropped
            )
        if frame["id"] is None:
            log.info("sync push of %s: nothing in it could be stored", push.doc)
        doc = self.docs.get(push.doc)
        own = str(doc.ydoc.client_id) if doc is not None else None
        if own in dropped:
            log.warning("sync push of %s: own content %s not stored; its updates stay queued", push.doc, dropped[own])
            return
        covered = self.buffer.drop_covered(push)
        if covered:
            log.info("sync push of %s covers unacked updates %s", push.doc, [item.clock for item in covered])

    def _on_deliver(self, doc: ClientDocument, frame: dict[str, Any]) -> None:
        for entry in frame["entries"]:
            self._apply_remote(doc, protocol.b64decode(entry["update"]))
            doc.offset = _max_offset(doc.offset, entry["id"])
            doc.held.add(StreamId.parse(entry["id"]))
        self._ack(doc)

    def _on_subscribed(self, doc: ClientDocument, frame: dict[str, Any]) -> None:
        doc.offset = _max_offset(doc.offset, frame["offset"])
        drift = "digest" in frame and not self._digest_agrees(doc, frame)
        if drift:
            self.drifts += 1
            self._emit("drift", {"doc": doc.name, "server": frame["digest"]})
        if drift or doc.needs_sync:  # a drift's sync covers a needed one
            doc.needs_sync = False
            self._request_sync(doc)
        elif "synced" not in self.features:  # else once the catch-up is in: the synced frame
            doc.synced.set()

    @staticmethod
    def _digest_agrees(doc: ClientDocument, frame: dict[str, Any]) -> bool:
        """Compare with the server's digest over its window (which starts
        at or after ours: GC may have trimmed past our base)."""
        server = frame["digest"]
        doc.held.rebase(StreamId.parse(server["since"]))
        ours = doc.held.digest(StreamId.parse(server.get("through", frame["offset"])))
        return ours == Digest(count=server["count"], hash=int(server["hash"], 16))

    def _on_snapshot(self, doc: ClientDocument, frame: dict[str, Any]) -> None:
        if self._apply_parts(doc, frame):
            doc.offset = _max_offset(doc.offset, frame["offset"])
            self._ack(doc)

    def _on_resync_required(self, doc: ClientDocument, frame: dict[str, Any]) -> None:
        if frame.get("reason") == "drift":
            self.drifts += 1
        self._emit("resync_required", frame)
        self._request_sync(doc)

    def _request_sync(self, doc: ClientDocument) -> None:
        self.resyncs += 1
        doc._sync_pending = True
        doc._parts.clear()
        vector = protocol.b64encode(crdt.state_vector(doc.ydoc))
        asyncio.ensure_future(self._send_quietly({"op": "sync", "doc": doc.name, "state_vector": vector}))

    def _on_sync_reply(self, doc: ClientDocument, frame: dict[str, Any]) -> None:
        if not self._apply_parts(doc, frame):
            return
        doc._sync_pending = False
        doc.offset = frame["offset"]  # may move back: the server's history is the reference
        doc.held.reset(StreamId.parse(frame["offset"]))
        missing_on_server = crdt.encode_state(doc.ydoc, protocol.b64decode(frame["state_vector"]))
        if missing_on_server != crdt.EMPTY_UPDATE:  # a push: the server keeps what it can apply
            self._enqueue(doc.name, missing_on_server, sync="sync_push" in self.features)
        self._ack(doc)
        if "synced" not in self.features:  # else the synced frame follows
            self._mark_synced(doc)

    def _on_synced(self, doc: ClientDocument, frame: dict[str, Any]) -> None:
        """The server sent everything it had when it answered: the document
        holds the server's state (unless a sync of ours is still unanswered:
        its reply and its own synced come next). An older server path sends
        it too: harmless."""
        if not doc._sync_pending:
            self._mark_synced(doc)

    def _on_awareness(self, doc: ClientDocument, frame: dict[str, Any]) -> None:
        """Other clients' presence: kept per document, said as an
        ``awareness`` event with the clientIDs added, updated and removed."""
        try:
            changes = doc.presence.apply(protocol.b64decode(frame["update"]))
        except (AwarenessError, KeyError, ValueError) as exc:
            log.info("ignored an awareness frame for %s: %s", doc.name, exc)
            return
        if any(changes.values()):
            self._emit("awareness", {"doc": doc.name, **changes})

    def _mark_synced(self, doc: ClientDocument) -> None:
        doc.synced.set()
        self._emit("synced", {"doc": doc.name, "offset": doc.offset})

    def _forget_presence(self) -> None:
        """Offline, remote states would freeze: dropped (and said); the
        server sends them again after the next subscribe."""
        for doc in self.docs.values():
            removed = list(doc.presence.states)
            doc.presence.clear()
            if removed:
                self._emit("awareness", {"doc": doc.name, "added": [], "updated": [], "removed": removed})

    def _record_error(self, frame: dict[str, Any]) -> None:
        _keep_newest(self.errors, frame, KEEP_ERRORS)
        self.error_codes[str(frame.get("code"))] += 1

    def _on_error(self, frame: dict[str, Any]) -> None:
        self._record_error(frame)
        self._emit("error", frame)
        if "clock" in frame:
            self.buffer.answered()
        if "clock" not in frame and "doc" not in frame and frame.get("retry_after_ms"):
            self._retry_after = float(frame["retry_after_ms"]) / 1000  # about the connection: a close follows
        elif "clock" in frame and frame.get("code") in FATAL_UPDATE_ERRORS:
            if self.buffer.pop(frame["clock"]) is not None:  # resending cannot help; keep the local edit
                self._refused_update(frame)
        elif "clock" in frame and frame.get("code") == "rate_limited":
            self.buffer.defer(frame["clock"], frame.get("retry_after_ms", 1000) / 1000)
        elif frame.get("code") == "document_deleted":
            self._document_deleted(frame.get("doc", ""))
        elif "clock" not in frame and self._refuses_subscription(frame):
            self._subscription_refused(frame)
        elif "clock" in frame:  # RETRY_UPDATE_ERRORS, and codes this client does not know yet
            self.buffer.refused(frame["clock"])
            if frame.get("code") == "missing_dependency":
                self._missing_dependency(frame)
        log.info("server error: %s", frame)

    def _document_deleted(self, name: str) -> None:
        """The server ended the subscription: the document was deleted. Its
        unsent updates are dropped (they would be refused; ``wait_idle()``
        says so); the local copy stays readable."""
        doc = self.docs.pop(name, None)
        message = "the document was deleted before this update was stored"
        self._drop_updates(name, {"op": "error", "code": "document_deleted", "doc": name, "message": message})
        if doc is not None:
            doc.deleted.set()
            self._emit("deleted", {"doc": name})

    def _refuses_subscription(self, frame: dict[str, Any]) -> bool:
        """Does this error (without a clock) say the server holds no
        subscription to its document?"""
        doc = self.docs.get(frame.get("doc", ""))
        code = frame.get("code")
        first = doc is not None and doc.offset is None and not doc.synced.is_set() and not doc._sync_pending
        return doc is not None and (code in SUBSCRIBE_REFUSALS or (code in FIRST_SUBSCRIBE_REFUSALS and first))

    def _subscription_refused(self, frame: dict[str, Any]) -> None:
        """The server refused a subscribe (the first, or one after a
        reconnect): the document leaves the client and is no longer bound;
        ``subscribe()`` raises the refusal, and its unacked updates, which
        the server will not take, are reported by ``wait_idle()``."""
        doc = self.docs.pop(frame["doc"])
        doc.refused = Forbidden(frame) if frame.get("code") == "forbidden" else SubscribeRefused(frame)
        self._drop_updates(doc.name, frame)
        if doc._batch_timer is not None:  # edits batched, never given a clock
            doc._batch_timer.cancel()
        for _ in doc._batch:
            self._refused_update(dict(frame))
        doc._batch.clear()
        # A first one is said by subscribe() raising it.
        log.log(logging.WARNING if doc.offset is not None else logging.INFO, "%s", doc.refused)

    def _drop_updates(self, name: str, frame: dict[str, Any]) -> None:
        """Drop the unacked updates of document ``name``: refused with ``frame``'s reason."""
        for item in self.buffer.all():
            if item.doc == name:
                self.buffer.pop(item.clock)
                self._refused_update({**frame, "clock": item.clock})

    def _refused_update(self, frame: dict[str, Any]) -> None:
        """An update that will never be stored: kept for ``wait_idle()`` to raise."""
        _keep_newest(self._refused, frame, KEEP_ERRORS)
        self._refused_total += 1

    def _missing_dependency(self, frame: dict[str, Any]) -> None:
        """Refused for content the server lacks. Kept, and resent once the
        document's earlier updates are in; refused with none of them left,
        the client pushes what the server lacks (a two-way sync)."""
        item, doc = self.buffer.get(frame["clock"]), self.docs.get(frame.get("doc", ""))
        if item is None or doc is None or self.buffer.earlier(item) or doc._sync_pending:
            return
        log.info(
            "update %d of %s depends on content the server lacks (%s): two-way sync",
            item.clock,
            doc.name,
            frame.get("missing"),
        )
        self._request_sync(doc)

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
                doc.replica.suspects,
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
            ydoc = crdt.new_doc(engine=self.engine)
            held = HeldEntries(StreamId.parse(saved.since))
            doc = ClientDocument(saved.name, ydoc, offset=saved.offset, needs_sync=saved.needs_sync, held=held)
            crdt.apply_update(doc.ydoc, saved.state)
            for update in saved.suspects:
                doc.replica.apply(update)
            for entry_id in saved.held:
                doc.held.add(StreamId.parse(entry_id))
            self.docs[doc.name] = doc
        for item in state.journal:  # local edits after the snapshot: in no saved state yet
            if item.doc not in self.docs:
                self.docs[item.doc] = ClientDocument(item.doc, crdt.new_doc(engine=self.engine))
            self.docs[item.doc].replica.apply(item.update)
        for doc in self.docs.values():
            crdt.observe_updates(doc.ydoc, functools.partial(self._local_update, doc))
        pending = state.pending + state.journal
        clock = max([state.clock, *(item.clock for item in pending)])
        self.buffer.restore(clock, [(item.clock, item.doc, item.update) for item in pending if item.clock])
        for item in pending:
            if not item.clock:  # batched edits that never got a clock
                self.buffer.add(item.doc, item.update)

    # ------------------------------------------------------------ helpers

    def _apply_parts(self, doc: ClientDocument, frame: dict[str, Any]) -> bool:
        """Reassemble a chunked snapshot / sync reply and apply it once
        complete; says whether it was (False before the last part)."""
        if frame["part"] == 0:
            doc._parts.clear()
        doc._parts.append(protocol.b64decode(frame["update"]))
        if frame["part"] + 1 < frame["parts"]:
            return False
        update, doc._parts = b"".join(doc._parts), []
        self._apply_remote(doc, update)
        return True

    def _apply_remote(self, doc: ClientDocument, update: bytes) -> None:
        self._applying_remote = True
        try:
            doc.replica.apply(update)
        finally:
            self._applying_remote = False

    def _ack(self, doc: ClientDocument) -> None:
        """Ack ``doc``'s offset within ACK_INTERVAL: the deliveries until then
        share one ack (a reader of a busy document sends ~40 a second, not one
        per deliver frame)."""
        if doc.offset is not None and doc.name not in self._acks_due:
            self._acks_due[doc.name] = asyncio.get_running_loop().call_later(
                ACK_INTERVAL, self._send_ack, doc, self._ws
            )

    def _send_ack(self, doc: ClientDocument, ws: Any) -> None:
        """The newest offset, on the connection the deliveries came on (after a
        reconnect the subscribe carries it) and while still subscribed."""
        del self._acks_due[doc.name]
        if ws is self._ws and self.docs.get(doc.name) is doc and doc.offset is not None:
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


def _update_frames(item: PendingUpdate, part_bytes: int | None) -> list[dict[str, Any]]:
    """One frame, or ``parts`` frames of at most ``part_bytes`` each (docs/protocol.md#large-updates)."""
    frame: dict[str, Any] = {"op": "update", "doc": item.doc, "clock": item.clock}
    if item.sync:
        frame["sync"] = True
    if part_bytes is None or len(item.update) <= part_bytes:
        return [{**frame, "update": protocol.b64encode(item.update)}]
    slices = protocol.chunks(item.update, part_bytes)
    return [
        {**frame, "update": protocol.b64encode(piece), "part": index, "parts": len(slices)}
        for index, piece in enumerate(slices)
    ]


def _frame_or_none(message: str | bytes) -> dict[str, Any] | None:
    """A server frame, or None for a message that is not one (not JSON text)."""
    try:
        frame = json.loads(message)
    except ValueError:
        return None
    return frame if isinstance(frame, dict) else None


def _failure_of(url: str, exc: BaseException) -> str:
    """One line saying why a connection attempt failed."""
    if isinstance(exc, ConnectionRefusedError):
        return f"{url}: connection refused (is the server running?)"
    if isinstance(exc, asyncio.TimeoutError):
        return f"{url}: no answer in time"
    if isinstance(exc, websockets.InvalidHandshake):  # an HTTP answer (a wrong path gets 403), not a websocket
        return f"{url}: {exc} (is it the server's /ws URL?)"
    return f"{url}: {str(exc) or type(exc).__name__}"


def _keep_newest(items: list[Any], item: Any, keep: int) -> None:
    """Append, dropping the oldest in one go once there are twice ``keep``
    (a list, not a deque: callers compare it with lists and slice it)."""
    items.append(item)
    if len(items) >= 2 * keep:
        del items[:-keep]


def _max_offset(current: str | None, new: str) -> str:
    return new if current is None or StreamId.parse(new) > StreamId.parse(current) else current
