"""One update, from its frame to its answer.

Checked in this order, each refusal an ``error`` frame naming the update's
doc and clock (nothing stored): the remaining parts of an update already
refused are ignored; the rates (:mod:`.allowance`); the size and base64
(:mod:`.payloads`); reassembly of an update sent in parts
(:mod:`.update_parts`); the struct-by-struct read of its layout and causal
needs (on the event loop up to 64 KiB, where it is also the layout check,
else in a thread), strict: nothing Yjs cannot decode is stored, and what
carries nothing but makes Yjs throw (structs of length 0, empty delete
ranges) is left out of what is stored (:func:`read_update`); the
validator's verdict (pycrdt, and y-py with ``validate_with_ypy``, in worker
processes). In flight it holds a slot and its bytes (:mod:`.inflight`: past
a cap the connection stops reading its socket). Updates are validated
concurrently but submitted to the appender in arrival order, and each is
answered once: ``appended`` when the append script returned (and, with
``ack_replicas``, the replicas confirmed it), else an error
(``missing_dependency``, ``invalid_update``, ``unavailable``,
``replication_timeout``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from yrelay.app.core.allowance import Allowance
from yrelay.app.core.peer import Peer
from yrelay.app.core.services import WriteServices
from yrelay.app.core.update_parts import Reject, UpdateParts
from yrelay.app.inflight import InflightUpdates
from yrelay.protocol import ErrorCode, ProtocolError, Update
from yrelay.storage.append import AppendResult, NotAdmitted
from yrelay.storage.replicas import ReplicationTimeout
from yrelay.storage.tombstones import is_deleted_error
from yrelay.yjs import crdt
from yrelay.yjs.admission import Reading, read_for_storing
from yrelay.yjs.update_format import MalformedUpdate
from yrelay.yjs.validator import ValidatorUnavailable

log = logging.getLogger(__name__)

#: Updates up to this size are read causally on the event loop (a few us,
#: and the read doubles as the layout check); larger ones in a thread, so a
#: 16 MiB paste does not stall other sockets.
READ_IN_LOOP_BYTES = 64 * 1024

Spawn = Callable[[Coroutine[Any, Any, None]], None]


class WritePath:
    """One connection's updates: ``peer`` is told each one's answer
    (:meth:`.peer.Peer.appended` or :meth:`.peer.Peer.refused`), ``reject``
    refuses an update in parts, ``spawn`` runs a task the connection
    cancels when it closes."""

    __slots__ = ("_services", "_allowance", "_peer", "_spawn", "_inflight", "_turn", "_parts", "session")

    def __init__(self, services: WriteServices, allowance: Allowance, peer: Peer, reject: Reject, spawn: Spawn):
        self._services = services
        self._allowance = allowance
        self._peer = peer
        self._spawn = spawn
        self._inflight = InflightUpdates(
            services.settings.max_inflight_appends,
            services.settings.max_inflight_bytes_per_connection,
            services.inflight_bytes,
        )
        #: Resolved once the last update received was submitted or rejected:
        #: updates are validated concurrently but appended in arrival order.
        self._turn: asyncio.Future[None] | None = None
        #: An update larger than a frame, arriving in parts.
        self._parts = UpdateParts(services.settings.max_update_bytes, reject, owner=allowance.subject_id)
        #: Whose updates these are (set once ``hello`` opened the session).
        self.session: str | None = None

    def refused(self, error: ProtocolError) -> None:
        """An error was sent: the rest of a refused update's parts is ignored."""
        self._parts.refused(error)

    def close(self) -> None:
        self._parts.close()

    async def receive(self, frame: Update, update: bytes, received: float) -> None:
        """Check ``frame``'s ``update`` (raising :class:`ProtocolError`) and
        start its append; ``received``: when its frame arrived (append latency)."""
        if self._parts.ignored(frame):  # the rest of a refused update's parts
            return
        await self._allowance.take_update(frame)  # not stored; the client resends after retry_after_ms
        limit = self._services.settings.max_update_bytes
        if len(update) > limit:
            raise ProtocolError.about(frame, ErrorCode.UPDATE_TOO_LARGE, f"update exceeds {limit} bytes")
        whole = await self._parts.feed(frame, update)  # None until the last part of an update in parts
        if whole is not None:
            await self.submit(frame, whole, received)

    async def submit(self, frame: Update, update: bytes, received: float) -> None:
        """Check the whole ``update`` (raising :class:`ProtocolError`) and
        start its append; the answer goes to the peer."""
        # A small update is read struct by struct here (a few us): that read is
        # also the layout check, so the validator skips its own in-loop one,
        # and checks the bytes to be stored.
        reading = read_update(update) if len(update) <= READ_IN_LOOP_BYTES else None
        try:
            if isinstance(reading, Exception):
                raise reading
            verdict = self._services.validator.submit(
                reading.update if reading is not None else update,
                layout_checked=reading is not None,
                layout=reading.layout if reading is not None else None,
            )
        except crdt.InvalidUpdate as exc:
            raise ProtocolError.about(frame, ErrorCode.INVALID_UPDATE, str(exc)) from None
        await self._inflight.acquire(len(update))
        previous, self._turn = self._turn, asyncio.get_running_loop().create_future()
        self._spawn(self._append_when_valid(frame, update, verdict, reading, previous, self._turn, received))

    async def _append_when_valid(
        self,
        frame: Update,
        update: bytes,
        verdict: asyncio.Future[Exception | None],
        reading: Reading | Exception | None,
        previous: asyncio.Future[None] | None,
        turn: asyncio.Future[None],
        received: float,
    ) -> None:
        """Wait for the validator and, for a large update, its causal reading
        in a thread (while the next frames are read), then for the update
        received before this one, then append. (A large update is validated
        as it came: its stored form differs at most by what carries nothing,
        structs of length 0 and empty delete ranges.)"""
        assert self.session is not None
        try:
            if reading is None:
                reading = await asyncio.to_thread(read_update, update)
            error = await verdict
            if error is None and isinstance(reading, Exception):
                error = reading
            if previous is not None:
                await previous
            if error is None:
                assert not isinstance(reading, Exception)
                future = self._services.appender.submit(
                    frame.doc,
                    self.session,
                    frame.clock,
                    reading.update,
                    reading.needs,
                    sync_layout=reading.layout if frame.sync else None,
                )
        except BaseException:
            self._inflight.release(len(update))
            raise
        finally:
            if not turn.done():
                turn.set_result(None)
        if error is None:
            await self._confirm(frame, future, len(update), received)
            return
        self._inflight.release(len(update))
        if isinstance(error, ValidatorUnavailable):
            await self._refuse(frame, ErrorCode.UNAVAILABLE, "the update could not be checked; resend it")
        else:
            await self._refuse(frame, ErrorCode.INVALID_UPDATE, str(error))

    async def _confirm(self, frame: Update, future: asyncio.Future[AppendResult], size: int, received: float) -> None:
        """Ack an update once (and only once) the append script returned.
        (yrelay_tools/testing/broken_server.py replaces this method.)"""
        try:
            result = await future
        except asyncio.CancelledError:
            raise
        except NotAdmitted as refused:
            await self._refuse(
                frame,
                ErrorCode.MISSING_DEPENDENCY,
                "not stored: the document lacks content this update builds on; send earlier updates first",
                missing=refused.lacking,
            )
            self._services.events.emit(
                "refuse",
                frame.doc,
                self.session,
                clock=frame.clock,
                missing={str(c): k for c, k in refused.lacking.items()},
            )
            return
        except ReplicationTimeout:  # stored on the master; the resend waits for the replicas again
            await self._refuse(
                frame, ErrorCode.REPLICATION_TIMEOUT, "stored, but not confirmed by enough replicas in time; resend it"
            )
            return
        except Exception as exc:  # noqa: BLE001 - every update is answered: deleted, else unavailable (resend)
            if is_deleted_error(exc):
                await self._refuse(frame, ErrorCode.DOCUMENT_DELETED, "not stored: the document was deleted")
                return
            log.warning("append of %s clock %s failed: %s", frame.doc, frame.clock, exc)
            await self._refuse(frame, ErrorCode.UNAVAILABLE, "the update was not stored; resend it")
            return
        finally:
            self._inflight.release(size)
        entry_id, duplicate = result.entry_id, result.duplicate
        await _answer(self._peer.appended(frame.doc, frame.clock, entry_id, duplicate, result.dropped))
        if entry_id is None:
            return
        self._services.metrics.appended(time.perf_counter() - received)
        self._services.events.emit(
            "append", frame.doc, self.session, offset=entry_id, clock=frame.clock, bytes=size, duplicate=duplicate
        )

    async def _refuse(self, frame: Update, code: ErrorCode, message: str, **fields: Any) -> None:
        """Answer ``frame``'s update with an error naming its doc and clock."""
        await _answer(self._peer.refused(ProtocolError.about(frame, code, message, **fields)))


async def _answer(answer: Awaitable[None]) -> None:
    """Send an update's answer, if the socket is still there."""
    try:
        await answer
    except Exception:  # noqa: BLE001 - the socket is gone (however it says so); the client resends unacked updates
        pass


def read_update(update: bytes) -> Reading | Exception:
    """:func:`read_for_storing`, or why the update can never apply (an ``InvalidUpdate``)."""
    try:
        return read_for_storing(update)
    except MalformedUpdate as exc:
        return crdt.InvalidUpdate(f"not a Yjs update: {exc}")
